"""attnjit.serving: attention over a paged KV cache, for decode, chunked prefill and speculative
decoding, with any pattern.

The cache layout is vLLM's and FlashInfer's: K and V caches of pages [num_pages, page_size, Hkv, D]
in any page order, a block table [B, max_pages] (int32 or int64) naming request b's pages in
order, and kv_lens [B], each request's number of cached tokens, the new ones already appended
(append_kv). Queries are packed [total_q, Hq, D] with cu_seqlens_q [B + 1] (default: one query per
request, decode). Request b's queries are its last n_b = cu_seqlens_q[b + 1] - cu_seqlens_q[b]
tokens: query i sits at position kv_lens[b] - n_b + i, the keys at 0 .. kv_lens[b] - 1, and the
pattern (causal, windows, LongNet segments and dilations, block layouts) is evaluated at those
absolute positions, exactly as attnjit.attention with q_offset = kv_lens[b] - n_b on the gathered
sequence.

How it runs: fp32, fp16 and bf16 calls run attnjit's paged forward (the C++ PagedAttention): each
step plans its requests on the host (one lowering per distinct (queries, length)), and the paged
kernel reads, through the block table, only the tokens the pattern attends, with split-KV over
long caches (CUDA tensors; the emulator under ATTNJIT_CPU_DEVICE=emu; the plan executor on other
CPU tensors). float64 queries run the float64 reference on each request's gathered tokens. Caches
may be FP8 (torch.float8_e4m3fn, with per-kv-head scales). paged_attention is not captured in a CUDA
graph (its plan changes every step); a captured decode loop uses GraphWorkspace: plan() each step,
eagerly, then replay a graph that captured run().

Planning on the device: with kv_lens (and cu_seqlens_q) as tensors on the GPU, a step is planned
by a kernel from the lengths it finds there (plan_on_device; the default for CUDA lengths): nothing
is read back, no work per step on the host, and a GraphWorkspace's captured run() replays alone
while the lengths in those tensors change. Lengths the kernel finds wrong make their request's rows
NaN (and are counted in `errors`); on the host they are refused by name.
"""
from collections.abc import Mapping
from typing import Optional

import torch

from ._attention import attention
from ._inputs import INT32, cpu_device, int_arg
from ._pattern import op_spec

__all__ = ["GraphWorkspace", "append_kv", "paged_attention", "paged_capacity"]

FP8 = getattr(torch, "float8_e4m3fn", None)  # FP8 caches (torch 2.1 and later)
INT32_COUNT = (0, 2**31 - 1)


def _batch(kv_lens):
    """B, the number of requests: how many lengths `kv_lens` holds (a list, an array or a 1-D tensor)."""
    if isinstance(kv_lens, torch.Tensor):
        if kv_lens.dim() != 1:
            raise ValueError(f"kv_lens: expected a 1-D tensor [B] (one length per request), got shape "
                             f"{tuple(kv_lens.shape)}")
        return kv_lens.shape[0]
    if isinstance(kv_lens, (str, bytes)):
        raise TypeError(f"kv_lens: expected [B] integers (one length per request), got {type(kv_lens).__name__}")
    try:
        return len(kv_lens)
    except TypeError:
        raise TypeError(f"kv_lens: expected [B] integers (a list or a 1-D int tensor, one length per request), got "
                        f"{type(kv_lens).__name__} {kv_lens!r}") from None


