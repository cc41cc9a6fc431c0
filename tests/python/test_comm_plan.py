"""attnjit.distributed in one process: the layouts (contiguous, zigzag, balanced, best, head
parallelism's pooled chunks), the comm plan's steps, pairs and heavy runs, and one ring step's
kernel call; test_distributed.py runs the ring itself over gloo."""
import numpy as np
import pytest
import torch

import attnjit
import attnjit.distributed as ad
from conftest import CASES, GLOBAL_ROWS, HEAD_DIM, LONGNET, SEQ, ring_inputs


def test_head_parallel_layouts_pool_a_head_group_s_chunks():
    assert ad.head_parallel_layout(1024, 8, 1, "zigzag") == "zigzag"
    assert ad.head_parallel_layout(1024, 8, 4, "contiguous") == "contiguous"
    pooled = ad.head_parallel_layout(1024, 8, 4, "zigzag")  # ring ranks 0 and 1 of 2, each 4 ranks' chunks
    assert pooled.chunks[0] == tuple(c for r in range(4) for c in ad.chunks_of(1024, 8, r, "zigzag"))
    assert ad.chunks_of(1024, 2, 1, pooled) == [c for r in range(4, 8) for c in ad.chunks_of(1024, 8, r, "zigzag")]
    with pytest.raises(ValueError, match="head_parallel: expected a divisor of the world size 8, got 3"):
        ad.head_parallel_layout(1024, 8, 3)


def test_the_comm_plan_prints_its_steps():
    text = str(ad.comm_plan(LONGNET, SEQ, 4, world_size=4, layout="zigzag"))
    assert text.startswith("; comm plan: 512 rows over 4 ranks (zigzag), heads 4/4\n")
    assert "rank 0 [0, 64), [448, 512)" in text
    assert "step 0: r0<-r0 " in text and "step 3: " in text and "; K/V moved: " in text
    # Each step names the share of the local query rows it computes and merges (summed over its
    # chunk pairs: zigzag's local step merges some rows twice).
    assert "r0<-r0 4 pairs, local, 125.0% queries" in text
    plan = ad.comm_plan(LONGNET, SEQ, 4, world_size=4, layout="contiguous")
    # Rank 1's rows [128, 256) against rank 0's keys [0, 128): only the 256- and 512-row segments
    # reach across, at dilations 2 and 4 (every second row, per head offset): half the rows.
    assert plan.query_rows(1, 0) == 128 * 4 // 2
    assert f"r1<-r0 1 pairs, " in str(plan) and "50.0% queries" in str(plan)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_writes_only_the_rows_that_attend_and_those_as_attention_does(dtype):
    """One ring step's kernel call: the rows call_rows names (exactly the rows that attend a key, by
    the mask) come out as attnjit.attention's; the others keep what the scratch held."""
    from attnjit._torch_ops import forward_rows_with_work
    from attnjit import _attnjit

    spec = attnjit.Pattern.from_json(LONGNET)
    for q_offset, k_offset in ((0, 256), (256, 0), (64, 320)):  # across the 64- and 256-row segments
        q, k, v, _ = (x[:, :256].to(dtype) for x in ring_inputs(4, 2, seed=q_offset))
        _, rows = _attnjit.call_rows(spec.op_spec, 256, 4, 256, 2, q_offset, k_offset)
        attends = spec.mask(256, 4, 256, 2, q_offset, k_offset).any(axis=2)  # [H, Sq]
        assert (rows.astype(bool) == attends).all()
        o = torch.full((2, 256, 4, HEAD_DIM), 7.0, dtype=dtype)
        lse = torch.full((2, 4, 256), 3.0)
        forward_rows_with_work(q, k, v, o, lse, spec.op_spec, q_offset, k_offset)
        o_ref, lse_ref = attnjit.attention(q, k, v, LONGNET, q_offset=q_offset, k_offset=k_offset, return_lse=True)
        work = torch.from_numpy(attends).T  # [Sq, H]
        torch.testing.assert_close(o[:, work], o_ref[:, work], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse.transpose(1, 2)[:, work], lse_ref.transpose(1, 2)[:, work], atol=1e-5, rtol=1e-5)
        idle = ~work
        assert idle.any()
        lse_rows = lse.transpose(1, 2)[:, idle]  # [B, idle rows]
        kept = lse_rows == 3.0
        # A row without work keeps the scratch or holds (0, -inf); most keep it (whole items idle).
        assert (kept | (lse_rows == float("-inf"))).all()
        assert (o[:, idle] == torch.where(kept, 7.0, 0.0).unsqueeze(-1).to(dtype)).all()
        assert kept.float().mean() > 0.5


