#!/usr/bin/env python3
"""`attnjit grad` on every example pattern, through the float64 reference, the plan executor
and the emulator (the generated backward kernels; fp32, and bf16 at its tolerance), against the
independent numpy gradient in contract_reference.py.

  python3 tests/contract/check_grad_cli.py --attnjit build/attnjit --examples examples

Prints `N passed, M failed`; exits 0 only if everything passed.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract_reference as ref  # noqa: E402

# path -> (extra arguments, relative Frobenius tolerance)
PATHS = {
    "reference": ([], 1e-6),
    "plan": (["--executor", "plan", "--tile", "16x8"], 1e-4),
    "emu-fp32": (["--device", "emu", "--dtype", "fp32"], 1e-5),
    "emu-bf16": (["--device", "emu", "--dtype", "bf16"], 3e-2),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnjit", required=True)
    ap.add_argument("--examples", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for spec_path in sorted(glob.glob(os.path.join(args.examples, "*.json"))):
            spec = json.load(open(spec_path))
            if "attnjit_manifest" in spec:
                continue
            B, S, Hq, Hkv, D = 1, 160, 4, 2, 32
            q, k, v, do = (rng.standard_normal(shape).astype(np.float32)
                           for shape in [(B, S, Hq, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, S, Hq, D)])
            for name, x in (("q", q), ("k", k), ("v", v), ("do", do)):
                np.save(os.path.join(tmp, name + ".npy"), x)
            for path, (extra, tol) in PATHS.items():
                if path == "emu-bf16":  # the kernels see bf16 inputs: so does the reference
                    rq, rk, rv, rdo = (x.view(np.uint32) + 0x7fff + ((x.view(np.uint32) >> 16) & 1) for x in (q, k, v, do))
                    rq, rk, rv, rdo = ((r & 0xffff0000).view(np.float32) for r in (rq, rk, rv, rdo))
                else:
                    rq, rk, rv, rdo = q, k, v, do
                want = ref.attention_grad(spec, rq, rk, rv, rdo)
                outs = [os.path.join(tmp, "%s_%s.npy" % (path, g)) for g in ("dq", "dk", "dv")]
                cmd = [args.attnjit, "grad", spec_path, "--q", os.path.join(tmp, "q.npy"), "--k", os.path.join(tmp, "k.npy"),
                       "--v", os.path.join(tmp, "v.npy"), "--do", os.path.join(tmp, "do.npy"),
                       "--dq", outs[0], "--dk", outs[1], "--dv", outs[2]] + extra
                r = subprocess.run(cmd, capture_output=True, text=True)
                label = "%s via %s" % (os.path.basename(spec_path), path)
                if r.returncode != 0:
                    print("FAIL %s: %s" % (label, r.stderr.strip()))
                    failed += 1
                    continue
                worst = 0.0
                for out, w in zip(outs, want):
                    got = np.load(out).astype(np.float64)
                    if np.isnan(got).any():
                        worst = float("inf")
                        break
                    den = np.linalg.norm(w)
                    worst = max(worst, np.linalg.norm(got - w) / (den if den > 0 else 1.0))
                if worst <= tol:
                    passed += 1
                else:
                    print("FAIL %s: relative Frobenius error %.3g > %.3g" % (label, worst, tol))
                    failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
