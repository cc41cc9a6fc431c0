"""attnjit.serving: attention over a paged KV cache against the float64 contract on the gathered
sequence. The oracle never touches pages: each request's K/V is made contiguous first, the test
scatters it into shuffled pages itself, and the answer is the dense contract at the queries'
absolute positions (kv_len - n + i)."""
import random

import pytest
import torch

import attnjit
from attnjit import serving
from conftest import dense_attention, example_specs, rel_error


class Cache:
    """Requests' contiguous K/V and the same rows scattered into shuffled pages."""

    def __init__(self, lens, page_size, hkv, d, dv, dtype, seed, spare_pages=3):
        g = torch.Generator().manual_seed(seed)
        rng = random.Random(seed)
        self.lens, self.page_size = lens, page_size
        self.k = [torch.randn(n, hkv, d, generator=g, dtype=torch.float64) for n in lens]
        self.v = [torch.randn(n, hkv, dv, generator=g, dtype=torch.float64) for n in lens]
        need = [-(-n // page_size) for n in lens]
        num_pages = sum(need) + spare_pages
        order = list(range(num_pages))
        rng.shuffle(order)  # any page order
        width = max(need + [1]) + 1
        self.table = torch.full((len(lens), width), -1, dtype=torch.int32)
        self.k_cache = torch.full((num_pages, page_size, hkv, d), float("nan"), dtype=dtype)  # unused slots: NaN
        self.v_cache = torch.full((num_pages, page_size, hkv, dv), float("nan"), dtype=dtype)
        for b, n in enumerate(lens):
            for j in range(need[b]):
                page = order.pop()
                self.table[b, j] = page
                rows = slice(j * page_size, min(n, (j + 1) * page_size))
                self.k_cache[page, :rows.stop - rows.start] = self.k[b][rows].to(dtype)
                self.v_cache[page, :rows.stop - rows.start] = self.v[b][rows].to(dtype)
        self.table[self.table < 0] = 0  # entries past a request's pages are never read


def expected(cache, q, starts, pattern, scale=None):
    """The contract per request on the contiguous sequence, packed like q."""
    o = torch.zeros(q.shape[0], q.shape[1], cache.v[0].shape[2] if cache.v else q.shape[2], dtype=torch.float64)
    lse = torch.full((q.shape[0], q.shape[1]), float("-inf"), dtype=torch.float64)
    for b, n in enumerate(cache.lens):
        a, e = starts[b], starts[b + 1]
        if e == a:
            continue
        k = cache.k[b].to(q.dtype).to(torch.float64)[None]
        v = cache.v[b].to(q.dtype).to(torch.float64)[None]
        ob, lb = dense_attention(q[a:e].to(torch.float64)[None], k, v, pattern, q_offset=n - (e - a), scale=scale)
        o[a:e], lse[a:e] = ob[0], lb[0].transpose(0, 1)
    return o, lse


def check(cache, q, starts, pattern, tol, cu=True, scale=None):
    got, got_lse = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, torch.tensor(cache.lens),
                                           pattern, cu_seqlens_q=torch.tensor(starts) if cu else None, scale=scale,
                                           return_lse=True)
    want, want_lse = expected(cache, q, starts, pattern, scale)
    assert got.shape == want.shape and got.dtype == q.dtype
    assert rel_error(got, want) <= tol
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(got_lse), finite), "rows that attend nothing: lse -inf exactly there"
    if finite.any():
        assert (got_lse[finite].to(torch.float64) - want_lse[finite]).abs().max() <= 10 * tol
    return got


@pytest.mark.parametrize("spec", example_specs(), ids=lambda p: p.stem)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_decode_every_example_over_shuffled_pages(spec, page_size):
    # Decode: one query per request, lengths 1 to several pages (partial last pages), GQA 4.
    pattern = attnjit.Pattern.load(spec)
    rng = random.Random(page_size)
    lens = [rng.randint(1, 5 * page_size + 40) for _ in range(4)] + [page_size]
    cache = Cache(lens, page_size, hkv=3, d=32, dv=32, dtype=torch.float32, seed=page_size)
    q = torch.randn(len(lens), 12, 32, generator=torch.Generator().manual_seed(7))
    check(cache, q, list(range(len(lens) + 1)), pattern, 1e-4, cu=False)


@pytest.mark.parametrize("spec", example_specs(), ids=lambda p: p.stem)
def test_chunked_prefill_at_far_positions(spec):
    # Several queries per request (chunked prefill, speculative decoding), requests with none, long
    # caches so that windows, LongNet segments and block layouts meet positions in the thousands.
    pattern = attnjit.Pattern.load(spec)
    lens = [0, 4500, 97, 2049, 300]
    nq = [0, 37, 1, 128, 0]
    starts = [0]
    for n in nq:
        starts.append(starts[-1] + n)
    cache = Cache(lens, 64, hkv=4, d=16, dv=24, dtype=torch.float32, seed=3)
    q = torch.randn(starts[-1], 12, 16, generator=torch.Generator().manual_seed(11))
    check(cache, q, starts, pattern, 1e-4)