def _lengths(name, x, batch, device=None):
    """`x` (a tensor, array or list of integers) as a list of Python ints of length `batch`."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype == torch.bool or x.dtype.is_complex:
            raise TypeError(f"{name}: expected an integer tensor, got {x.dtype}")
        if x.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(x.shape)}")
        values = x.tolist()
    else:
        values = [int_arg(f"{name}[{i}]", v, INT32) for i, v in enumerate(x)]
    if len(values) != batch:
        raise ValueError(f"{name}: expected {batch} entries, got {len(values)}")
    return values


def _starts(name, cu_seqlens, batch, total, what, unit="rows"):
    """Each request's first row in a packed tensor of `total` rows: `cu_seqlens` checked (B + 1
    non-decreasing entries from 0 to total), or one row per request when it is None."""
    if cu_seqlens is None:
        if total != batch:
            raise ValueError(f"{what} has {total} {unit} for {batch} requests: pass {name} for several per request")
        return list(range(batch + 1))
    starts = _lengths(name, cu_seqlens, batch + 1)
    if starts[0] != 0 or starts[-1] != total or any(a > b for a, b in zip(starts, starts[1:])):
        raise ValueError(f"{name}: expected 0 = c_0 <= c_1 <= ... <= c_B = {total} ({what}'s rows), got {starts}")
    return starts


def _check_cache(k_cache, v_cache):
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(c, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor [num_pages, page_size, Hkv, D], got {type(c).__name__}")
        if c.dim() != 4:
            raise ValueError(f"{name}: expected [num_pages, page_size, Hkv, D], got shape {tuple(c.shape)}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)}: the pages, page size and "
                         "kv heads must agree")
    if k_cache.dtype != v_cache.dtype or k_cache.device != v_cache.device:
        raise ValueError(f"k_cache ({k_cache.dtype}, {k_cache.device}) and v_cache ({v_cache.dtype}, {v_cache.device}): "
                         "one dtype and one device")
    page_size = k_cache.shape[1]
    if not 1 <= page_size <= 256:
        raise ValueError(f"k_cache: page size {page_size} is out of range; pages hold 1 to 256 tokens")


def _checked_table(block_table, batch):
    """The block table as given (a tensor), its dtype and shape checked."""
    if not isinstance(block_table, torch.Tensor):
        block_table = torch.as_tensor(block_table)
    if block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_table: expected int32 or int64, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table: expected [B = {batch}, max_pages], got shape {tuple(block_table.shape)}")
    return block_table


def _table(block_table, batch, num_pages):
    return _checked_table(block_table, batch).to("cpu", torch.int64)


def _pages_of(table, b, length, page_size, num_pages, what=None, checked=True):
    """Request b's first pages holding `length` tokens (`what` says where the length comes from),
    checked (unless not `checked`: a table on the GPU): ValueError naming the entry."""
    need = -(-length // page_size)
    if need > table.shape[1]:
        raise ValueError(f"{what or f'kv_lens[{b}]'} = {length} needs {need} pages of {page_size} tokens; block_table has "
                         f"{table.shape[1]} per request (make it wider, or the length shorter)")
    pages = table[b, :need]
    if not checked:
        return pages
    bad = ((pages < 0) | (pages >= num_pages)).nonzero()
    if bad.numel():
        j = int(bad[0, 0])
        raise ValueError(f"block_table[{b}, {j}] = {int(pages[j])} is not a page of the cache (0 .. {num_pages - 1})")
    return pages


def _check_pages(table, lens, page_size, num_pages, entries=True):
    """Every page the requests use (lens[b] tokens each) is in the table's width and (with
    `entries`: a table on the host) names a page of the cache, all at once: ValueError naming the
    first entry that does not."""
    need = [-(-n // page_size) for n in lens]
    for b, (n, k) in enumerate(zip(lens, need)):
        if k > table.shape[1]:
            raise ValueError(f"kv_lens[{b}] = {n} needs {k} pages of {page_size} tokens; block_table has "
                             f"{table.shape[1]} per request (make it wider, or the length shorter)")
    if not entries:
        return
    used = torch.arange(table.shape[1])[None, :] < torch.tensor(need, dtype=torch.int64)[:, None]
    bad = (used & ((table < 0) | (table >= num_pages))).nonzero()
    if bad.numel():
        b, j = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(f"block_table[{b}, {j}] = {int(table[b, j])} is not a page of the cache (0 .. {num_pages - 1})")


def _gather(cache, pages, length):
    """The contiguous [1, length, Hkv, D] sequence of `pages`' first `length` tokens."""
    rows = cache.index_select(0, pages.to(cache.device))
    return rows.reshape(1, -1, cache.shape[2], cache.shape[3])[:, :length]