def test_the_layouts_cut_the_sequence_as_documented():
    assert ad.chunks_of(16, 2, 1) == [(8, 8)]
    assert ad.chunks_of(16, 2, 0, "zigzag") == [(0, 4), (12, 4)]
    assert ad.chunks_of(16, 2, 1, "zigzag") == [(4, 4), (8, 4)]
    with pytest.raises(ValueError, match="sequence length 10 is not a positive multiple of 4 .*pad the sequence"):
        ad.chunks_of(10, 2, 0, "zigzag")
    with pytest.raises(ValueError, match=r"layout: expected one of contiguous, zigzag or a ChunkLayout \(balanced_layout\), got 'ring'"):
        ad.chunks_of(16, 2, 0, "ring")


def _rank_pairs(spec, seq, hq, hkv, chunks):
    """A rank's attended pairs counted from the mask itself (per branch, over all heads)."""
    p = attnjit.Pattern.from_json(spec)
    return sum(int(p.mask(n, hq, seq, hkv, q_offset=s).astype("int64").sum()) for s, n in chunks)


def test_the_balanced_layout_is_zigzag_for_a_causal_mask_and_counts_what_the_mask_says():
    causal = CASES["causal"][0]
    lay = ad.balanced_layout(causal, 64, 2, world_size=4)
    assert [ad.chunks_of(64, 4, r, lay) for r in range(4)] == [ad.chunks_of(64, 4, r, "zigzag") for r in range(4)]
    assert lay.imbalance == 0.0 and str(lay) == "balanced:2"
    for name in ("longnet", "block-sparse local+global", "sliding window"):
        spec, hq, hkv = CASES[name]
        lay = ad.balanced_layout(spec, 256, hq, hkv, world_size=4, chunks_per_rank=2)
        assert list(lay.work) == [_rank_pairs(spec, 256, hq, hkv, lay.chunks[r]) for r in range(4)], name


def _imbalance(spec, seq, hq, world, layout):
    work = [_rank_pairs(spec, seq, hq, hq, ad.chunks_of(seq, world, r, layout)) for r in range(world)]
    return max(work) / (sum(work) / world) - 1


def test_the_balanced_layout_evens_out_the_work_where_zigzag_does_not():
    # A window, a window with a dilated branch, LongNet's causal form: rows near the start attend
    # fewer keys, so cutting by rows alone leaves ranks idle. Measured from the masks.
    window = {"attnjit": 1, "causal": True, "window": [383, 0], "branches": [{"segment": "full"}]}
    longnet = {"attnjit": 1, "causal": True, "combine": "softmax", "branches": [
        {"segment": 256, "dilation": 1}, {"segment": 1024, "dilation": 4}, {"segment": 2048, "dilation": 8}]}
    for spec in (window, longnet):
        lay = ad.balanced_layout(spec, 2048, 2, world_size=4, chunks_per_rank=8)
        got = _imbalance(spec, 2048, 2, 4, lay)
        assert abs(got - lay.imbalance) < 1e-12
        assert got <= 0.05, (spec, got)
        assert got <= _imbalance(spec, 2048, 2, 4, "zigzag") + 1e-12
        assert got <= _imbalance(spec, 2048, 2, 4, "contiguous") + 1e-12


def test_the_best_layout_is_the_simplest_that_shares_the_work_out_evenly():
    causal = {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}
    dense = {"attnjit": 1, "branches": [{"segment": "full"}]}
    window = {"attnjit": 1, "causal": True, "window": [383, 0], "branches": [{"segment": "full"}]}
    assert ad.best_layout(dense, 2048, 2, world_size=4) == "contiguous"  # every layout is even: the simplest
    assert ad.best_layout(causal, 2048, 2, world_size=4) == "zigzag"  # even, where contiguous is not
    lay = ad.best_layout(window, 2048, 2, world_size=4)  # the first 383 rows attend fewer keys
    assert isinstance(lay, ad.ChunkLayout) and lay.name == "balanced:8", lay
    assert lay.imbalance < _imbalance(window, 2048, 2, 4, "contiguous") - 0.02
    assert abs(_imbalance(window, 2048, 2, 4, lay) - lay.imbalance) < 1e-12
    # Only what can cut the length: 2047 tokens over 4 ranks is refused by every layout.
    with pytest.raises(ValueError, match="sequence length 2047 is not a positive multiple of 4"):
        ad.best_layout(dense, 2047, 2, world_size=4)
    with pytest.raises(ValueError, match="layout: 'auto' needs the pattern"):
        ad.chunks_of(2048, 4, 0, "auto")
    # An error of the pattern or the documents is the caller's, said as it is, not taken for a
    # layout that cannot cut the length (once, every layout was passed over and the error blamed
    # the length).
    two_heads = {"attnjit": 1, "branches": [{"segment": "full", "heads": [1]}]}
    with pytest.raises(ValueError, match="head 1") as err:
        ad.best_layout(two_heads, 2048, 1, world_size=4)
    assert "not a positive multiple" not in str(err.value)
    with pytest.raises(ValueError, match="cu_seqlens") as err:
        ad.best_layout(dense, 2048, 2, world_size=4, cu_seqlens=[0, 100, 50, 2048])
    assert "not a positive multiple" not in str(err.value)
    with pytest.raises(ValueError, match=r"world_size \(0\) must be >= 1"):
        ad.best_layout(dense, 2048, 2, world_size=0)