@pytest.mark.parametrize("group", [1, 2, 8, 16])
def test_gqa_groups_in_float64_match_the_contract_exactly(group):
    pattern = attnjit.Pattern.from_json({"attnjit": 1, "causal": True, "window": [100, 0], "branches": [{"segment": 64, "dilation": 2}]})
    lens = [5, 130, 300]
    cache = Cache(lens, 16, hkv=16 // group, d=8, dv=8, dtype=torch.float64, seed=group)
    starts = [0, 3, 3 + 17, 3 + 17 + 1]
    q = torch.randn(starts[-1], 16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(group))
    check(cache, q, starts, pattern, 1e-12)


def test_bf16_cache_and_queries():
    pattern = attnjit.Pattern.load(example_specs()[0])
    cache = Cache([700, 33], 16, hkv=2, d=64, dv=64, dtype=torch.bfloat16, seed=5)
    q = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    check(cache, q, [0, 1, 2], pattern, 2e-2, cu=False)


def test_append_then_decode_equals_recomputing_the_whole_sequence():
    # A few generation steps: append each new token's K/V, decode it, compare with attention over
    # the whole sequence so far (its last row).
    pattern = attnjit.Pattern.from_json({"attnjit": 1, "causal": True, "combine": "softmax",
                               "branches": [{"segment": 8, "dilation": 1}, {"segment": 32, "dilation": 4}]})
    g = torch.Generator().manual_seed(1)
    hq, hkv, d, page = 4, 2, 16, 8
    num_pages = 24
    k_cache = torch.zeros(num_pages, page, hkv, d)
    v_cache = torch.zeros(num_pages, page, hkv, d)
    table = torch.tensor([[5, 9, 1, 20, 3, 7, 11, 13], [2, 4, 6, 8, 10, 12, 14, 16]], dtype=torch.int32)
    prompt = [torch.randn(n, hkv, d, generator=g) for n in (19, 3)]
    vals = [torch.randn(n, hkv, d, generator=g) for n in (19, 3)]
    lens = serving.append_kv(k_cache, v_cache, table, torch.tensor([0, 0]), torch.cat(prompt), torch.cat(vals),
                             cu_seqlens_new=torch.tensor([0, 19, 22]))
    assert lens.tolist() == [19, 3] and lens.dtype == torch.int32
    ks, vs = [p.clone() for p in prompt], [v.clone() for v in vals]
    for _ in range(6):
        k_new, v_new = torch.randn(2, hkv, d, generator=g), torch.randn(2, hkv, d, generator=g)
        lens = serving.append_kv(k_cache, v_cache, table, lens, k_new, v_new)
        for b in range(2):
            ks[b] = torch.cat([ks[b], k_new[b:b + 1]])
            vs[b] = torch.cat([vs[b], v_new[b:b + 1]])
        q = torch.randn(2, hq, d, generator=g)
        got = serving.paged_attention(q, k_cache, v_cache, table, lens, pattern)
        for b in range(2):
            n = ks[b].shape[0]
            qs = torch.cat([torch.zeros(n - 1, hq, d), q[b:b + 1]])[None]  # the row at position n - 1
            want = attnjit.attention(qs, ks[b][None], vs[b][None], pattern)[0, -1]
            assert rel_error(got[b], want) <= 1e-5


def test_append_writes_only_its_slots_and_a_bad_request_writes_nothing():
    k_cache = torch.zeros(4, 2, 1, 2)
    v_cache = torch.zeros(4, 2, 1, 2)
    table = torch.tensor([[3, 1], [0, 2]])
    lens = serving.append_kv(k_cache, v_cache, table, [1, 0], torch.ones(3, 1, 2), 2 * torch.ones(3, 1, 2),
                             cu_seqlens_new=[0, 2, 3])
    assert lens.tolist() == [3, 1]
    written = (k_cache != 0).any(dim=-1)[..., 0]
    # request 0: positions 1, 2 -> page 3 slot 1, page 1 slot 0; request 1: position 0 -> page 0 slot 0
    assert written.nonzero().tolist() == [[0, 0], [1, 0], [3, 1]]
    before = k_cache.clone()
    with pytest.raises(ValueError, match=r"kv_lens\[1\] \+ 4 new rows = 5 needs 3 pages of 2 tokens"):
        serving.append_kv(k_cache, v_cache, table, [3, 1], torch.ones(5, 1, 2), torch.ones(5, 1, 2),
                          cu_seqlens_new=[0, 1, 5])
    assert torch.equal(k_cache, before)


def test_append_kv_writes_through_the_cache_s_strides():
    # A combined K/V cache ([pages, 2, page_size, Hkv, D], FlashInfer's and vLLM's) viewed as two
    # caches, which paged_attention takes: append_kv failed on them with torch's "view size is not
    # compatible". It now writes through the strides, exactly where a contiguous cache is written.
    for dtype in (torch.float32, torch.float8_e4m3fn):
        kv = torch.zeros(6, 2, 4, 2, 8).to(dtype)
        plain_k, plain_v = torch.zeros(6, 4, 2, 8).to(dtype), torch.zeros(6, 4, 2, 8).to(dtype)
        table = torch.tensor([[5, 2], [0, 3]])
        g = torch.Generator().manual_seed(4)
        k_new, v_new = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
        for k_cache, v_cache in ((kv[:, 0], kv[:, 1]), (plain_k, plain_v)):
            got = serving.append_kv(k_cache, v_cache, table, [2, 1], k_new, v_new, cu_seqlens_new=[0, 3, 5])
            assert got.tolist() == [5, 3]
        assert torch.equal(kv[:, 0].view(torch.uint8), plain_k.view(torch.uint8))
        assert torch.equal(kv[:, 1].view(torch.uint8), plain_v.view(torch.uint8))
        assert plain_k.float().abs().sum() > 0


def bad_inputs():
    cache = Cache([10, 20], 8, hkv=2, d=4, dv=4, dtype=torch.float32, seed=0)
    q = torch.randn(2, 2, 4)
    return cache, q


@pytest.mark.parametrize("change, message", [
    (lambda c, q, a: a.update(block_table=torch.tensor([[0, 99, 0, 0], [1, 2, 3, 4]], dtype=torch.int32)),
     r"block_table\[0, 1\] = 99 is not a page of the cache"),
    (lambda c, q, a: a.update(kv_lens=torch.tensor([10, 200])), r"kv_lens\[1\] = 200 needs 25 pages of 8 tokens"),
    (lambda c, q, a: a.update(kv_lens=torch.tensor([10, -1])), r"kv_lens\[1\] = -1 is negative"),
    (lambda c, q, a: a.update(kv_lens=torch.tensor([0, 20])), r"request 0 has 1 queries but kv_lens\[0\] = 0"),
    (lambda c, q, a: a.update(q=torch.randn(3, 2, 4)), r"q has 3 queries for 2 requests"),
    (lambda c, q, a: a.update(q=torch.randn(2, 2, 5)), r"head dim 5 differs"),
    (lambda c, q, a: a.update(q=torch.randn(2, 3, 4), v_cache=c.v_cache), r"3 heads, not a multiple"),
    (lambda c, q, a: a.update(cu_seqlens_q=[0, 2, 1]), r"cu_seqlens_q: expected 0 = c_0"),
    (lambda c, q, a: a.update(kv_lens=[10.0, 20]), r"expected an integer"),
    (lambda c, q, a: a.update(block_table=c.table.float()), r"block_table: expected int32 or int64"),
    (lambda c, q, a: a.update(v_cache=c.v_cache[:, :4]), r"the pages, page size and kv heads must agree"),
])
def test_bad_inputs_name_what_is_wrong(change, message):
    cache, q = bad_inputs()
    args = dict(q=q, k_cache=cache.k_cache, v_cache=cache.v_cache, block_table=cache.table,
                kv_lens=torch.tensor(cache.lens), cu_seqlens_q=None)
    change(cache, q, args)
    pattern = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": 8, "dilation": 1}]})
    with pytest.raises((ValueError, TypeError), match=message):
        serving.paged_attention(args["q"], args["k_cache"], args["v_cache"], args["block_table"], args["kv_lens"],
                                pattern, cu_seqlens_q=args["cu_seqlens_q"])


def test_the_emulated_kernels_serve_the_same(monkeypatch):
    # ATTNJIT_CPU_DEVICE=emu: the paged kernel in the CPU emulator reads the pages through the table.
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    pattern = attnjit.Pattern.load(example_specs()[0])
    cache = Cache([150, 64], 16, hkv=2, d=64, dv=64, dtype=torch.bfloat16, seed=9)
    q = torch.randn(5, 4, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    check(cache, q, [0, 4, 5], pattern, 2e-2)


def _broken_gather(cache, pages, length):  # the pages in the wrong order
    rows = cache.index_select(0, pages.flip(0).to(cache.device))
    return rows.reshape(1, -1, cache.shape[2], cache.shape[3])[:, :length]


def _shifted_attention(q, k, v, pattern, *, q_offset, **kw):  # each query one position late
    return attnjit.attention(q, k, v, pattern, q_offset=q_offset + 1, **kw)


@pytest.mark.parametrize("name, value", [("_gather", _broken_gather), ("attention", _shifted_attention)])
def test_a_wrong_page_lookup_or_a_wrong_position_fails_the_check(monkeypatch, name, value):
    # float64 queries: the reference over each request's gathered pages.
    pattern = attnjit.Pattern.load(example_specs()[2])
    cache = Cache([300, 41], 16, hkv=2, d=16, dv=16, dtype=torch.float64, seed=4)
    q = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    check(cache, q, [0, 3, 5], pattern, 1e-12)  # unbroken, it passes
    monkeypatch.setattr(serving, name, value)
    with pytest.raises(AssertionError):
        check(cache, q, [0, 3, 5], pattern, 1e-12)


def _reversed_pages(real):  # each request's pages in the wrong order
    def run(action, c, *rest):
        t = c.table.clone()
        for b, n in enumerate(c.lens):
            need = -(-n // c.k_cache.shape[1])
            t[b, :need] = c.table[b, :need].flip(0)
        c.table = t
        return real(action, c, *rest)
    return run


def _one_early(real):  # each request one token shorter: every query one position early
    def run(action, c, *rest):
        c.lens = [n - 1 for n in c.lens]
        return real(action, c, *rest)
    return run


@pytest.mark.parametrize("device", ["cpu", "emu"])
@pytest.mark.parametrize("broken", [_reversed_pages, _one_early], ids=["pages-reversed", "one-early"])
def test_the_paged_forward_fails_the_check_with_a_wrong_page_lookup_or_position(monkeypatch, device, broken):
    # fp32 queries: the C++ paged forward (the plan executor, or the paged kernel in the emulator).
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", device)
    pattern = attnjit.Pattern.load(example_specs()[2])
    cache = Cache([300, 41], 16, hkv=2, d=16, dv=16, dtype=torch.float32, seed=4)
    q = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(4))
    check(cache, q, [0, 3, 5], pattern, 1e-4)  # unbroken, it passes
    monkeypatch.setattr(serving, "_paged_kernels", broken(serving._paged_kernels))
    with pytest.raises(AssertionError):
        check(cache, q, [0, 3, 5], pattern, 1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the paged kernel on the GPU is not run")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_paged_kernel_on_the_gpu(dtype):
    # Every example, decode and chunked prefill, the block table on the GPU (not read back), the
    # lengths on the host; then a page outside the cache: the rows that attend it are NaN, no others.
    for spec in example_specs():
        pattern = attnjit.Pattern.load(spec)
        cache = Cache([1, 70, 2100, 300], 16, hkv=2, d=64, dv=64, dtype=dtype, seed=11)
        q = torch.randn(7, 6, 64, generator=torch.Generator().manual_seed(11)).to(dtype)
        starts = [0, 1, 2, 6, 7]
        got = serving.paged_attention(q.cuda(), cache.k_cache.cuda(), cache.v_cache.cuda(), cache.table.cuda(), cache.lens,
                                      pattern, cu_seqlens_q=starts)
        want, _ = expected(cache, q, starts, pattern)
        assert rel_error(got.cpu(), want) <= (2e-2 if dtype == torch.bfloat16 else 1e-4), spec.stem
    table = cache.table.clone()
    table[3, 0] = cache.k_cache.shape[0] + 5  # request 3's first page: outside the cache
    got = serving.paged_attention(q.cuda(), cache.k_cache.cuda(), cache.v_cache.cuda(), table.cuda(), cache.lens, pattern,
                                  cu_seqlens_q=starts)
    rows = got.float().isnan().any(-1).any(-1).cpu()
    assert rows[6] and not rows[:6].any()
    # With a counter the page's reads are counted and its keys skipped: no NaN, the count above 0.
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    got = serving.paged_attention(q.cuda(), cache.k_cache.cuda(), cache.v_cache.cuda(), table.cuda(), cache.lens, pattern,
                                  cu_seqlens_q=starts, errors=errors)
    assert not got.float().isnan().any() and int(errors) > 0


FP8 = getattr(torch, "float8_e4m3fn", None)


def _fp8_cache(lens, page_size, hkv, d, seed):
    """A Cache whose pages hold e4m3 codes with per-kv-head scales; its contiguous K/V (what the
    oracle reads) are the codes' values times the scales."""
    cache = Cache(lens, page_size, hkv, d, d, torch.float32, seed)
    g = torch.Generator().manual_seed(seed + 1)
    k_scale, v_scale = torch.rand(hkv, generator=g) * 1.5 + 0.25, torch.rand(hkv, generator=g) * 1.5 + 0.25
    cache.k_cache = (cache.k_cache * 2 / k_scale[:, None]).to(FP8)
    cache.v_cache = (cache.v_cache * 2 / v_scale[:, None]).to(FP8)
    for b in range(len(lens)):
        kb = (cache.k[b] * 2 / k_scale[:, None].double()).to(FP8)
        vb = (cache.v[b] * 2 / v_scale[:, None].double()).to(FP8)
        cache.k[b] = kb.double() * k_scale[:, None].double()
        cache.v[b] = vb.double() * v_scale[:, None].double()
    return cache, k_scale, v_scale


@pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn")
@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_fp8_caches_read_as_code_times_scale(monkeypatch, device):
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", device)
    for spec in example_specs():
        pattern = attnjit.Pattern.load(spec)
        cache, k_scale, v_scale = _fp8_cache([1, 70, 2100, 300], 16, 2, 32, seed=5)
        q = torch.randn(7, 4, 32, generator=torch.Generator().manual_seed(5))
        starts = [0, 1, 2, 6, 7]
        got = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern,
                                      cu_seqlens_q=torch.tensor(starts), k_scale=k_scale, v_scale=v_scale)
        want, _ = expected(cache, q, starts, pattern)
        assert rel_error(got, want) <= 1e-4, spec.stem
        # The float64 path reads the same values.
        got64 = serving.paged_attention(q.double(), cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern,
                                        cu_seqlens_q=torch.tensor(starts), k_scale=k_scale, v_scale=v_scale)
        assert rel_error(got64, want) <= 1e-6, spec.stem
    # A wrong scale is seen; scales on a cache that is not FP8 are refused.
    wrong = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern,
                                    cu_seqlens_q=torch.tensor(starts), k_scale=k_scale, v_scale=v_scale * 1.01)
    assert rel_error(wrong, want) > 1e-3
    with pytest.raises(ValueError, match="k_scale: applies to float8_e4m3fn caches"):
        serving.paged_attention(q, cache.k_cache.float(), cache.v_cache.float(), cache.table, cache.lens, pattern,
                                cu_seqlens_q=torch.tensor(starts), k_scale=k_scale)
    with pytest.raises(ValueError, match=r"v_scale: expected a float or \[Hkv = 2\]"):
        serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern,
                                cu_seqlens_q=torch.tensor(starts), v_scale=torch.ones(3))


@pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn")
def test_append_kv_quantises_fp8_rows_by_their_scale():
    hkv, d, page = 2, 16, 8
    k_cache = torch.zeros(6, page, hkv, d, dtype=FP8)
    v_cache = torch.zeros(6, page, hkv, d, dtype=FP8)
    table = torch.tensor([[3, 1, 5]], dtype=torch.int32)
    k_new, v_new = torch.randn(20, hkv, d) * 3, torch.randn(20, hkv, d)
    k_new[0, 0, 0] = 1e6  # saturates at 448 x scale
    k_scale, v_scale = torch.tensor([0.5, 2.0]), 1.5
    lens = serving.append_kv(k_cache, v_cache, table, [0], k_new, v_new, torch.tensor([0, 20]), k_scale=k_scale, v_scale=v_scale)
    assert lens.tolist() == [20]
    stored = k_cache[[3, 1, 5]].reshape(-1, hkv, d)[:20].float() * k_scale[:, None]
    want = (k_new / k_scale[:, None]).clamp(-448, 448).to(FP8).float() * k_scale[:, None]
    assert torch.equal(stored, want)
    assert stored[0, 0, 0] == 448 * 0.5
    assert torch.equal(v_cache[[3, 1, 5]].reshape(-1, hkv, d)[:20].float() * v_scale, (v_new / v_scale).to(FP8).float() * v_scale)


