#!/usr/bin/env python3
"""The tuned-against-default table of a tuning database: per key, the default configuration's and
the tuned winner's median time and the speedup, plus how often the default was already the best.

    python3 bench/tuning_table.py autotune_db/NVIDIA_H100_80GB_HBM3.json [--out table.md]

Pattern names come from the specs in examples/ and bench/patterns/ whose hash matches the key's
signature (through the attnjit Python package when it imports; else the signature is shown).
"""
import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def shipped_patterns():
    """(name, attnjit.Pattern) of each spec in examples/ and bench/patterns/; none without the
    attnjit Python package."""
    try:
        import attnjit
    except ImportError:
        return []
    return [(path.stem, attnjit.Pattern.load(path))
            for path in sorted(ROOT.glob("examples/*.json")) + sorted(ROOT.glob("bench/patterns/*.json"))
            if "attnjit_manifest" not in path.read_text()]


def pattern_names():
    return {p.hash: name for name, p in shipped_patterns()}


def describe(c):
    return f"{c['tile_q']}x{c['tile_k']} s{c['stages']}" if c else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db")
    ap.add_argument("--out", help="write the markdown table here too")
    a = ap.parse_args()
    db = json.loads(pathlib.Path(a.db).read_text())
    names = pattern_names()
    meta = db.get("metadata", {})
    rows, speedups = [], []
    for e in sorted(db.get("entries", []), key=lambda e: (e["key"].get("pass", "forward"), names.get(e["key"]["pattern_signature"], "~"),
                                                          e["key"]["dtype"], e["key"]["head_dim"], e["key"]["seq_bucket"])):
        k, best, dflt = e["key"], e.get("best_ms"), e.get("default_ms")
        default_cfg = next((c["config"] for c in e.get("candidates", []) if c.get("median_ms") == dflt), None)
        speed = dflt / best if best and dflt else None
        if speed:
            speedups.append(speed)
        rows.append(f"| {names.get(k['pattern_signature'], k['pattern_signature'][:12])} | {k.get('pass', 'forward')} | {k['dtype']} | "
                    f"{k['head_dim']} | {k['seq_bucket']} | {describe(default_cfg)} | {dflt if dflt is None else f'{dflt:.3f}'} | "
                    f"{describe(e.get('best'))} | {best if best is None else f'{best:.3f}'} | {'-' if speed is None else f'{speed:.2f}x'} |")
    out = [f"# Tuned against default: {meta.get('gpu', '?')} (sm_{meta.get('arch', '?')}, {meta.get('sm_count', '?')} SMs), "
           f"attnjit {meta.get('attnjit_version', '?')}, NVRTC {meta.get('nvrtc_version', '?')}", "",
           "| pattern | pass | dtype | head dim | seq bucket | default | default ms | tuned | tuned ms | speedup |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"] + rows
    if speedups:
        won = sum(s > 1.02 for s in speedups)
        out += ["", f"{len(speedups)} keys; the tuned configuration beats the default by more than 2% on {won}; "
                    f"median speedup {statistics.median(speedups):.2f}x, geometric mean "
                    f"{statistics.geometric_mean(speedups):.2f}x, best {max(speedups):.2f}x."]
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if a.out:
        pathlib.Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
