"""The checks and conversions of attnjit.attention's arguments, shared by the numpy path
(_attention.py), the PyTorch operators (_torch_ops.py) and attnjit.distributed."""
import math
import operator
import os

import numpy as np

_TABLE_KEYS = {"row_offsets", "col_indices", "heads", "errors"}
INT32 = (-2**31, 2**31 - 1)
INT64 = (-2**63, 2**63 - 1)
OFFSET = (0, 2**63 - 1)


def int_arg(name, x, limits):
    """`x` as an int: TypeError naming `name` unless it is an integer (a Python or numpy int, or a
    one-element integer tensor; not a bool, not a float even with an integral value), ValueError
    naming the value and the limits unless limits[0] <= x <= limits[1]."""
    if type(x) is int:
        value = x
    else:
        if isinstance(x, (bool, np.bool_)) or str(getattr(x, "dtype", "")) in ("bool", "torch.bool"):
            raise TypeError(f"{name}: expected an integer, got {x!r}")
        try:
            value = operator.index(x)
        except TypeError:
            raise TypeError(f"{name}: expected an integer, got {type(x).__name__} {x!r}") from None
    lo, hi = limits
    if value < lo:
        raise ValueError(f"{name}: {value} is out of range; must be >= {lo}")
    if value > hi:
        raise ValueError(f"{name}: {value} is out of range; must be <= {hi}")
    return value


def scale_arg(name, x, hint=""):
    """`x` as a float: TypeError naming `name` unless it is a real number (a Python or numpy number,
    or a one-element tensor that does not require grad; not a bool, not a string), ValueError unless it is finite and > 0
    (`hint`, appended to that message, says what to do instead)."""
    if isinstance(x, (bool, np.bool_, str, bytes, complex)) or str(getattr(x, "dtype", "")) in ("bool", "torch.bool"):
        raise TypeError(f"{name}: expected a positive finite number, got {type(x).__name__} {x!r}")
    if getattr(x, "requires_grad", False):  # its value is read; a gradient would never reach it
        raise TypeError(f"{name}: is a tensor that requires grad, but the scale is a constant of the call (no gradient "
                        "flows to it); pass a number, or scale.detach() if no gradient is wanted")
    try:
        value = float(x)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name}: expected a positive finite number, got {type(x).__name__} {x!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a positive finite number, got {value}{hint}")
    return value


def int_list(name, x, limits):
    """The integers of a list, array or tensor `x` (flattened) as Python ints: TypeError naming
    `name` for values that are not integers (floats, even integral ones, and bools), ValueError
    naming the first value outside `limits`, its index and the limits."""
    if hasattr(x, "detach"):  # a torch tensor, on any device
        if x.is_floating_point() or x.is_complex() or str(x.dtype) == "torch.bool":
            raise TypeError(f"{name}: expected integers, got a {x.dtype} tensor")
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.size == 0:
        return []
    values = a.ravel().tolist()
    if a.dtype == object:
        for i, e in enumerate(values):
            if isinstance(e, bool) or not isinstance(e, int):
                raise TypeError(f"{name}: expected integers, got {type(e).__name__} {e!r} at index {i}")
    elif a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got {a.dtype} values")
    lo, hi = limits
    for i, e in enumerate(values):
        if e < lo or e > hi:
            raise ValueError(f"{name}: {e} at index {i} is out of range; must be {'>=' if e < lo else '<='} "
                             f"{lo if e < lo else hi}")
    return values


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

    return (int_arg('dynamic_layout["heads"]', d.get("heads", 1), INT64),
            int_list('dynamic_layout["row_offsets"]', d["row_offsets"], INT64),
            int_list('dynamic_layout["col_indices"]', d["col_indices"], INT32))


def documents_arg(cu):
    if cu is None:
        return None
    if hasattr(cu, "detach"):  # a torch tensor, on any device
        cu = cu.detach().cpu().numpy()
    a = np.asarray(cu)
    if a.ndim != 1 or (a.dtype.kind not in "iu" and not (a.dtype == object and a.size)):
        raise TypeError(f"cu_seqlens: expected a 1-D integer tensor [n_docs + 1], got {a.dtype} of shape {a.shape}")
    return int_list("cu_seqlens", a, INT64)


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
    if (k_shape[2] == 0 and q_shape[2] != 0) or (k_shape[2] != 0 and q_shape[2] % k_shape[2]):
        raise ValueError(f"q, k: query heads ({q_shape[2]}) must be a multiple of key/value heads ({k_shape[2]})")


def is_empty(q_shape, k_shape):
    """Whether q, k ([B, S, H, D], checked) make an empty problem: no batch, no query rows, no heads or
    no keys. Its output is empty or all zero (rows with no keys attend nothing), as are its gradients."""
    return q_shape[0] == 0 or q_shape[1] == 0 or q_shape[2] == 0 or k_shape[1] == 0