@pytest.mark.skipif(not torch.cuda.is_available() or FP8 is None, reason="no CUDA GPU (or no float8 in torch): FP8 caches on the GPU not run")
def test_fp8_caches_on_the_gpu():
    pattern = attnjit.Pattern.load(example_specs()[2])
    cache, k_scale, v_scale = _fp8_cache([1, 70, 2100, 300], 16, 2, 64, seed=8)
    q = torch.randn(7, 4, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    starts = [0, 1, 2, 6, 7]
    got = serving.paged_attention(q.cuda(), cache.k_cache.cuda(), cache.v_cache.cuda(), cache.table.cuda(), cache.lens,
                                  pattern, cu_seqlens_q=starts, k_scale=k_scale.cuda(), v_scale=v_scale.cuda())
    want, _ = expected(cache, q.float(), starts, pattern)
    assert rel_error(got.cpu(), want) <= 2e-2


@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_graph_workspace_plans_each_step_and_runs_it(monkeypatch, device):
    # plan() then run() over one workspace, step after step (lengths growing, the same tensors), as
    # a captured decode loop does; each step equals paged_attention's answer. In the emulator run()
    # launches over the workspace as a graph's replay would.
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", device)
    pattern = attnjit.Pattern.load(example_specs()[4])  # a sliding window
    cache = Cache([40, 300, 90], 16, hkv=2, d=32, dv=32, dtype=torch.float32, seed=3)
    q = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(3))
    lens = [n - 5 for n in cache.lens]
    cap = serving.paged_capacity(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern)
    assert set(cap) == {"requests", "items", "spans", "entries", "splits"} and cap["requests"] == 3
    cap = {**cap, "items": cap["items"] + 4, "spans": cap["spans"] + 16, "splits": max(cap["splits"], 4)}
    ws = serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, cap)
    out = torch.full((3, 4, 32), float("nan"))
    for step in range(6):
        ws.plan(q, cache.k_cache, cache.v_cache, cache.table, lens)
        ws.run(q, cache.k_cache, cache.v_cache, cache.table, lens, out)
        want = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, lens, pattern)
        assert torch.allclose(out, want, atol=1e-6, rtol=1e-5), step
        lens = [n + 1 for n in lens]
    small = {**cap, "items": 1}
    with pytest.raises(attnjit.AttnjitError, match="PagedCapacity.items: the step's plan needs"):
        serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, small).plan(q, cache.k_cache, cache.v_cache,
                                                                                    cache.table, lens)
    with pytest.raises(ValueError, match="out: expected"):
        ws.run(q, cache.k_cache, cache.v_cache, cache.table, lens, out[:2])
    with pytest.raises(ValueError, match="capacity: missing splits"):
        serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, {k: v for k, v in cap.items() if k != "splits"})
    # A workspace is sized for its problem (its kernels' tiles and head dims) and run() reads what
    # plan() planned from run()'s tensors: another problem, or tensors smaller than the plan, would
    # be read and written past their memory (once accepted: heap corruption in the emulator).
    v_wide = torch.randn(cache.v_cache.shape[:3] + (64,))
    with pytest.raises(ValueError, match=r"^plan: this GraphWorkspace was made for 4 query heads, 2 kv heads, head dims "
                                         r"32/32, .*called with .*head dims 32/64"):
        ws.plan(q, cache.k_cache, v_wide, cache.table, lens)
    with pytest.raises(ValueError, match=r"^run: this GraphWorkspace was made for"):
        ws.run(q.double(), cache.k_cache.double(), cache.v_cache.double(), cache.table, lens, out.double())
    with pytest.raises(ValueError, match=r"^q: expected a torch tensor \[total_q, Hq, D\]"):  # checked before the problem
        ws.plan(q[0], cache.k_cache, cache.v_cache, cache.table, lens)
    ws.plan(q, cache.k_cache, cache.v_cache, cache.table, lens)
    with pytest.raises(ValueError, match=r"^run: the plan reads 3 queries \(q rows\) but run\(\)'s tensors hold 2; "
                                         r"run\(\) must be given plan\(\)'s tensors"):
        ws.run(q[:2].clone(), cache.k_cache, cache.v_cache, cache.table[:2], lens[:2], out[:2].clone())
    ws.run(q, cache.k_cache, cache.v_cache, cache.table, lens, out)  # run()'s tensors, as a capture takes them
    with pytest.raises(ValueError, match=r"^plan: the plan reads 4 queries \(q rows\) but run\(\)'s tensors hold 3"):
        ws.plan(torch.cat([q, q[:1]]), cache.k_cache, cache.v_cache, torch.cat([cache.table, cache.table[:1]]),
                lens + [lens[0]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the captured decode loop is not run")
def test_a_decode_loop_captured_in_a_cuda_graph():
    pattern = attnjit.Pattern.load(example_specs()[2])  # LongNet
    cache = Cache([40, 3000, 900], 16, hkv=2, d=64, dv=64, dtype=torch.bfloat16, seed=6)
    q = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).cuda()
    k_cache, v_cache, table = cache.k_cache.cuda(), cache.v_cache.cuda(), cache.table.cuda()
    lens = [n - 8 for n in cache.lens]
    cap = serving.paged_capacity(q, k_cache, v_cache, table, cache.lens, pattern)
    cap = {**cap, "items": cap["items"] + 8, "spans": cap["spans"] + 64, "splits": max(cap["splits"], 8)}
    ws = serving.GraphWorkspace(q, k_cache, v_cache, pattern, cap)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16, device="cuda")
    ws.plan(q, k_cache, v_cache, table, lens)
    ws.run(q, k_cache, v_cache, table, lens, out)  # warm-up: compiles and loads before the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ws.run(q, k_cache, v_cache, table, lens, out)
    for step in range(8):
        lens = [n + 1 for n in lens]
        ws.plan(q, k_cache, v_cache, table, lens)
        g.replay()
        want = serving.paged_attention(q, k_cache, v_cache, table, lens, pattern)
        assert torch.allclose(out.float(), want.float(), atol=2e-2, rtol=2e-2), step