def test_a_layout_that_does_not_cut_the_sequence_exactly_is_refused():
    with pytest.raises(ValueError, match=r"position 8 is held twice"):
        ad.ChunkLayout("mine", 32, (((0, 8), (8, 8)), ((8, 8), (24, 8))))
    with pytest.raises(ValueError, match=r"position 16 is held by no rank"):
        ad.ChunkLayout("mine", 32, (((0, 8), (8, 8)), ((24, 8), (32, 8))))
    with pytest.raises(ValueError, match=r"same number of chunks of one length"):
        ad.ChunkLayout("mine", 32, (((0, 8), (8, 16)), ((24, 8),)))
    lay = ad.balanced_layout(CASES["causal"][0], 64, 2, world_size=4)
    with pytest.raises(ValueError, match=r"made for 64 rows over 4 ranks, not 128 over 4"):
        ad.chunks_of(128, 4, 0, lay)
    with pytest.raises(ValueError, match=r"not a positive multiple of 12 .*balanced layout: 4 ranks x 3 chunks"):
        ad.balanced_layout(CASES["causal"][0], 64, 2, world_size=4, chunks_per_rank=3)


def test_heavy_runs_join_close_rows_stay_inside_chunks_and_give_up_when_scattered():
    pairs = np.ones(64)
    pairs[[0, 1, 5, 40, 63]] = 100  # the mean is 8.7: 4 times it is 34.9
    halves = [[(0, 32)], [(32, 32)]]
    assert ad.heavy_runs(pairs, halves, gap=8) == [[(0, 0, 6)], [(0, 40, 1), (0, 63, 1)]]
    assert ad.heavy_runs(pairs, halves, gap=32) == [[(0, 0, 6)], [(0, 40, 24)]]
    assert ad.heavy_runs(pairs, halves, gap=8, most=1) == [[], []]  # rank 1 has two runs: none anywhere
    assert ad.heavy_runs(pairs, halves, factor=None) == [[], []]
    assert ad.heavy_runs(pairs, halves, factor=20) == [[], []]  # 100 is under 20 x 8.7
    assert ad.heavy_runs(np.zeros(64), halves) == [[], []]
    # Never across a chunk's edge, even where the chunks are neighbours in the sequence.
    edge = np.ones(64)
    edge[[14, 15, 16]] = 100
    zigzag = [[(0, 16), (48, 16)], [(16, 16), (32, 16)]]
    assert ad.heavy_runs(edge, zigzag) == [[(0, 14, 2)], [(0, 16, 1)]]
    # The comm plan cuts the chunks into home and away pieces at those runs (local start, length, global start).
    plan = ad.CommPlan(attnjit.Pattern.from_json(GLOBAL_ROWS).op_spec, SEQ, 2, 2, 2, "zigzag")
    assert plan.away == [[(0, 32, 0)], []]
    assert plan.home == [[(32, 96, 32), (128, 128, 384)], [(0, 128, 128), (128, 128, 256)]]
    assert ad.CommPlan(plan.spec, SEQ, 2, 2, 2, "zigzag", None).home == [[(0, 128, 0), (128, 128, 384)],
                                                                      [(0, 128, 128), (128, 128, 256)]]
    text = str(plan)
    assert "; heavy rows, computed where their keys are: rank 0 [0, 32) (64 (row, query head) units sent out)" in text


def test_the_comm_plan_prints_the_balanced_assignment_and_each_ranks_pairs():
    spec, hq, hkv = CASES["sliding window"]
    lay = ad.balanced_layout(spec, SEQ, hq, hkv, world_size=4, chunks_per_rank=4)
    text = str(ad.comm_plan(spec, SEQ, hq, hkv, world_size=4, layout=lay))
    assert text.startswith("; comm plan: 512 rows over 4 ranks (balanced:4), heads 2/2\n")
    assert "; attended pairs per rank: r0 " in text and "(imbalance " in text
