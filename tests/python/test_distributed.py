"""attnjit.distributed on CPUs: ring attention over gloo with 2 and 4 processes equals
single-process attention on the whole sequence, forward and backward, for both layouts; the
pattern decides what moves (the bytes each rank sends are counted); bad input is refused clearly."""
import datetime
import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attnjit
import attnjit.distributed as ad
from conftest import CASES, GLOBAL_ROWS, HEAD_DIM, LONGNET, SEQ, ring_inputs

def _init(rank, world, store, device="cpu"):
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)


def _check_sequence_parallel_module(at, **parallel):
    """attnjit.nn in sequence-parallel mode (zigzag; `parallel` passed on to sequence_parallel): the
    local output and, summed over ranks, the weights' gradients equal the module's on the whole
    sequence, and so does the output with packed documents whose boundaries fall inside the ranks'
    chunks. Returns the module's input."""
    torch.manual_seed(1)
    layer = attnjit.nn.MultiheadDilatedAttention(32, 4, [64, 256, 512], [1, 2, 4], num_kv_heads=2).to(at)
    x = torch.randn(2, SEQ, 32, generator=torch.Generator().manual_seed(3)).to(at)
    out, _ = layer(x, x, x)
    out.square().sum().backward()
    full_grads = [w.grad.clone() for w in layer.parameters()]
    layer.zero_grad()
    out_docs, _ = layer(x[:1], x[:1], x[:1], cu_seqlens=DOCS)
    layer.sequence_parallel(layout="zigzag", **parallel)
    x_l = ad.shard(x, layout="zigzag")
    out_l, _ = layer(x_l, x_l, x_l)
    torch.testing.assert_close(out_l, ad.shard(out.detach(), layout="zigzag"), atol=1e-5, rtol=1e-5)
    out_l.square().sum().backward()
    for w, want in zip(layer.parameters(), full_grads):
        dist.all_reduce(w.grad)
        torch.testing.assert_close(w.grad, want, atol=1e-4, rtol=1e-4)
    x_l = ad.shard(x[:1], layout="zigzag")
    out_l, _ = layer(x_l, x_l, x_l, cu_seqlens=DOCS)
    torch.testing.assert_close(out_l, ad.shard(out_docs.detach(), layout="zigzag"), atol=1e-5, rtol=1e-5)
    return x


def _equality_worker(rank, world, store, layouts, device="cpu"):
    _init(rank, world, store, device)
    at = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")
    try:
        for name, (spec, hq, hkv) in CASES.items():
            q, k, v, do = (x.to(at) for x in ring_inputs(hq, hkv))
            # A loss that uses lse too: the gradient through the global lse reaches every chunk.
            dl = torch.randn(2, hq, SEQ, generator=torch.Generator().manual_seed(11)).to(at)
            ref = [x.clone().requires_grad_() for x in (q, k, v)]
            o_ref, lse_ref = attnjit.attention(*ref, spec, return_lse=True)
            torch.autograd.backward((o_ref, lse_ref), (do, dl))
            for layout, strategy in ((layout, strategy) for layout in layouts for strategy in ad.STRATEGIES):
                what = f"{name}, {layout}, {strategy}, world {world}, rank {rank}"
                if layout == "balanced":  # the pattern's own layout: 4 chunks per rank dealt out by work
                    layout = ad.balanced_layout(spec, SEQ, hq, hkv, world_size=world, chunks_per_rank=4)
                local = [ad.shard(x, layout=layout).requires_grad_() for x in (q, k, v)]
                o, lse = ad.ring_attention(*local, spec, layout=layout, return_lse=True, strategy=strategy)
                dl_local = ad.shard(dl.transpose(1, 2), layout=layout).transpose(1, 2)
                torch.autograd.backward((o, lse), (ad.shard(do, layout=layout), dl_local))
                torch.testing.assert_close(o, ad.shard(o_ref.detach(), layout=layout), atol=1e-5, rtol=1e-5, msg=lambda m: f"{what}: o: {m}")
                torch.testing.assert_close(lse, ad.shard(lse_ref.transpose(1, 2), layout=layout).transpose(1, 2), atol=1e-5,
                                           rtol=1e-5, msg=lambda m: f"{what}: lse: {m}")
                for label, got, want in zip("qkv", local, ref):
                    torch.testing.assert_close(got.grad, ad.shard(want.grad, layout=layout), atol=1e-5, rtol=1e-5,
                                               msg=lambda m: f"{what}: d{label}: {m}")
                torch.testing.assert_close(ad.unshard(o.detach(), layout=layout), o_ref.detach(), atol=1e-5, rtol=1e-5)
        x = _check_sequence_parallel_module(at)
        # layout="auto": the module picks the layout that shares its pattern's work out most evenly
        # (a causal window: the first rows attend fewer keys), and sharding with it gives the same.
        window = attnjit.nn.MultiheadDilatedAttention.from_pattern(
            32, 4, {"attnjit": 1, "causal": True, "window": [383, 0], "branches": [{"segment": "full"}]}).to(at)
        out, _ = window(x, x, x)
        window.sequence_parallel(layout="auto")
        lay = window.sequence_layout(SEQ)
        assert isinstance(lay, ad.ChunkLayout) and lay.name.startswith("balanced:"), lay
        x_l = ad.shard(x, layout=lay)
        out_l, _ = window(x_l, x_l, x_l)
        torch.testing.assert_close(out_l, ad.shard(out.detach(), layout=lay), atol=1e-5, rtol=1e-5)
        # bf16 at bf16's precision; the dilated case at head dim 16 moves a quarter of the rows.
        q, k, v, do = (x.to(at) for x in ring_inputs(4, 4, torch.bfloat16))
        o_ref = attnjit.attention(q, k, v, LONGNET)
        o = ad.ring_attention(*(ad.shard(x, layout="zigzag") for x in (q, k, v)), LONGNET, layout="zigzag")
        torch.testing.assert_close(o.float(), ad.shard(o_ref, layout="zigzag").float(), atol=2e-2, rtol=2e-2)
    finally:
        dist.destroy_process_group()