@pytest.mark.parametrize("device", ["cpu", "emu"])
@pytest.mark.parametrize("spec", example_specs(), ids=lambda p: p.stem)
def test_planned_on_the_device_matches_the_contract(monkeypatch, device, spec):
    # plan_on_device: the lengths go to the C++ runtime as int32 arrays it reads itself (in the
    # emulator the _plan kernel reads them; the CPU device reads them on the host).
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", device)
    pattern = attnjit.Pattern.load(spec)
    cache = Cache([300, 41, 2100], 16, hkv=2, d=32, dv=32, dtype=torch.float32, seed=8)
    q = torch.randn(8, 4, 32, generator=torch.Generator().manual_seed(8))
    starts = [0, 3, 4, 8]
    got, got_lse = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, torch.tensor(cache.lens), pattern,
                                           cu_seqlens_q=torch.tensor(starts), return_lse=True, plan_on_device=True)
    want, want_lse = expected(cache, q, starts, pattern)
    assert rel_error(got, want) <= 1e-4
    assert torch.equal(torch.isfinite(got_lse), torch.isfinite(want_lse))


def test_lengths_the_device_planner_refuses_make_nan_rows_counted_in_the_emulator(monkeypatch):
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    pattern = attnjit.Pattern.load(example_specs()[1])
    cache = Cache([300, 41, 90], 16, hkv=2, d=32, dv=32, dtype=torch.float32, seed=2)
    q = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(2))
    errors = torch.zeros(1, dtype=torch.int32)
    lens = torch.tensor([300, 41 + 16 * 100, 90])  # request 1: past its block table
    out = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, lens, pattern, plan_on_device=True,
                                  errors=errors)
    assert int(errors) == 1
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
    # On the host the same call is refused by name.
    with pytest.raises(ValueError, match=r"kv_lens\[1\]"):
        serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, lens, pattern)