def paged_attention(q, k_cache, v_cache, block_table, kv_lens, pattern, *, cu_seqlens_q=None, scale=None,
                    return_lse=False, k_scale=None, v_scale=None, errors=None, plan_on_device=None):
    """Attention of `pattern` for packed queries q [total_q, Hq, D] over a paged KV cache.

    `k_cache`/`v_cache` [num_pages, page_size, Hkv, D] (V may have its own head dim), `block_table`
    int [B, max_pages], `kv_lens` [B] (cached tokens per request, the queries' own tokens
    included), `cu_seqlens_q` [B + 1] (0, ..., total_q; default one query per request). Returns o
    [total_q, Hq, Dv] in q's dtype, and with return_lse=True also lse [total_q, Hq] (fp32; float64
    for float64 queries, which run the float64 reference; -inf for a query that attends nothing). A request with no queries is skipped; its length may be 0.
    Errors name the argument: a page index outside the cache, a length past the block table, a
    negative length, more queries than cached tokens, shapes that disagree. Each step is planned on
    the host from the lengths: give `kv_lens` (and `cu_seqlens_q`) as lists or CPU tensors, since
    reading a CUDA tensor's values synchronises. A block table on the GPU is not read back (no
    synchronisation): there a page index outside the cache is not an error but reads as NaN, so
    the rows that attend it come out NaN; or, given `errors` (an int32 tensor of one element on the
    GPU), each read of such a page is counted there and its keys are skipped as if masked.

    FP8 caches: `k_cache`/`v_cache` of torch.float8_e4m3fn (half of bf16's bytes, so half the reads
    of a decode step) with q in bf16, fp16 or fp32; K is read as stored value x `k_scale` (a float,
    or fp32 [Hkv] per kv head, positive and finite; default 1), V likewise (append_kv with the same
    scales writes them).

    `plan_on_device`: plan the step on the device from the values `kv_lens` and `cu_seqlens_q`
    hold when the kernels run (int tensors on q's device, or moved there), with no host check of
    the lengths: a request whose length is below its queries, negative, or past its block table
    gets NaN rows (counted in `errors`). Default: True when `kv_lens` is a CUDA tensor. Not for
    float64 queries (the reference plans on the host).
    """
    c = _call(q, k_cache, v_cache, block_table, kv_lens, cu_seqlens_q, k_scale, v_scale, errors, plan_on_device)
    if c.on_device:  # one operator: traced by torch.compile, captured in a CUDA graph
        table = c.table if c.table.dtype == torch.int32 else c.table.clamp(-1, 2**31 - 1).to(torch.int32)
        o, lse = torch.ops.attnjit.paged_attention(q, k_cache, v_cache, table.to(q.device), c.device_lens, c.device_cu,
                                                   c.k_scale, c.v_scale, c.errors, op_spec(pattern, scale))
        return (o, lse) if return_lse else o
    o = q.new_zeros((q.shape[0], q.shape[1], v_cache.shape[3]))
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32  # as attnjit.attention's
    lse = torch.full((q.shape[0], q.shape[1]), float("-inf"), dtype=lse_dtype, device=q.device)
    if q.dtype != torch.float64:
        _paged_kernels("forward", c, op_spec(pattern, scale), o, lse)
        return (o, lse) if return_lse else o
    for b, n, length in c.requests:
        pages = c.table[b, :-(-length // k_cache.shape[1])]
        k = _gather(k_cache, pages, length)
        v = _gather(v_cache, pages, length)
        if k_cache.dtype == FP8:  # the reference reads what the kernels read: stored value x scale
            k = k.to(torch.float64) * c.k_scale.to(k.device, torch.float64)[:, None]
            v = v.to(torch.float64) * c.v_scale.to(v.device, torch.float64)[:, None]
        qb = q[c.starts[b]:c.starts[b + 1]].unsqueeze(0)
        ob, lb = attention(qb, k, v, pattern, scale=scale, q_offset=length - n, return_lse=True)
        o[c.starts[b]:c.starts[b + 1]] = ob[0]
        lse[c.starts[b]:c.starts[b + 1]] = lb[0].transpose(0, 1)
    return (o, lse) if return_lse else o


class _Call:
    """A call's arguments, checked (paged_attention's errors): the lengths, query starts, block
    table (on the host, or as given on the GPU), scales and each request with queries."""


def _device_lengths(name, x, count, device):
    """Lengths for the device planner: int32, contiguous, on `device`, `count` entries (no values read)."""
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor([int_arg(f"{name}[{i}]", v, INT32) for i, v in enumerate(x)], dtype=torch.int32)
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.dtype.is_complex:
        raise TypeError(f"{name}: expected an integer tensor, got {x.dtype}")
    if x.dim() != 1 or x.shape[0] != count:
        raise ValueError(f"{name}: expected {count} entries, got shape {tuple(x.shape)}")
    if x.dtype != torch.int32:  # out-of-range values stay out of range, never wrap onto valid ones
        x = x.clamp(-1, 2**31 - 1)
    return x.to(device, torch.int32).contiguous()


def _call(q, k_cache, v_cache, block_table, kv_lens, cu_seqlens_q, k_scale, v_scale, errors=None, plan_on_device=None):
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q: expected a torch tensor [total_q, Hq, D], got {getattr(q, 'shape', type(q).__name__)}")
    _check_cache(k_cache, v_cache)
    num_pages, page_size, hkv, d = k_cache.shape
    if q.shape[2] != d:
        raise ValueError(f"q's head dim {q.shape[2]} differs from k_cache's {d}")
    if q.shape[1] % hkv:
        raise ValueError(f"q has {q.shape[1]} heads, not a multiple of the cache's {hkv} kv heads")
    if q.device != k_cache.device:
        raise ValueError(f"q is on {q.device}, the cache on {k_cache.device}: one device")
    c = _Call()
    batch = _batch(kv_lens)  # B: one length per request
    c.q, c.k_cache, c.v_cache = q, k_cache, v_cache
    if plan_on_device is None:
        plan_on_device = isinstance(kv_lens, torch.Tensor) and kv_lens.device.type == "cuda" and q.dtype != torch.float64
    c.on_device = bool(plan_on_device)
    if c.on_device:
        if q.dtype == torch.float64:
            raise ValueError("plan_on_device: float64 queries run the reference, planned on the host; use fp32, fp16 or bf16")
        c.device_lens = _device_lengths("kv_lens", kv_lens, batch, q.device)
        c.device_cu = None if cu_seqlens_q is None else _device_lengths("cu_seqlens_q", cu_seqlens_q, batch + 1, q.device)
        if cu_seqlens_q is None and q.shape[0] != batch:
            raise ValueError(f"q has {q.shape[0]} queries for {batch} requests: pass cu_seqlens_q for several per request")
        c.table = _checked_table(block_table, batch)
        c.lens, c.starts, c.requests = [], [], None
        c.k_scale = _scales("k_scale", k_scale, k_cache, hkv)
        c.v_scale = _scales("v_scale", v_scale, v_cache, hkv)
        c.errors = _errors(errors, q)
        return c
    c.lens = _lengths("kv_lens", kv_lens, batch)
    c.starts = _starts("cu_seqlens_q", cu_seqlens_q, batch, q.shape[0], "q", "queries")
    # A table on the GPU is not copied back to be checked (that would synchronise every step): the
    # kernel never reads a page outside the cache, and the rows attending one come out NaN.
    given = _checked_table(block_table, batch)
    on_gpu = given.device.type == "cuda" and q.dtype != torch.float64
    c.table = given if on_gpu else given.to("cpu", torch.int64)
    c.requests = []  # (b, queries, length) of the requests with queries
    for b in range(batch):
        length, n = c.lens[b], c.starts[b + 1] - c.starts[b]
        if length < 0:
            raise ValueError(f"kv_lens[{b}] = {length} is negative")
        if n > length:
            raise ValueError(f"request {b} has {n} queries but kv_lens[{b}] = {length}: append the queries' own K/V "
                             "first (append_kv), so that each query's position kv_len - n + i is a cached token")
        if n:
            c.requests.append((b, n, length))
    _check_pages(c.table, c.lens, page_size, num_pages, entries=not on_gpu)  # on the GPU: the widths only
    c.k_scale = _scales("k_scale", k_scale, k_cache, hkv)
    c.v_scale = _scales("v_scale", v_scale, v_cache, hkv)
    c.errors = _errors(errors, q)
    return c


def _errors(errors, q):
    if errors is not None and (not isinstance(errors, torch.Tensor) or errors.dtype != torch.int32 or errors.numel() < 1
                               or errors.device != q.device):
        raise ValueError(f"errors: expected an int32 tensor of one element on {q.device}")
    return errors


def _scales(name, s, cache, hkv):
    """A cache's per-kv-head scales as fp32 [Hkv] on its device, for FP8 caches (None elsewhere)."""
    if cache.dtype != FP8:
        if s is not None:
            raise ValueError(f"{name}: applies to float8_e4m3fn caches; this cache is {cache.dtype}")
        return None
    if s is None:
        s = 1.0
    junk = TypeError(f"{name}: expected a positive float or [Hkv = {hkv}] fp32 scales, got {type(s).__name__} {s!r}")
    if isinstance(s, (bool, str, bytes)) or (isinstance(s, torch.Tensor) and (s.dtype == torch.bool or s.is_complex())):
        raise junk
    try:
        t = torch.as_tensor(s, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise junk from None
    one = t.dim() == 0  # one scale for every kv head
    if one:
        t = t.expand(hkv)
    if t.shape != (hkv,):
        raise ValueError(f"{name}: expected a float or [Hkv = {hkv}] scales, got shape {tuple(t.shape)}")
    if t.device.type != "cuda":  # scales on the GPU are not read back (a captured graph reads them as they are)
        bad = (~(torch.isfinite(t) & (t > 0))).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise ValueError(f"{name}: must be positive and finite (a code stands for code x scale), got {float(t[i])}"
                             + ("" if one else f" at index {i}"))
    return t.to(cache.device).contiguous()


def _paged_kernels(action, c, spec, o, lse, workspace=0, capacity=()):
    """The C++ runtime's paged forward (`action`: forward, needs, workspace_bytes, plan, run) on a
    checked call and the pattern's op spec (op_spec); o and lse are written by forward and run."""
    from . import _attnjit
    from ._torch_ops import _DTYPES

    q, k_cache, v_cache = c.q.detach(), c.k_cache.detach(), c.v_cache.detach()
    if q.dtype not in _DTYPES or k_cache.dtype not in (q.dtype, FP8):
        raise TypeError(f"q ({q.dtype}) and the cache ({k_cache.dtype}): the cache in q's dtype (fp32, fp16, bf16) or "
                        "float8_e4m3fn (or float64 q)")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {tuple(x.stride())}")
    if q.device.type == "cuda":
        device, index, stream = "cuda", q.device.index or 0, torch.cuda.current_stream(q.device).cuda_stream
    else:
        device, index, stream = cpu_device(), 0, 0
    # The table as the kernel reads it: int32, contiguous, on the cache's device (an int64 entry past
    # int32 is clamped to one the kernel refuses to read, never wrapped onto a real page).
    table32 = c.table if c.table.dtype == torch.int32 else c.table.clamp(-1, 2**31 - 1).to(torch.int32)
    table32 = table32.contiguous().to(q.device)
    desc = lambda x: (x.data_ptr(), list(x.shape), list(x.stride())) if x is not None else None  # noqa: E731
    ptr = lambda s: s.data_ptr() if s is not None else 0  # noqa: E731
    kv_dtype = "fp8_e4m3" if k_cache.dtype == FP8 else _DTYPES[q.dtype]
    lengths = [c.device_lens.data_ptr(), ptr(c.device_cu), c.device_lens.shape[0]] if c.on_device else []
    return _attnjit.paged(action, spec, device, index, _DTYPES[q.dtype], desc(q), desc(k_cache), desc(v_cache),
                          table32.data_ptr(), table32.shape[1], list(c.lens), list(c.starts), desc(o), desc(lse), 0, stream,
                          kv_dtype, ptr(c.k_scale), ptr(c.v_scale), workspace, list(capacity), ptr(c.errors), lengths)


CAPACITY_FIELDS = ("requests", "items", "spans", "entries", "splits")
# What the runtime takes (PagedCapacity): counts the kernels index in 32 bits, and 1 to 64 blocks sharing an item.
CAPACITY_LIMITS = {"requests": INT32_COUNT, "items": INT32_COUNT, "spans": INT32_COUNT, "entries": INT32_COUNT,
                   "splits": (1, 64)}


# A call planned on the device as one operator (paged_attention with plan_on_device): its own
# workspace from torch's allocator, sized by needs() (which reads no length), and run(): the
# planner and the kernels on the current stream, nothing on the host that depends on the step, so
# torch.compile traces it and a CUDA graph captures it. `errors` is added to by the kernels.
@torch.library.custom_op("attnjit::paged_attention", mutates_args=("errors",))
def _paged_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        kv_lens: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], k_scale: Optional[torch.Tensor],
                        v_scale: Optional[torch.Tensor], errors: Optional[torch.Tensor],
                        spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    c = _Call()
    c.q, c.k_cache, c.v_cache, c.table = q, k_cache, v_cache, block_table
    c.on_device, c.device_lens, c.device_cu = True, kv_lens, cu_seqlens_q
    c.lens, c.starts, c.k_scale, c.v_scale, c.errors = [], [], k_scale, v_scale, errors
    o = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]))
    lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    if q.shape[0] == 0:
        return o, lse
    *capacity, nbytes = _paged_kernels("needs", c, spec, o, lse)  # the capacity's five fields, then its bytes
    workspace = torch.empty(nbytes + 256, dtype=torch.uint8, device=q.device)
    _paged_kernels("run", c, spec, o, lse, (workspace.data_ptr() + 255) // 256 * 256, capacity)
    return o, lse


@_paged_attention_op.register_fake
def _(q, k_cache, v_cache, block_table, kv_lens, cu_seqlens_q, k_scale, v_scale, errors, spec):
    return (q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3])),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