def _spawn(worker, world, tmp_path, *args):
    mp.spawn(worker, args=(world, str(tmp_path / "store")) + args, nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_equals_attention_on_the_whole_sequence(world, tmp_path):
    _spawn(_equality_worker, world, tmp_path, ("contiguous", "zigzag", "balanced"))


def _mutation_worker(rank, world, store, out):
    """The ring with one piece broken on every rank: the equality check (O and the gradients) must
    see each."""
    _init(rank, world, store)
    try:
        q, k, v, do = ring_inputs(4, 4)
        ref = [x.clone().requires_grad_() for x in (q, k, v)]
        o_ref = attnjit.attention(*ref, LONGNET)
        o_ref.backward(do)
        want = ad.shard(o_ref.detach(), layout="zigzag")
        merge, pair, add = ad._merge, ad.CommPlan.pair, ad.backward_add
        calls = []

        def every_other_backward_step(*args):  # every other chunk pair's gradients left out
            calls.append(1)
            if len(calls) % 2:
                add(*args)

        def skip_later_merges(*args, fresh=False):  # only the first merge into each chunk
            if fresh:
                merge(*args, fresh=fresh)

        def drop(what):
            def mutated(self, qr, kr):
                got = pair(self, qr, kr)
                if got is None:
                    return None
                pairs, need, queries = got
                if what == "key rows":  # every other key row a rank reads of another is not sent
                    need = need.copy()
                    if qr != kr:
                        need[:, ::2] = False
                    return pairs, need, queries
                first = pairs[0]  # the first chunk pair merges half its query rows
                rows = np.ones((self.home[qr][first[0]][1], self.heads_q), dtype=bool) if queries[first] is None \
                    else queries[first].copy()
                rows[::2] = False
                return pairs, need, {**queries, first: rows}
            return mutated

        visit = ad.CommPlan.visit

        def visit_dropped(self, qr, kr):  # the heavy rows skip the last key chunk they attend on another rank
            got = visit(self, qr, kr)
            return got[:-1] if qr != kr else got

        # The heavy rows (the global block's) computed where their keys are: a visit left out is seen.
        q_g, k_g, v_g, do_g = ring_inputs(2, 2)
        ref_g = [x.clone().requires_grad_() for x in (q_g, k_g, v_g)]
        o_g = attnjit.attention(*ref_g, GLOBAL_ROWS)
        o_g.backward(do_g)
        errors = {}
        for name, replacement in (("none, heavy rows", visit), ("a visit dropped", visit_dropped)):
            ad.CommPlan.visit = replacement
            ad._cached_plan.cache_clear()
            try:
                local = [ad.shard(x).requires_grad_() for x in (q_g, k_g, v_g)]
                o = ad.ring_attention(*local, GLOBAL_ROWS)
                o.backward(ad.shard(do_g))
                errors[name] = max([float((o - ad.shard(o_g.detach())).abs().max())] +
                                   [float((x.grad - ad.shard(r.grad)).abs().max()) for x, r in zip(local, ref_g)])
            finally:
                ad.CommPlan.visit = visit
                ad._cached_plan.cache_clear()
        # NaN stays NaN: a NaN in one global row's Q gives that row NaN (from every rank that
        # computes it) and no other; in bf16 the heavy rows agree at bf16's precision.
        q_nan = q_g.clone()
        q_nan[0, 3, 1, 0] = float("nan")
        o = ad.ring_attention(*(ad.shard(x) for x in (q_nan, k_g, v_g)), GLOBAL_ROWS)
        if rank == 0:
            errors["nan row"] = bool(o[0, 3, 1].isnan().all())
            o[0, 3, 1] = 0
        errors["other rows finite"] = bool(o.isfinite().all())
        bf = [x.bfloat16() for x in (q_g, k_g, v_g)]
        o = ad.ring_attention(*(ad.shard(x) for x in bf), GLOBAL_ROWS)
        errors["bf16"] = float((o.float() - ad.shard(attnjit.attention(*bf, GLOBAL_ROWS)).float()).abs().max())
        for name, target, replacement in (("none", None, None), ("a merge dropped", "_merge", skip_later_merges),
                                          ("key rows not sent", "pair", drop("key rows")),
                                          ("query rows not merged", "pair", drop("query rows")),
                                          ("a backward step dropped", "backward_add", every_other_backward_step)):
            if target == "_merge":
                ad._merge = replacement
            elif target == "pair":
                ad.CommPlan.pair = replacement
            elif target == "backward_add":
                ad.backward_add = replacement
            ad._cached_plan.cache_clear()
            try:
                local = [ad.shard(x, layout="zigzag").requires_grad_() for x in (q, k, v)]
                o = ad.ring_attention(*local, LONGNET, layout="zigzag")
                o.backward(ad.shard(do, layout="zigzag"))
                errors[name] = max([float((o - want).abs().max())] +
                                   [float((x.grad - ad.shard(r.grad, layout="zigzag")).abs().max()) for x, r in zip(local, ref)])
            finally:
                ad._merge, ad.CommPlan.pair, ad.backward_add = merge, pair, add
                ad._cached_plan.cache_clear()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(errors, f)
    finally:
        dist.destroy_process_group()


def test_a_dropped_merge_a_row_left_out_a_dropped_backward_step_or_visit_fails_the_equality_check(tmp_path):
    world = 2
    _spawn(_mutation_worker, world, tmp_path, str(tmp_path))
    errors = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]
    for name in ("a merge dropped", "key rows not sent", "query rows not merged", "a backward step dropped",
                 "a visit dropped"):
        assert max(e[name] for e in errors) > 1e-2, (name, errors)  # caught on some rank
    assert max(e["none"] for e in errors) < 1e-5, errors
    assert max(e["none, heavy rows"] for e in errors) < 1e-5, errors
    assert errors[0]["nan row"] and all(e["other rows finite"] for e in errors), errors
    assert max(e["bf16"] for e in errors) < 2e-2, errors