def test_plan_on_device_refuses_float64_queries():
    pattern = attnjit.Pattern.load(example_specs()[1])
    cache = Cache([30], 16, hkv=1, d=8, dv=8, dtype=torch.float64, seed=1)
    q = torch.randn(1, 1, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="float64 queries run the reference"):
        serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, [30], pattern, plan_on_device=True)


def test_graph_workspace_planned_on_the_device_needs_no_plan(monkeypatch):
    # The workspace sized for the batch and query count alone; each run() plans from the lengths it
    # is given (tensors whose contents change step by step), with no plan(). In the emulator run()
    # launches the planner, then the kernels, over the workspace, as a graph's replay would.
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", "emu")
    pattern = attnjit.Pattern.load(example_specs()[2])  # LongNet
    cache = Cache([40, 300, 2100], 16, hkv=2, d=32, dv=32, dtype=torch.float32, seed=5)
    q = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(5))
    lens = torch.tensor([n - 4 for n in cache.lens], dtype=torch.int32)
    cap = serving.paged_capacity(q, cache.k_cache, cache.v_cache, cache.table, lens, pattern, plan_on_device=True)
    ws = serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, cap)
    out = torch.full((3, 4, 32), float("nan"))
    for step in range(4):
        ws.run(q, cache.k_cache, cache.v_cache, cache.table, lens, out, plan_on_device=True)
        want = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, lens.tolist(), pattern)
        assert torch.allclose(out, want, atol=1e-6, rtol=1e-5), step
        lens += 1  # in place: the same tensor, as a graph's replay reads it
    with pytest.raises(attnjit.AttnjitError, match="call run\\(\\) alone"):
        ws.plan(q, cache.k_cache, cache.v_cache, cache.table, lens, plan_on_device=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the decode loop planned on the device is not run")
def test_a_decode_loop_planned_on_the_device_replays_alone():
    pattern = attnjit.Pattern.load(example_specs()[2])  # LongNet
    cache = Cache([40, 3000, 900], 16, hkv=2, d=64, dv=64, dtype=torch.bfloat16, seed=7)
    q = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).cuda()
    k_cache, v_cache, table = cache.k_cache.cuda(), cache.v_cache.cuda(), cache.table.cuda()
    lens = torch.tensor([n - 8 for n in cache.lens], dtype=torch.int32, device="cuda")
    cap = serving.paged_capacity(q, k_cache, v_cache, table, lens, pattern)
    ws = serving.GraphWorkspace(q, k_cache, v_cache, pattern, cap)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16, device="cuda")
    ws.run(q, k_cache, v_cache, table, lens, out)  # warm-up: compiles and loads before the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ws.run(q, k_cache, v_cache, table, lens, out)
    for step in range(8):
        lens += 1
        g.replay()
        want = serving.paged_attention(q, k_cache, v_cache, table, lens.tolist(), pattern)
        assert torch.allclose(out.float(), want.float(), atol=2e-2, rtol=2e-2), step


@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_a_step_planned_on_the_device_is_one_operator_torch_compile_traces(monkeypatch, device):
    # torch.ops.attnjit.paged_attention: the whole call (lengths read by the kernels, not the host),
    # so torch.compile(fullgraph=True) traces paged_attention and its answer is the eager one's.
    monkeypatch.setenv("ATTNJIT_CPU_DEVICE", device)
    pattern = attnjit.Pattern.load(example_specs()[2])  # LongNet
    cache = Cache([300, 41, 2100], 16, hkv=2, d=32, dv=32, dtype=torch.float32, seed=12)
    q = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(12))
    lens = torch.tensor(cache.lens, dtype=torch.int32)

    def step(q, lens):
        return serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, lens, pattern, plan_on_device=True,
                                       return_lse=True)
    eager = step(q, lens)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager")(q, lens)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    want, _ = expected(cache, q, [0, 1, 2, 3], pattern)
    assert rel_error(eager[0], want) <= 1e-4
    torch.library.opcheck(torch.ops.attnjit.paged_attention.default,
                          (q, cache.k_cache, cache.v_cache, cache.table, lens, None, None, None, None,
                           attnjit.Pattern.load(example_specs()[2]).op_spec),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: paged_attention captured in a CUDA graph is not run")
def test_paged_attention_planned_on_the_device_is_captured_whole_in_a_cuda_graph():
    pattern = attnjit.Pattern.load(example_specs()[4])  # a sliding window
    cache = Cache([40, 3000, 900], 16, hkv=2, d=64, dv=64, dtype=torch.bfloat16, seed=13)
    q = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16).cuda()
    k_cache, v_cache, table = cache.k_cache.cuda(), cache.v_cache.cuda(), cache.table.cuda()
    lens = torch.tensor([n - 8 for n in cache.lens], dtype=torch.int32, device="cuda")
    serving.paged_attention(q, k_cache, v_cache, table, lens, pattern)  # warm-up: compiles and loads
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = serving.paged_attention(q, k_cache, v_cache, table, lens, pattern)
    for step in range(8):
        lens += 1
        g.replay()
        want = serving.paged_attention(q, k_cache, v_cache, table, lens.tolist(), pattern)
        assert torch.allclose(out.float(), want.float(), atol=2e-2, rtol=2e-2), step


