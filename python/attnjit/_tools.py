"""attnjit.dump (the pipeline's stages as text, as `attnjit dump` prints them) and
attnjit.precompile (a deployment's kernels into a kernel cache, as `attnjit precompile`)."""
import os

from . import _attnjit
from ._pattern import as_pattern


def _arch(arch):
    """"sm_80", "sm_90a" or 80 -> the arch's name ("sm_80"); "sm_90a" selects the Hopper kernels."""
    if isinstance(arch, int) and not isinstance(arch, bool):
        return f"sm_{arch}"
    if not isinstance(arch, str) or not arch.startswith("sm_") or not arch[3:].rstrip("a").isdigit():
        raise ValueError(f'arch: expected "sm_XY" or "sm_90a" such as "sm_80", got {arch!r}')
    return arch


def precompile(manifest, archs, cache_dir=None, jobs=1, top_k=1) -> dict:
    """Compiles every kernel of a precompile manifest (docs/kernels-cache-knobs.md)
    for `archs` (["sm_80", "sm_90", "sm_90a"]) into `cache_dir` (default: ATTNJIT_CACHE_DIR or
    ~/.cache/attnjit) on `jobs` threads. Returns {"kernels", "compiled", "cached", "failed",
    "seconds", "cache_dir", "errors"}; raises AttnjitError if any kernel failed to compile, or
    for a malformed manifest (naming the entry)."""
    if isinstance(archs, str):
        archs = [a for a in archs.split(",") if a]
    report = _attnjit.precompile(os.fspath(manifest), [_arch(a) for a in archs], os.fspath(cache_dir or ""), int(jobs),
                                 int(top_k))
    if report["failed"]:
        raise _attnjit.AttnjitError(f"precompile: {report['failed']} of {report['kernels']} kernels failed: "
                                    + "; ".join(report["errors"]))
    return report


def dump(pattern, stage="pattern", *, seq=None, seq_k=None, heads=1, heads_kv=None, head_dim=128, head_dim_v=None,
         batch=1, q_offset=0, k_offset=0, tile=(64, 64), arch="sm_80", dtype="bf16", backward=False, full=False,
         paged=False, kv_lens=None, queries=None, pack_branches=False) -> str:
    """One stage of the pipeline for `pattern` (a Pattern, a dict or a path), as text:

    - "pattern": the canonical spec and its hash;
    - "plan" / "plan-bwd": the forward plan / the backward's key-major plan for a shape (`seq`
      required; `tile` the plan's query x key tile; the first 8 work items, or all with `full`;
      `pack_branches`: a pair several branches attend computed once, weighted, as the CPU device
      runs it: the tiles left out and the key weights shown);
    - "plan-paged": the plan of one call over a paged KV cache (attnjit.serving): requests with
      `kv_lens` cached tokens and `queries` queries each (default 1), `heads`/`heads_kv`;
    - "cuda" / "ptx" / "sass": the generated forward kernel (the backward kernels with
      `backward`, the paged forward's with `paged`: its device planner holds the classes of
      `heads`/`heads_kv`) for `head_dim`, `dtype` and `arch` ("sm_80", "sm_90", "sm_90a" for the
      Hopper kernels, ...); "ptx" compiles it with NVRTC, "sass" disassembles its CUBIN (through
      the kernel cache).

    The same stages, with the same text, as the CLI's `attnjit dump` (one registry serves both).
    """
    p = as_pattern(pattern)
    arch = _arch(arch)
    dims = [int(batch), int(seq or 0), int(seq_k if seq_k is not None else seq or 0), int(heads),
            int(heads_kv if heads_kv is not None else heads), int(head_dim),
            int(head_dim_v if head_dim_v is not None else head_dim)]
    tq, tk = tile
    return _attnjit.dump(p.op_spec, stage, dims, int(q_offset), int(k_offset), int(tq), int(tk), arch, dtype,
                         bool(backward), bool(full), bool(paged), [int(n) for n in kv_lens or []],
                         [int(n) for n in queries or []], bool(pack_branches))