def paged_capacity(q, k_cache, v_cache, block_table, kv_lens, pattern, *, cu_seqlens_q=None, scale=None, k_scale=None,
                   v_scale=None, plan_on_device=None):
    """What one call's plan takes in a GraphWorkspace: {"requests", "items", "spans", "entries",
    "splits"}. Size a workspace from the largest batch and lengths served (with a margin). Planned
    on the device (plan_on_device, as paged_attention's): the most any lengths can need for this
    batch, query count and splits, read from no length."""
    c = _call(q, k_cache, v_cache, block_table, kv_lens, cu_seqlens_q, k_scale, v_scale, None, plan_on_device)
    o = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]))
    need = _paged_kernels("needs", c, op_spec(pattern, scale), o, None)  # the fields, then the workspace's bytes
    return dict(zip(CAPACITY_FIELDS, need[:len(CAPACITY_FIELDS)]))


class GraphWorkspace:
    """A decode loop in a CUDA graph (vLLM's and FlashInfer's plan/run split): a step's plan changes
    with its lengths, so it lives in this workspace at a fixed address; `run()` is captured once and
    `plan()` is called before each replay, eagerly, with the step's lengths.

        ws = serving.GraphWorkspace(q, k_cache, v_cache, pattern, capacity)
        ws.plan(q, k_cache, v_cache, block_table, kv_lens)            # step 0, eager
        with torch.cuda.graph(g):
            ws.run(q, k_cache, v_cache, block_table, kv_lens, out)   # captured: the launches only
        for each step: ws.plan(q, k_cache, v_cache, block_table, new_lens); g.replay()

    `capacity`: a dict as paged_capacity returns (requests, items, spans, entries, splits), for the
    largest step, integers 0 to 2^31 - 1 (splits 1 to 64); a step above it is refused by plan(),
    naming the count. run()'s tensors (q, caches, table, out, lse, scales) must be the same every
    step (a graph reads fixed addresses: pass FP8 scales as tensors on the GPU); its lengths are
    read from the workspace, not from the call.
    CPU tensors run in the emulator under ATTNJIT_CPU_DEVICE=emu (run() then launches over the
    workspace as a graph would); on the CPU device run() is paged_attention's forward.

    Lengths on the device (kv_lens and cu_seqlens_q CUDA tensors, or plan_on_device=True; size
    the workspace with paged_capacity(..., plan_on_device=True)): there is no plan(); run() plans
    on the device from what those tensors hold at each replay, so the loop is a replay per step,
    after writing the step's lengths into the same tensors."""

    def __init__(self, q, k_cache, v_cache, pattern, capacity, *, scale=None):
        if not isinstance(capacity, Mapping):
            raise TypeError(f"capacity: expected a dict as paged_capacity returns ({', '.join(CAPACITY_FIELDS)}), got "
                            f"{type(capacity).__name__}")
        missing = [f for f in CAPACITY_FIELDS if f not in capacity]
        if missing:
            raise ValueError(f"capacity: missing {', '.join(missing)} (paged_capacity gives every field)")
        self.pattern, self.scale = pattern, scale
        self.capacity = [int_arg(f'capacity["{f}"]', capacity[f], CAPACITY_LIMITS[f]) for f in CAPACITY_FIELDS]
        table = torch.zeros((0, 1), dtype=torch.int32, device=q.device)
        c = _call(q[:0], k_cache, v_cache, table, [], [0], None, None)
        self._problem = _problem_of(q, k_cache, v_cache)
        self._planned = self._ran = None  # (queries, requests, pages): what the last plan() reads, run()'s tensors hold
        c.k_scale = c.v_scale = None
        o = q.new_empty((0, q.shape[1], v_cache.shape[3]))
        nbytes = _paged_kernels("workspace_bytes", c, op_spec(pattern, scale), o, None, 0, self.capacity)[0]
        self._buffer = torch.zeros(nbytes + 256, dtype=torch.uint8, device=q.device)  # 256-byte aligned inside
        self._ptr = (self._buffer.data_ptr() + 255) // 256 * 256

    def plan(self, q, k_cache, v_cache, block_table, kv_lens, *, cu_seqlens_q=None, k_scale=None, v_scale=None,
             plan_on_device=None):
        """The step's plan into the workspace, in the current stream's order (eager; never captured).
        Refused for lengths on the device (plan_on_device), which run() plans itself."""
        c = _call(q, k_cache, v_cache, block_table, kv_lens, cu_seqlens_q, k_scale, v_scale, None, plan_on_device)
        self._check_problem("plan", q, k_cache, v_cache)
        o = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]))
        planned = (q.shape[0], _batch(kv_lens), k_cache.shape[0])
        self._check_extents("plan", planned, self._ran)
        _paged_kernels("plan", c, op_spec(self.pattern, self.scale), o, None, self._ptr, self.capacity)
        self._planned = planned

    def run(self, q, k_cache, v_cache, block_table, kv_lens, out, *, cu_seqlens_q=None, lse=None, k_scale=None,
            v_scale=None, errors=None, plan_on_device=None):
        """The kernels over the workspace's plan into out [total_q, Hq, Dv] (q's dtype) and lse
        [total_q, Hq] (fp32) if given, on q's device, each with memory of its own per entry and
        shared with no input (ValueError otherwise); capturable. `errors`, `plan_on_device`: as
        paged_attention's (planned on the device, run() needs no plan() before it)."""
        c = _call(q, k_cache, v_cache, block_table, kv_lens, cu_seqlens_q, k_scale, v_scale, errors, plan_on_device)
        self._check_problem("run", q, k_cache, v_cache)
        _check_output("out", out, (q.shape[0], q.shape[1], v_cache.shape[3]), q.dtype, q.device)
        ran = (q.shape[0], c.table.shape[0], k_cache.shape[0])
        if not c.on_device:  # planned on the device, run() reads only what it planned from these tensors
            self._check_extents("run", self._planned, ran)
            self._ran = ran
        if lse is not None:
            _check_output("lse", lse, (q.shape[0], q.shape[1]), torch.float32, q.device)
        for name, x in (("out", out), ("lse", lse)):
            for other, y in (("out", out), ("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
                if x is not None and other != name and _share_memory(x, y):
                    raise ValueError(f"{name} and {other} share memory: the kernels write {name} while they read "
                                     f"{other}; give {name} a tensor of its own")
        _paged_kernels("run", c, op_spec(self.pattern, self.scale), out, lse, self._ptr, self.capacity)
        return out


    def _check_problem(self, what, q, k_cache, v_cache):
        """The problem the workspace was sized for (its kernels' tiles and head dims set its bytes):
        another one would plan past the buffer."""
        got = _problem_of(q, k_cache, v_cache)
        if got != self._problem:
            raise ValueError(f"{what}: this GraphWorkspace was made for {_describe_problem(self._problem)}, called with "
                             f"{_describe_problem(got)}; a workspace serves the problem it was made for (make one per "
                             "problem)")

    def _check_extents(self, what, planned, ran):
        """A plan reads `planned` queries, requests (block table rows) and cache pages of run()'s
        tensors (`ran`): more than they hold would be read and written past them."""
        if planned is None or ran is None:
            return
        for name, p, r in zip(("queries (q rows)", "requests (block_table rows)", "cache pages"), planned, ran):
            if p > r:
                raise ValueError(f"{what}: the plan reads {p} {name} but run()'s tensors hold {r}; run() must be given "
                                 "plan()'s tensors (a CUDA graph replays run() over the same ones every step)")


def _problem_of(q, k_cache, v_cache):
    return (q.shape[1], k_cache.shape[2], q.shape[2], v_cache.shape[3], q.dtype, k_cache.dtype, v_cache.dtype, q.device)


def _describe_problem(p):
    return (f"{p[0]} query heads, {p[1]} kv heads, head dims {p[2]}/{p[3]}, q {p[4]}, caches {p[5]}/{p[6]} on "
            f"{p[7]}")


def _check_output(name, x, shape, dtype, device):
    """An output tensor the kernels write: `shape`, `dtype`, on `device` (the extension passes its
    pointer, shape and strides, with the dtype taken as given). Entries that share memory (an
    expanded view) are refused by the runtime's check of every output, as "o" and "lse"."""
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or x.dtype != dtype or x.device != device:
        got = f"{x.dtype} {list(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected {dtype} {list(shape)} on {device}, got {got}")


def _share_memory(x, y):
    """Whether the bytes `x` spans and those `y` spans (first to last element) intersect."""
    if x.numel() == 0 or y.numel() == 0 or x.device != y.device:
        return False

    def span(t):
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a, b), (c, d) = span(x), span(y)
    return a < d and c < b


