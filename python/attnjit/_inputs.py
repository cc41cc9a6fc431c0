"""The checks and conversions of attnjit.attention's arguments, shared by the numpy path
(_attention.py), the PyTorch operators (_torch_ops.py) and attnjit.distributed."""
import os

import numpy as np

_TABLE_KEYS = {"row_offsets", "col_indices", "heads", "errors"}


def dynamic_arg(d):
    if d is None:
        return None
    if not isinstance(d, dict) or not {"row_offsets", "col_indices"} <= set(d):
        raise TypeError('dynamic_layout: expected a dict {"row_offsets": [...], "col_indices": [...], "heads": H}')
    if set(d) - _TABLE_KEYS:
        raise TypeError(f"dynamic_layout: unknown key(s) {sorted(set(d) - _TABLE_KEYS)}; expected {sorted(_TABLE_KEYS)}")
    return d


def device_table(d):
    """Whether the kernels read the table `d` in place: tensors on a GPU, or an "errors" counter given."""
    return d is not None and (d.get("errors") is not None or
                              any(getattr(d[n], "is_cuda", False) for n in ("row_offsets", "col_indices")))


def host_table(d):
    """A host table (heads, row_offsets, col_indices) as the extension takes it, or None."""
    if d is None:
        return None

    def ints(x):
        if hasattr(x, "detach"):  # a torch tensor
            x = x.detach().cpu().numpy()
        return [int(e) for e in np.asarray(x).ravel()]

    return int(d.get("heads", 1)), ints(d["row_offsets"]), ints(d["col_indices"])


def documents_arg(cu):
    if cu is None:
        return None
    if hasattr(cu, "detach"):  # a torch tensor, on any device
        cu = cu.detach().cpu().numpy()
    a = np.asarray(cu)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"cu_seqlens: expected a 1-D integer tensor [n_docs + 1], got {a.dtype} of shape {a.shape}")
    return [int(x) for x in a]


def cpu_device():
    """The device CPU tensors run on: the plan executor, or the emulator (ATTNJIT_CPU_DEVICE=emu, the
    sm_80 kernels; emu:sm_90a the Hopper ones, emu:sm_75 the SIMT path for fp16, ...)."""
    d = os.environ.get("ATTNJIT_CPU_DEVICE", "cpu")
    if d not in ("cpu", "emu") and not d.startswith("emu:sm_"):
        raise ValueError(f"ATTNJIT_CPU_DEVICE={d}: expected cpu, emu or emu:sm_XX (emu:sm_90a for the Hopper kernels)")
    return d


def check_shapes(q_shape, k_shape, v_shape):
    """ValueError naming the argument when q, k, v are not [B, S, H, D] tensors that fit together."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 4:
            raise ValueError(f"{name}: expected a [batch, seq, heads, head_dim] tensor, got shape {tuple(s)}")
    if q_shape[0] != k_shape[0] or k_shape[0] != v_shape[0]:
        raise ValueError(f"q, k, v: batch sizes differ ({q_shape[0]}, {k_shape[0]}, {v_shape[0]})")
    if tuple(k_shape[:3]) != tuple(v_shape[:3]):
        raise ValueError(f"k, v: [batch, seq, heads] differ ({tuple(k_shape[:3])} and {tuple(v_shape[:3])})")
    if q_shape[3] != k_shape[3]:
        raise ValueError(f"q, k: head dims differ ({q_shape[3]} and {k_shape[3]})")
    if k_shape[2] == 0 or q_shape[2] % k_shape[2]:
        raise ValueError(f"q, k: query heads ({q_shape[2]}) must be a multiple of key/value heads ({k_shape[2]})")