# Packed documents over the whole sequence: a document inside one rank's chunk, documents across
# two and three ranks' chunks (and zigzag's chunk edges), and an empty one.
DOCS = [0, 40, 200, 200, 451, 512]


def _documents_worker(rank, world, store, out):
    _init(rank, world, store)
    errors = {}
    try:
        for name in ("causal", "sliding window", "longnet", "block-sparse local+global"):
            spec, hq, hkv = CASES[name]
            q, k, v, do = (x[:1] for x in ring_inputs(hq, hkv))
            dl = torch.randn(1, hq, SEQ, generator=torch.Generator().manual_seed(12))
            ref = [x.clone().requires_grad_() for x in (q, k, v)]
            o_ref, lse_ref = attnjit.attention(*ref, spec, cu_seqlens=DOCS, return_lse=True)
            torch.autograd.backward((o_ref, lse_ref), (do, dl))
            balanced = ad.balanced_layout(spec, SEQ, hq, hkv, world_size=world, chunks_per_rank=4, cu_seqlens=DOCS)
            for layout, strategy in (("contiguous", "ring"), ("zigzag", "ring"), ("zigzag", "longnet"), (balanced, "ring")):
                local = [ad.shard(x, layout=layout).requires_grad_() for x in (q, k, v)]
                o, lse = ad.ring_attention(*local, spec, layout=layout, strategy=strategy, cu_seqlens=torch.tensor(DOCS),
                                           return_lse=True)
                torch.autograd.backward((o, lse), (ad.shard(do, layout=layout),
                                                   ad.shard(dl.transpose(1, 2), layout=layout).transpose(1, 2)))
                got = [o.detach(), lse.detach().transpose(1, 2)] + [x.grad for x in local]
                want = [o_ref.detach(), lse_ref.transpose(1, 2)] + [x.grad for x in ref]
                errors[f"{name} {layout} {strategy}"] = max(float((g - ad.shard(w, layout=layout)).abs().max())
                                                            for g, w in zip(got, want))
        # Without the documents the same call is another attention: the check can fail.
        spec, hq, hkv = CASES["causal"]
        q, k, v, _ = (x[:1] for x in ring_inputs(hq, hkv))
        o = ad.ring_attention(*(ad.shard(x) for x in (q, k, v)), spec)
        errors["documents left out"] = float((o - ad.shard(attnjit.attention(q, k, v, spec, cu_seqlens=DOCS))).abs().max())
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(errors, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_with_packed_documents_equals_attention_with_them(world, tmp_path):
    _spawn(_documents_worker, world, tmp_path, str(tmp_path))
    errors = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]
    for name in errors[0]:
        if name != "documents left out":
            assert max(e[name] for e in errors) < 1e-5, (name, errors)
    assert max(e["documents left out"] for e in errors) > 1e-2
    # A rank reads only the K/V of documents it holds rows of (causal, contiguous, 4 ranks of 128):
    # rank 1's rows of [40, 200) read rank 0's 40..127; [200, 451) starts in rank 1, so rank 2
    # reads its 56 rows there and rank 3 those and rank 2's 128; [451, 512) is rank 3's alone;
    # rank 0 reads nothing (2 kv heads).
    plan = ad.comm_plan(CASES["causal"][0], SEQ, 2, 2, world_size=4, cu_seqlens=DOCS)
    assert plan.home[1] == [(0, 72, 128), (72, 56, 200)] and plan.home[3] == [(0, 67, 384), (67, 61, 451)]
    assert {k: int(v.sum()) for k, v in plan.rows.items() if k[0] != k[1]} == {(1, 0): 2 * 88, (2, 1): 2 * 56,
                                                                               (3, 1): 2 * 56, (3, 2): 2 * 128}
    assert plan.call(3, 1, 3, 0) == (67, 61, 0, 67, 61, 0)  # positions from the document's start
    causal = attnjit.Pattern.from_json(CASES["causal"][0])
    assert sum(plan.work()) == sum(causal.stats(b - a, 2)["attended_pairs"] for a, b in zip(DOCS, DOCS[1:]) if b > a)
    # The layouts weigh chunks within their documents: causal documents of 400 and 112 rows leave
    # the busiest rank 1.9x the mean under contiguous chunks and 1.5x under zigzag; best_layout
    # deals 32-row chunks out within 3%, and each rank's weight is what the comm plan computes there.
    docs = [0, 400, 512]
    for layout, most in (("contiguous", 1.85), ("zigzag", 1.5)):
        work = ad.comm_plan(causal, SEQ, 2, 2, world_size=4, layout=layout, cu_seqlens=docs).work()
        assert max(work) / (sum(work) / 4) > most, (layout, work)
    best = ad.best_layout(causal, SEQ, 2, 2, world_size=4, cu_seqlens=docs)
    assert isinstance(best, ad.ChunkLayout) and best.imbalance < 0.03, best
    assert list(best.work) == ad.comm_plan(causal, SEQ, 2, 2, world_size=4, layout=best, cu_seqlens=docs).work()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
                    reason="needs 2 or more CUDA GPUs and NCCL")