def append_kv(k_cache, v_cache, block_table, kv_lens, k_new, v_new, cu_seqlens_new=None, *, k_scale=None, v_scale=None):
    """Writes new K/V rows into their pages: request b's rows k_new[c_b:c_{b+1}] ([total_new, Hkv,
    D], likewise v_new) go to positions kv_lens[b], kv_lens[b] + 1, ... of its pages
    (cu_seqlens_new [B + 1]; default one row per request). Returns the new lengths, int32 [B] on
    the cache's device. The pages must already be in the block table: a row past the table's
    pages, a page listed twice in the pages a request uses, or rows of two requests going to one
    slot is a ValueError naming them, and nothing is written then. FP8 caches (float8_e4m3fn): each
    row is divided by its kv head's scale (`k_scale`, `v_scale`: a positive float or [Hkv]; default
    1) and rounded to the nearest e4m3 value, finite values saturating at +-448; NaN and +-inf are
    stored as NaN (e4m3fn has no infinity), never as a finite value."""
    _check_cache(k_cache, v_cache)
    num_pages, page_size, hkv, d = k_cache.shape
    for name, x, c in (("k_new", k_new, k_cache), ("v_new", v_new, v_cache)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[1:]) != tuple(c.shape[2:]):
            raise ValueError(f"{name}: expected [total_new, {c.shape[2]}, {c.shape[3]}], got "
                             f"{tuple(getattr(x, 'shape', ()))}")
    if k_new.shape[0] != v_new.shape[0]:
        raise ValueError(f"k_new has {k_new.shape[0]} rows, v_new {v_new.shape[0]}")
    batch = _batch(kv_lens)
    lens = _lengths("kv_lens", kv_lens, batch)
    starts = _starts("cu_seqlens_new", cu_seqlens_new, batch, k_new.shape[0], "k_new")
    table = _table(block_table, batch, num_pages)
    # Every request's slots first, so that a bad one writes nothing.
    slots = []
    for b in range(batch):
        if lens[b] < 0:
            raise ValueError(f"kv_lens[{b}] = {lens[b]} is negative")
        end = lens[b] + starts[b + 1] - starts[b]
        pages = _pages_of(table, b, end, page_size, num_pages, f"kv_lens[{b}] + {starts[b + 1] - starts[b]} new rows")
        if end > lens[b] and pages.unique().numel() != pages.numel():  # two of its positions would share a slot
            j = next(j for j in range(1, pages.numel()) if pages[j] in pages[:j])
            i = int((pages[:j] == pages[j]).nonzero()[0, 0])
            raise ValueError(f"block_table[{b}, {j}] = {int(pages[j])} repeats block_table[{b}, {i}]: a request's pages "
                             "must be distinct, or its rows overwrite each other")
        pos = torch.arange(lens[b], end)
        slots.append(pages[pos // page_size] * page_size + pos % page_size)
    flat = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
    if flat.unique().numel() != flat.numel():  # a page two requests write into at the same slot
        _refuse_shared_slot(flat.tolist(), lens, starts, page_size)
    flat = flat.to(k_cache.device)
    k_scale = _scales("k_scale", k_scale, k_cache, hkv)
    v_scale = _scales("v_scale", v_scale, v_cache, hkv)
    page, slot = flat // page_size, flat % page_size  # indexed through the cache's strides: any layout
    with torch.no_grad():
        for cache, new, s in ((k_cache, k_new, k_scale), (v_cache, v_new, v_scale)):
            if cache.dtype == FP8:  # stored as value / scale; float8 has no indexed-copy kernel: copied as bytes
                # Finite values saturate at +-448; e4m3fn has no infinity, so +-inf is stored as NaN (as
                # NaN is), never as a finite 448 (torch's conversion would saturate it).
                x = (new.to(torch.float32) / s.to(new.device)[:, None]).clamp(-448.0, 448.0)
                q8 = torch.where(torch.isinf(new), float("nan"), x).to(FP8)
                cache.view(torch.uint8)[page, slot] = q8.to(cache.device).view(torch.uint8)
            else:
                cache[page, slot] = new.to(cache.device, cache.dtype)
    new = [lens[b] + starts[b + 1] - starts[b] for b in range(batch)]
    return torch.tensor(new, dtype=torch.int32, device=k_cache.device)


def _refuse_shared_slot(slots, lens, starts, page_size):
    """ValueError naming the first two new rows (request, position) that `slots` (each new row's
    slot, request by request) send to one cache slot."""
    rows = [(b, lens[b] + i) for b in range(len(lens)) for i in range(starts[b + 1] - starts[b])]
    seen = {}
    for (b, p), slot in zip(rows, slots):
        if slot in seen:
            a, o = seen[slot]
            raise ValueError(f"request {a}'s new row at position {o} and request {b}'s at position {p} both go to "
                             f"page {slot // page_size}, slot {slot % page_size}: that page is in both requests' "
                             "block_table rows; each new row needs a slot of its own")
        seen[slot] = (b, p)