def _workspace():
    """A GraphWorkspace planned for two requests (10 and 7 tokens, one query each), its call's tensors."""
    pattern = {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}
    cache = Cache([10, 7], 4, hkv=2, d=16, dv=16, dtype=torch.float32, seed=21)
    q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(21))
    cap = serving.paged_capacity(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern)
    ws = serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, cap)
    ws.plan(q, cache.k_cache, cache.v_cache, cache.table, cache.lens)
    return ws, cache, q, pattern


@pytest.mark.parametrize("outputs, message", [
    (lambda q: {"lse": torch.full((2, 4), -7.0, dtype=torch.float16)},
     r"^lse: expected torch.float32 \[2, 4\] on cpu, got torch.float16 \[2, 4\] on cpu"),
    (lambda q: {"lse": torch.full((2, 4), -7.0, dtype=torch.int8)}, r"^lse: expected torch.float32 .* got torch.int8"),
    (lambda q: {"lse": torch.full((2, 4), -7.0, dtype=torch.float64)}, r"^lse: expected torch.float32 .* got torch.float64"),
    (lambda q: {"lse": torch.full((3,), -7.0)}, r"^lse: expected torch.float32 \[2, 4\] on cpu, got torch.float32 \[3\]"),
    (lambda q: {"lse": torch.full((1, 4), -7.0).expand(2, 4)},
     r"^lse: is an output whose elements overlap: dimension 0 \(size 2, stride 0\)"),
    (lambda q: {"out": torch.full((1, 4, 16), -7.0).expand(2, 4, 16)},
     r"^o: is an output whose elements overlap: dimension 0 \(size 2, stride 0\)"),
    (lambda q: {"out": torch.full((64,), -7.0).as_strided((2, 4, 16), (16, 8, 1))},
     r"^o: is an output whose elements overlap: dimension 1 \(size 4, stride 8\)"),
    (lambda q: {"out": q}, r"^out and q share memory"),
    (lambda q: (lambda o: {"out": o, "lse": o.view(-1)[:8].view(2, 4)})(torch.full((2, 4, 16), -7.0)),
     r"^lse and out share memory"),
], ids=["lse-fp16", "lse-int8", "lse-fp64", "lse-shape", "lse-expanded", "out-expanded", "out-overlapping", "out-is-q",
        "lse-inside-out"])
def test_graph_workspace_run_refuses_outputs_it_cannot_write(outputs, message):
    # out and lse are written by the kernels through their pointers: a wrong dtype (lse in fp16
    # overran its buffer), a wrong shape, entries sharing memory (an expanded view: one request's
    # answer over another's) or memory shared with an input is refused, and nothing is written.
    ws, cache, q, pattern = _workspace()
    q = q.clone()
    args = {"out": torch.full((2, 4, 16), -7.0), "lse": None, **outputs(q)}
    before = {name: x.clone() for name, x in args.items() if x is not None}
    with pytest.raises(ValueError, match=message):
        ws.run(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, args["out"], lse=args["lse"])
    for name, x in before.items():
        assert torch.equal(args[name], x), f"{name} was written"
    # The right tensors: the answer and the LSE paged_attention gives.
    out, lse = torch.empty(2, 4, 16), torch.empty(2, 4)
    ws.run(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, out, lse=lse)
    want, want_lse = serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern,
                                             return_lse=True)
    assert torch.allclose(out, want, atol=1e-6) and torch.allclose(lse, want_lse, atol=1e-6)


@pytest.mark.parametrize("field, value, error, message", [
    ("requests", 2**62, ValueError, r'^capacity\["requests"\]: 4611686018427387904 is out of range; must be <= 2147483647'),
    ("items", 2**31, ValueError, r'^capacity\["items"\]: 2147483648 is out of range; must be <= 2147483647'),
    ("entries", -1, ValueError, r'^capacity\["entries"\]: -1 is out of range; must be >= 0'),
    ("splits", 2**62, ValueError, r'^capacity\["splits"\]: 4611686018427387904 is out of range; must be <= 64'),
    ("splits", 0, ValueError, r'^capacity\["splits"\]: 0 is out of range; must be >= 1'),
    ("spans", 1.5, TypeError, r'^capacity\["spans"\]: expected an integer, got float 1.5'),
    ("items", "x", TypeError, r"^capacity\[\"items\"\]: expected an integer, got str 'x'"),
    ("requests", True, TypeError, r'^capacity\["requests"\]: expected an integer, got True'),
])
def test_graph_workspace_capacity_fields_are_checked(field, value, error, message):
    # A capacity past what the runtime counts in 32 bits made the workspace's size wrap (then
    # plan() wrote past it); a float was truncated. Each field is an integer in the runtime's range.
    ws, cache, q, pattern = _workspace()
    cap = serving.paged_capacity(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern)
    with pytest.raises(error, match=message):
        serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, {**cap, field: value})
    with pytest.raises(TypeError, match=r"^capacity: expected a dict as paged_capacity returns"):
        serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, list(cap.values()))
    ws = serving.GraphWorkspace(q, cache.k_cache, cache.v_cache, pattern, {**cap, "splits": 64})  # the limits themselves
    assert ws.capacity[-1] == 64