def test_ring_attention_on_gpus_with_nccl(tmp_path):
    _spawn(_equality_worker, 2, tmp_path, ("contiguous", "zigzag"), "cuda")


# Patterns whose heads differ (LongNet's offsets, random blocks hashed per head, per-head lists,
# heads no branch takes), so a rank that computed the wrong heads' pattern would fail the check.
HEAD_PARALLEL_CASES = {
    "longnet": (LONGNET, 4, 4, {}),
    "longnet-gqa": (LONGNET, 4, 2, {}),
    "bigbird": ({"attnjit": 1, "layout": {"block": 16, "union": [{"local": 1}, {"global": [0]},
                                                                 {"random": {"density": 0.2, "seed": 5}}]},
                 "branches": [{"segment": "full"}]}, 4, 4, {}),
    "head_groups": ({"attnjit": 1, "combine": "head_groups", "group_scale": "none",
                     "branches": [{"segment": 128, "dilation": 1}, {"segment": 512, "dilation": 2}]}, 4, 4, {}),
    "documents": ({"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}, 4, 4, {"cu_seqlens": DOCS}),
    "per-head blocks": ({"attnjit": 1, "branches": [{"segment": "full", "layout": {"block": 64, "explicit": {"per_head": [
        [[0, 0], [3, 1], [7, 7]], [[1, 1], [5, 0]], [[2, 6], [6, 6]], [[4, 4], [7, 0]]]}}}]}, 4, 4, {}),
    # Heads 2 and 3 take part in no branch: a head group's slice of them attends nothing (O = 0).
    "some heads": ({"attnjit": 1, "branches": [{"segment": 128, "heads": [0, 1]}]}, 4, 4, {}),
}


def _head_parallel_worker(rank, world, store):
    _init(rank, world, store)
    try:
        for name, (spec, hq, hkv, extra) in HEAD_PARALLEL_CASES.items():
            q, k, v, do = ring_inputs(hq, hkv)
            if "cu_seqlens" in extra:
                q, k, v, do = (x[:1] for x in (q, k, v, do))
            dl = torch.randn(q.shape[0], hq, SEQ, generator=torch.Generator().manual_seed(11))
            ref = [x.clone().requires_grad_() for x in (q, k, v)]
            o_ref, lse_ref = attnjit.attention(*ref, spec, return_lse=True, **extra)
            torch.autograd.backward((o_ref, lse_ref), (do, dl))
            for u, layout in ((2, "contiguous"), (2, "zigzag"), (4, "zigzag"), (2, "balanced")):
                if hkv % u:
                    continue
                what = f"{name}, head_parallel {u}, {layout}, world {world}, rank {rank}"
                if layout == "balanced":
                    layout = ad.balanced_layout(spec, SEQ, hq, hkv, world_size=world, chunks_per_rank=2,
                                                cu_seqlens=extra.get("cu_seqlens"))
                ad.reset_traffic()
                local = [ad.shard(x, layout=layout).requires_grad_() for x in (q, k, v)]
                o, lse = ad.ring_attention(*local, spec, layout=layout, return_lse=True, head_parallel=u, **extra)
                dl_local = ad.shard(dl.transpose(1, 2), layout=layout).transpose(1, 2)
                torch.autograd.backward((o, lse), (ad.shard(do, layout=layout), dl_local))
                torch.testing.assert_close(o, ad.shard(o_ref.detach(), layout=layout), atol=1e-5, rtol=1e-5,
                                           msg=lambda m: f"{what}: o: {m}")
                torch.testing.assert_close(lse, ad.shard(lse_ref.detach().transpose(1, 2), layout=layout).transpose(1, 2),
                                           atol=1e-5, rtol=1e-5, msg=lambda m: f"{what}: lse: {m}")
                for label, got, want in zip("qkv", local, ref):
                    torch.testing.assert_close(got.grad, ad.shard(want.grad, layout=layout), atol=1e-5, rtol=1e-5,
                                               msg=lambda m: f"{what}: d{label}: {m}")
                # q, k, v in and o, lse out, forward; their gradients the other way, backward: (u - 1) / u of each.
                assert ad.traffic()["head_bytes"] > 0, what
        _check_sequence_parallel_module(torch.device("cpu"), head_parallel=2)
        # Over a group other than the world: two groups of 2 ranks, each a head group (a ring of one).
        pairs, _ = dist.new_subgroups(2)
        q, k, v, _ = ring_inputs(4, 4)
        o_ref = attnjit.attention(q, k, v, LONGNET)
        o = ad.ring_attention(*(ad.shard(x, group=pairs) for x in (q, k, v)), LONGNET, group=pairs, head_parallel=2)
        torch.testing.assert_close(o, ad.shard(o_ref, group=pairs), atol=1e-5, rtol=1e-5)
        q, k, v, _ = ring_inputs(4, 4)
        local = [ad.shard(x) for x in (q, k, v)]
        with pytest.raises(ValueError, match="head_parallel: expected a divisor of the world size 4, got 3"):
            ad.ring_attention(*local, LONGNET, head_parallel=3)
        with pytest.raises(ValueError, match=r"head_parallel: 4 must divide the query heads \(4\) and the key/value heads \(2\)"):
            ad.ring_attention(local[0], local[1][:, :, :2], local[2][:, :, :2], LONGNET, head_parallel=4)
        with pytest.raises(attnjit.AttnjitError, match="group_scale"):  # head_groups' mean scale: no slice can say it
            ad.ring_attention(*local, CASES["head_groups"][0], head_parallel=2)
        with pytest.raises(ValueError, match="head_parallel: expected a positive int"):
            ad.ring_attention(*local, LONGNET, head_parallel=True)
        with pytest.raises(attnjit.AttnjitError, match=r"heads: head 7 is out of range|head 7"):  # the whole call's check
            ad.ring_attention(*local, {"attnjit": 1, "branches": [{"segment": 64, "heads": [0, 7]}]}, head_parallel=2)
    finally:
        dist.destroy_process_group()


def test_head_parallel_ring_attention_equals_attention_on_the_whole_sequence(tmp_path):
    _spawn(_head_parallel_worker, 4, tmp_path)


def _layouts_strides_and_nan_worker(rank, world, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # a hang fails the test, not the suite
    try:
        spec = CASES["sliding window"][0]  # rank 1 reads part of rank 0's chunk: the staged K/V path
        q, k, v, do = ring_inputs(2, 2)
        ref = [x.clone().requires_grad_() for x in (q, k, v)]
        o_ref = attnjit.attention(*ref, spec)
        o_ref.backward(do)
        # K and V laid out [B, H, S, D] in memory (stride(3) is still 1): once the staged copy of
        # the rows received took their strides, was not written, and rank 1 read zeros.
        local = [ad.shard(x).transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in (q, k, v)]
        o = ad.ring_attention(*local, spec)
        o.backward(ad.shard(do))
        torch.testing.assert_close(o, ad.shard(o_ref.detach()), atol=1e-5, rtol=1e-5)
        for name, got, want in zip("qkv", local, ref):
            torch.testing.assert_close(got.grad, ad.shard(want.grad), atol=1e-5, rtol=1e-5, msg=lambda m: f"d{name}: {m}")
        # A NaN in rank 0's K reaches rank 1's rows by a merge: their O and LSE are NaN and so are
        # the gradients it reaches, as on the whole sequence (once the merge made the LSE -inf, a
        # row that attends nothing, and the backward dropped it).
        causal = CASES["causal"][0]
        k_nan = k.clone()
        k_nan[0, 100, 0, 3] = float("nan")
        ref = [x.clone().requires_grad_() for x in (q, k_nan, v)]
        o_ref, lse_ref = attnjit.attention(*ref, causal, return_lse=True)
        o_ref.backward(do)
        local = [ad.shard(x).requires_grad_() for x in (q, k_nan, v)]
        o, lse = ad.ring_attention(*local, causal, return_lse=True)
        o.backward(ad.shard(do))
        want_lse = ad.shard(lse_ref.detach().transpose(1, 2)).transpose(1, 2)
        assert torch.equal(lse.isnan(), want_lse.isnan()) and torch.equal(o.isnan(), ad.shard(o_ref.detach()).isnan())
        for name, got, want in zip("qkv", local, ref):
            assert torch.equal(got.grad.isnan(), ad.shard(want.grad).isnan()), name
        out[f"nan rows {rank}"] = int(lse.isnan().sum())
        # One rank's arguments fail its checks: every rank stops with an error, none waits.
        q, k, v, _ = (x[:1] for x in ring_inputs(2, 2))
        local = [ad.shard(x) for x in (q, k, v)]
        docs = [0, 100, 512] if rank == 0 else [0, 300, 200, 512]
        with pytest.raises(ValueError) as err:
            ad.ring_attention(*local, causal, cu_seqlens=docs)
        out[f"docs {rank}"] = str(err.value)
        with pytest.raises(ValueError) as err:  # a shard one row short on rank 1
            ad.ring_attention(*(x[:, :255] if rank == 1 else x for x in local), causal, layout="contiguous")
        out[f"rows {rank}"] = str(err.value)
        # Ranks that call differently after each has called both ways: caught with PyTorch's
        # switch for checking collectives.
        for s in (0.25, 0.5):
            ad.ring_attention(*local, causal, scale=s)
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        with pytest.raises(ValueError) as err:
            ad.ring_attention(*local, causal, scale=0.25 if rank == 0 else 0.5)
        out[f"scale {rank}"] = str(err.value)
        del os.environ["TORCH_DISTRIBUTED_DEBUG"]
    finally:
        dist.destroy_process_group()


def test_strided_kv_nan_and_one_rank_s_bad_arguments(tmp_path):
    out = mp.Manager().dict()
    _spawn(_layouts_strides_and_nan_worker, 2, tmp_path, out)
    # Batch 0, head 0: rank 0's rows from 100 on attend the NaN key in its own chunk, all of rank 1's
    # through a merge.
    assert out["nan rows 0"] == 156 and out["nan rows 1"] == 256
    assert "cu_seqlens: expected non-decreasing" in out["docs 1"]
    assert "rank 1 refused the call (ValueError: cu_seqlens: expected non-decreasing" in out["docs 0"]
    for r in (0, 1):
        assert "the ranks called with different arguments" in out[f"rows {r}"] and "255" in out[f"rows {r}"]
        assert "the ranks called with different arguments" in out[f"scale {r}"]


def _traffic_worker(rank, world, store, out):
    _init(rank, world, store)
    try:
        sent = {}
        for (name, (spec, hq, hkv)), strategy in ((c, s) for c in TRAFFIC_CASES.items() for s in ad.STRATEGIES):
            q, k, v, do = ring_inputs(hq, hkv)
            local = [ad.shard(x).requires_grad_() for x in (q, k, v)]
            ad.reset_traffic()
            o = ad.ring_attention(*local, spec, strategy=strategy)
            forward = ad.traffic()
            ad.reset_traffic()
            o.backward(ad.shard(do))
            backward = ad.traffic()
            sent[f"{name} {strategy}"] = {"forward": forward, "backward": backward,
                                          "total": {x: forward[x] + backward[x] for x in forward}}
        # The global rows kept on their rank instead: rank 0 reads every key row for them.
        q, k, v, do = ring_inputs(2, 2)
        local = [ad.shard(x).requires_grad_() for x in (q, k, v)]
        ad.reset_traffic()
        ad.ring_attention(*local, GLOBAL_ROWS, heavy_rows=None).backward(ad.shard(do))
        sent["global at home"] = ad.traffic()
        # Ranks that disagree all get the same clear error instead of a hang.
        q, k, v, _ = ring_inputs(2, 2)
        try:
            ad.ring_attention(*(ad.shard(x) for x in (q, k, v)), LONGNET, strategy="ring" if rank else "longnet")
            sent["disagreement"] = "no error"
        except ValueError as e:
            sent["disagreement"] = str(e)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(sent, f)
    finally:
        dist.destroy_process_group()


TRAFFIC_CASES = {
    "window": ({"attnjit": 1, "causal": True, "window": [31, 0], "branches": [{"segment": "full"}]}, 2, 2),
    "dilated": ({"attnjit": 1, "branches": [{"segment": "full", "dilation": 4}]}, 4, 4),
    "dense": ({"attnjit": 1, "branches": [{"segment": "full"}]}, 2, 2),
    "global": (GLOBAL_ROWS, 2, 2),
}


def test_the_pattern_decides_what_each_rank_sends(tmp_path):
    world = 4
    _spawn(_traffic_worker, world, tmp_path, str(tmp_path))
    sent = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]
    local, row_bytes = SEQ // world, 2 * 2 * HEAD_DIM * 4  # batch 2, K and V, fp32
    for name, (spec, hq, hkv) in TRAFFIC_CASES.items():
        plan = ad.comm_plan(spec, SEQ, hq, hkv, world_size=world)
        for r, strategy in ((r, s) for r in range(world) for s in ad.STRATEGIES):
            want = sum(int(plan.rows[(dst, r)].sum()) for dst in range(world) if dst != r and (dst, r) in plan.rows)
            got = sent[r][f"{name} {strategy}"]
            assert got["forward"]["kv_bytes"] == want * row_bytes, (name, strategy, r)
            # The backward sends the K/V rows again, and their dK/dV (fp32, as many bytes) back.
            assert got["total"]["kv_bytes"] == 2 * want * row_bytes, (name, strategy, r)
            assert got["total"]["grad_bytes"] == sum(
                int(plan.rows[(r, src)].sum()) for src in range(world) if src != r and (r, src) in plan.rows) * row_bytes
    ring = world * (world - 1) * local  # (row, kv head) units per kv head a plain ring moves
    window = ad.comm_plan(TRAFFIC_CASES["window"][0], SEQ, 2, 2, world_size=world)
    # A 32-token causal window: only the previous rank, only its last 31 rows; rank 3 sends nothing.
    assert sorted(k for k in window.rows if k[0] != k[1]) == [(1, 0), (2, 1), (3, 2)]
    assert sent[3]["window ring"]["total"]["kv_bytes"] == 0
    # The forward starts as many steps' transfers ahead as fit in the local K/V's bytes: one where
    # each step moves whole chunks, more where the pattern moves a few rows, all three for the window.
    for r in range(world):
        assert sent[r]["dense ring"]["forward"]["steps_in_flight"] == 1
        assert sent[r]["dilated ring"]["forward"]["steps_in_flight"] == 2  # a quarter sent, a quarter received
        assert sent[r]["window ring"]["forward"]["steps_in_flight"] == world - 1
        assert sent[r]["window longnet"]["forward"]["steps_in_flight"] == 0  # one collective, no steps
        # The backward: a number of steps every rank shares, the least that fits every rank's bytes
        # at its largest step (the window: rank 1 sends 31 rows and receives 31, of 128).
        assert sent[r]["dense ring"]["backward"]["steps_in_flight"] == 1
        assert sent[r]["dilated ring"]["backward"]["steps_in_flight"] == 2
        assert sent[r]["window ring"]["backward"]["steps_in_flight"] == 2
    for r in range(world):
        assert "the ranks called with different arguments" in sent[r]["disagreement"], sent[r]["disagreement"]
        assert "rank 0: " in sent[r]["disagreement"] and "'longnet', 1)" in sent[r]["disagreement"]
    for r in (1, 2, 3):
        assert window.rows[(r, r - 1)][:, -31:].all() and not window.rows[(r, r - 1)][:, :-31].any()
    assert window.moved_rows() == 3 * 2 * 31  # of the ring's 3072: 6%
    # Dilation 4 with head offsets h mod 4: each head's quarter of the rows.
    dilated = ad.comm_plan(TRAFFIC_CASES["dilated"][0], SEQ, 4, 4, world_size=world)
    assert dilated.moved_rows() == ring * 4 // 4  # a quarter of the 4 kv heads' rows
    dense = ad.comm_plan(TRAFFIC_CASES["dense"][0], SEQ, 2, 2, world_size=world)
    assert dense.moved_rows() == ring * 2
    assert sum(s["dilated ring"]["forward"]["kv_bytes"] for s in sent) * 4 == sum(s["dense ring"]["forward"]["kv_bytes"] for s in sent) * 2
    # The global block's rows [0, 32) go out as Q to the three other ranks (batch 2, 2 heads, fp32)
    # and come back as partial O and LSE; in the backward Q, dO, LSE and D go out and dQ comes back.
    glob = ad.comm_plan(GLOBAL_ROWS, SEQ, 2, 2, world_size=world)
    assert glob.away == [[(0, 32, 0)], [], [], []] and glob.home[0] == [(32, 96, 32)]
    unit = 2 * 2 * 4  # batch x heads x fp32
    assert [s["global ring"]["forward"]["query_bytes"] for s in sent] == \
        [3 * 32 * unit * HEAD_DIM] + [32 * unit * (HEAD_DIM + 1)] * 3
    assert [s["global ring"]["backward"]["query_bytes"] for s in sent] == \
        [3 * 32 * unit * (2 * HEAD_DIM + 2)] + [32 * unit * HEAD_DIM] * 3
    # Rank 0 no longer reads every row of the other ranks (3 x 128 per kv head) for them: the K/V
    # moved falls from 1120 (row, kv head) units to 384, the window's edges and the global keys.
    at_home = ad.comm_plan(GLOBAL_ROWS, SEQ, 2, 2, world_size=world, heavy_rows=None)
    assert not at_home.has_away and (at_home.moved_rows(), glob.moved_rows()) == (1120, 384)
    assert sum(s["global at home"]["kv_bytes"] for s in sent) == 2 * 1120 * row_bytes  # forward and backward
    assert sum(s["global ring"]["total"]["kv_bytes"] for s in sent) == 2 * 384 * row_bytes
    # ... and the work is shared out: rank 0 computed 1.75x the mean of the pairs, now within 6%.
    for plan, low, high in ((at_home, 1.7, 1.8), (glob, 1.0, 1.06)):
        work = plan.work()
        assert sum(work) == attnjit.Pattern.from_json(GLOBAL_ROWS).stats(SEQ, 2)["attended_pairs"]
        assert low <= max(work) / (sum(work) / world) < high, (plan.heavy_rows, work)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_is_plain_attention(one_rank):
    q, k, v, do = ring_inputs(4, 2)
    mine, ref = [x.clone().requires_grad_() for x in (q, k, v)], [x.clone().requires_grad_() for x in (q, k, v)]
    o, lse = ad.ring_attention(*mine, LONGNET, return_lse=True)
    o_ref, lse_ref = attnjit.attention(*ref, LONGNET, return_lse=True)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(lse, lse_ref)
    o.backward(do)
    o_ref.backward(do)
    for got, want in zip(mine, ref):
        torch.testing.assert_close(got.grad, want.grad)
    # Through lse alone, as a loss that merges partial results would use it.
    for x in mine + ref:
        x.grad = None
    _, lse = ad.ring_attention(*mine, LONGNET, return_lse=True)
    _, lse_ref = attnjit.attention(*ref, LONGNET, return_lse=True)
    lse.square().sum().backward()
    lse_ref.square().sum().backward()
    for name, got, want in zip("qkv", mine, ref):
        assert (got.grad.abs().max() > 0) == (name != "v")  # lse does not depend on v
        torch.testing.assert_close(got.grad, want.grad)


def test_bad_input_is_refused_naming_what_is_wrong(one_rank):
    q, k, v, _ = ring_inputs(4, 2)
    with pytest.raises(ValueError, match="q, k: local sequence lengths differ"):
        ad.ring_attention(q, k[:, :256], v[:, :256], LONGNET)
    with pytest.raises(TypeError, match="expected one dtype of float32, float16, bfloat16"):
        ad.ring_attention(q.double(), k.double(), v.double(), LONGNET)
    with pytest.raises(ValueError, match="q: expected a \\[batch, seq, heads, head_dim\\] tensor"):
        ad.ring_attention(q[0], k, v, LONGNET)
    with pytest.raises(ValueError, match="layout: expected one of"):
        ad.ring_attention(q, k, v, LONGNET, layout="striped")
    with pytest.raises(ValueError, match="strategy: expected one of ring, longnet, got 'allgather'"):
        ad.ring_attention(q, k, v, LONGNET, strategy="allgather")
    for bad in (0.5, "4", -1):
        with pytest.raises(ValueError, match=r"heavy_rows: expected a number >= 1 .* or None \(every row at home\)"):
            ad.ring_attention(q, k, v, LONGNET, heavy_rows=bad)
    with pytest.raises(ValueError, match=r"layout: expected one of contiguous, zigzag or a ChunkLayout \(balanced_layout\), got 'striped'"):
        attnjit.nn.DilatedAttention([64], [1]).sequence_parallel(layout="striped")
    with pytest.raises(ValueError, match="strategy: expected one of ring, longnet"):
        attnjit.nn.MultiheadDilatedAttention(32, 4, [64], [1]).sequence_parallel(strategy="tree")
    with pytest.raises(attnjit.PatternError):
        ad.ring_attention(q, k, v, {"attnjit": 1, "branches": [{"segment": 64, "dilation": 0}]})
    with pytest.raises(ValueError, match="cu_seqlens: packed documents need batch 1"):
        ad.ring_attention(q, k, v, LONGNET, cu_seqlens=[0, 100, 512])
    with pytest.raises(ValueError, match=r"cu_seqlens: expected non-decreasing boundaries from 0 to the whole sequence's length 512"):
        ad.ring_attention(q[:1], k[:1], v[:1], LONGNET, cu_seqlens=[0, 100, 500])
    with pytest.raises(ValueError, match="cu_seqlens: expected non-decreasing"):
        ad.ring_attention(q[:1], k[:1], v[:1], LONGNET, cu_seqlens=[0, 300, 200, 512])
    with pytest.raises(TypeError, match="cu_seqlens"):
        ad.ring_attention(q[:1], k[:1], v[:1], LONGNET, cu_seqlens=[0.0, 512.0])
    dyn = {"attnjit": 1, "layout": {"block": 16, "dynamic": True}, "branches": [{"segment": "full"}]}
    with pytest.raises(ValueError, match="dynamic layout is not supported by ring_attention"):
        ad.ring_attention(q, k, v, dyn)


def test_without_torch_distributed_the_error_says_what_to_call():
    assert not dist.is_initialized()
    q, k, v, _ = ring_inputs(2, 2)
    with pytest.raises(RuntimeError, match="call torch.distributed.init_process_group first"):
        ad.ring_attention(q, k, v, LONGNET)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ad.shard(q)