@pytest.mark.parametrize("kv_lens, error, message", [
    (None, TypeError, r"^kv_lens: expected \[B\] integers .* got NoneType None"),
    (torch.tensor(10), ValueError, r"^kv_lens: expected a 1-D tensor \[B\] \(one length per request\), got shape \(\)"),
    (10, TypeError, r"^kv_lens: expected \[B\] integers .* got int 10"),
])
def test_kv_lens_that_are_no_list_of_lengths_are_named(kv_lens, error, message):
    cache, q = bad_inputs()
    pattern = {"attnjit": 1, "branches": [{"segment": "full"}]}
    with pytest.raises(error, match=message):
        serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, kv_lens, pattern)
    with pytest.raises(error, match=message):
        serving.append_kv(cache.k_cache, cache.v_cache, cache.table, kv_lens, torch.ones(2, 2, 4), torch.ones(2, 2, 4))


def test_append_kv_refuses_new_rows_that_share_a_slot():
    # A page listed twice in a request's row of the table, or a page two requests write into at the
    # same slot: the rows would overwrite each other. Refused, and nothing is written.
    k_cache, v_cache = torch.zeros(4, 2, 1, 4), torch.zeros(4, 2, 1, 4)
    rows = torch.arange(4.0).view(4, 1, 1).expand(4, 1, 4).contiguous()
    with pytest.raises(ValueError, match=r"^block_table\[0, 1\] = 0 repeats block_table\[0, 0\]: a request's pages must "
                                         r"be distinct"):
        serving.append_kv(k_cache, v_cache, torch.tensor([[0, 0]]), [0], rows, rows, [0, 4])
    with pytest.raises(ValueError, match=r"^request 0's new row at position 1 and request 1's at position 1 both go to "
                                         r"page 3, slot 1"):
        serving.append_kv(k_cache, v_cache, torch.tensor([[3, 1], [3, 2]]), [1, 1], rows[:2], rows[:2], [0, 1, 2])
    assert not k_cache.any() and not v_cache.any()
    # Distinct pages (and a repeated one past the pages a request uses) are fine.
    lens = serving.append_kv(k_cache, v_cache, torch.tensor([[3, 1, 3], [0, 2, 2]]), [1, 0], rows[:3], rows[:3], [0, 2, 3])
    assert lens.tolist() == [3, 1]


@pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn")
@pytest.mark.parametrize("scale, error, message", [
    (0.0, ValueError, r"^k_scale: must be positive and finite \(a code stands for code x scale\), got 0.0$"),
    (-1.0, ValueError, r"^k_scale: must be positive and finite .* got -1.0$"),
    (float("nan"), ValueError, r"^k_scale: must be positive and finite .* got nan$"),
    (float("inf"), ValueError, r"^k_scale: must be positive and finite .* got inf$"),
    (torch.tensor([1.0, 0.0]), ValueError, r"^k_scale: must be positive and finite .* got 0.0 at index 1$"),
    (True, TypeError, r"^k_scale: expected a positive float or \[Hkv = 2\] fp32 scales, got bool True"),
    ("1", TypeError, r"^k_scale: expected a positive float or \[Hkv = 2\] fp32 scales, got str '1'"),
])
def test_fp8_scales_must_be_positive_and_finite(scale, error, message):
    cache, _, _ = _fp8_cache([10, 20], 8, 2, 16, seed=22)
    q = torch.randn(2, 4, 16)
    pattern = {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}
    with pytest.raises(error, match=message):
        serving.paged_attention(q, cache.k_cache, cache.v_cache, cache.table, cache.lens, pattern, k_scale=scale)
    before = cache.k_cache.view(torch.uint8).clone()
    with pytest.raises(error, match=message):
        serving.append_kv(cache.k_cache, cache.v_cache, cache.table, [2, 3], torch.ones(2, 2, 16), torch.ones(2, 2, 16),
                          k_scale=scale)
    assert torch.equal(cache.k_cache.view(torch.uint8), before)


@pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn")
def test_append_kv_stores_infinities_as_nan_in_fp8_caches():
    # e4m3fn has no infinity: +-inf is stored as its NaN code, never as a finite +-448 (torch's own
    # conversion saturates it), so only the queries that attend that row come out non-finite.
    k_cache, v_cache = torch.zeros(2, 8, 1, 4, dtype=FP8), torch.zeros(2, 8, 1, 4, dtype=FP8)
    k_new = torch.ones(8, 1, 4)
    k_new[3, 0, 0], k_new[6, 0, 1], k_new[7, 0, 2], k_new[5, 0, 0] = float("inf"), -float("inf"), float("nan"), 1e6
    serving.append_kv(k_cache, v_cache, torch.tensor([[1]]), [0], k_new, torch.ones(8, 1, 4), [0, 8], k_scale=2.0)
    stored = k_cache[1, :, 0].float()
    assert torch.isnan(stored[[3, 6, 7], [0, 1, 2]]).all() and torch.isnan(stored).sum() == 3
    assert stored[5, 0] == 448 and stored[3, 1] == 0.5  # finite values saturate; the rest of the row as it was
    pattern = {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}
    q = torch.ones(8, 1, 4)
    o = serving.paged_attention(q, k_cache, v_cache, torch.tensor([[1]] * 8), list(range(1, 9)), pattern, k_scale=2.0)
    assert (~torch.isfinite(o)).any(dim=(1, 2)).tolist() == [i >= 3 for i in range(8)]
