"""A model on paper of attnjit.distributed on 8 to 64 H100s (docs/scaling.md): per-step compute
time against transfer time, and the efficiency of the ring, for dense causal attention, packed
causal documents, LongNet and BigBird at 1M to 16M tokens, with head parallelism (ring_attention's
head_parallel = u: an all_to_all inside groups of u GPUs of a node, a ring over W / u ranks, each on
H / u heads and u ranks' rows) at the u in 1, 2, 4, 8 that the model finds fastest.

    PYTHONPATH=build/python python3 bench/scaling_model.py            # the tables of docs/scaling.md
    PYTHONPATH=build/python python3 bench/scaling_model.py --check    # the model against comm plans

The model counts, for every (query rank, key rank), the attended pairs and the K/V rows the
query rank reads, by formula (segments, residues, chunk order), so it runs at 16M tokens; --check
compares those counts with what attnjit computes at small sizes (Pattern.stats with the chunks'
offsets, and the comm plan's rows and chunk pairs, which the gloo tests show equal to the bytes
each rank sends), for the plain ring and for the rings of head parallelism (the comm plan of one
head slice, Pattern.head_slice, over head_parallel_layout). Times: pairs x 4 x D / throughput (+
the steps' memory passes), bytes / bandwidth, with the throughputs measured on an H100
(docs/performance.md) and the links' nominal bandwidths. Efficiency: the kernels' time alone,
spread evenly over the W GPUs, over the modelled time (the all_to_alls included)."""
import argparse
import functools
import math
import sys

import numpy as np

# The layouts, as ring_attention cuts the sequence (with head parallelism, the ring's pooled chunks).
from attnjit.distributed import best_layout, chunks_of, head_parallel_layout

# Measured on an H100 (`bench/gpu_ab.sh`, docs/performance.md, "Tile loads: one address per tile"; 16K tokens,
# 16 heads, D 128, bf16): useful TFLOP/s forward and backward.
# BigBird's (examples/bigbird.json, 7.7% of the pairs at 16K tokens) is taken for its 2.6% at 1M+.
# Causal documents take dense causal's.
THROUGHPUT = {"dense causal": (232.2e12, 140.3e12), "longnet": (215.2e12, 150.0e12), "bigbird": (161.3e12, 94.1e12),
              "documents": (232.2e12, 140.3e12)}
NVLINK = 450e9  # bytes/s each way per GPU (NVLink 4: 900 GB/s both ways), 8 GPUs per node
IB = 50e9  # bytes/s each way per GPU (one 400 Gb/s InfiniBand NIC per GPU)
HBM = 3.35e12  # bytes/s, H100 SXM's HBM3
HEADS, HEAD_DIM, BYTES = 16, 128, 2  # bf16
# Memory passes, bytes per (row, head, dim) element (estimates). Neither direction's kernel call
# touches more than its rows with work: the forward's writes only the rows that attend
# (ForwardOptions::rows_with_work_only), the backward's adds its gradients into the fp32
# accumulators at those rows (Attention::backward_add: no memset, no conversion, D given).
# - Over the query rows that attend (MERGE_BYTES): the forward kernels' O in bf16 and the merge of
#   (O, LSE) into the running fp32 result (index_select / index_copy_); the backward's kernels add
#   dQ themselves (their throughput includes it).
# - Over the K/V rows received (STAGE_BYTES): placed into the staging pair and zeroed again (K and
#   V, bf16), and in the backward the dK/dV partial rows gathered and zeroed (fp32).
# - Once per call over the local rows (ONCE_BYTES): the forward's fp32 result zeroed and converted
#   to bf16; the backward's fp32 dQ/dK/dV zeroed and converted, and D = rowsum(dO * O).
# The first merge into a query chunk is a copy (its rows are still (0, -inf)): FIRST_MERGE_BYTES,
# taken for the local step's rows (every chunk attends itself in the patterns here).
MERGE_BYTES = {"forward": 26, "backward": 0}
FIRST_MERGE_BYTES = {"forward": 8, "backward": 0}
STAGE_BYTES = {"forward": 8, "backward": 24}
ONCE_BYTES = {"forward": 10, "backward": 34}


def longnet_example():
    return [(2048, 1), (4096, 2), (8192, 4), (16384, 6), (32768, 12)]  # examples/longnet.json


def longnet_geometric(seq, base=2048):
    """LongNet grown to the whole sequence: segments base * 2^i, dilations 2^i (each branch
    attends base / 1 keys per query per segment: linear cost)."""
    out, w, r = [], base, 1
    while w <= seq:
        out.append((w, r))
        w, r = 2 * w, 2 * r
    return out


def _count(x, r, off):
    """#{l in [0, x): l mod r == off}."""
    return (x - off + r - 1) // r if x > off else 0


def _shared_segments(qlo, qn, klo, kn, w):
    return max(qlo // w, klo // w), min((qlo + qn - 1) // w, (klo + kn - 1) // w)


def dilated_pairs(branches, qlo, qn, klo, kn, heads, head_base=0):
    """Pairs (over heads, head_mod offsets) of a non-causal dilated pattern between two chunks, for
    heads head_base .. head_base + heads - 1 of the pattern (head h at offset h mod r)."""
    total = 0
    for w, r in branches:
        s0, s1 = _shared_segments(qlo, qn, klo, kn, w)
        for seg in range(s0, s1 + 1):
            a = seg * w
            for h in range(min(heads, r)):
                o = (head_base + h) % r
                nq = _count(min(a + w, qlo + qn) - a, r, o) - _count(max(a, qlo) - a, r, o)
                nk = _count(min(a + w, klo + kn) - a, r, o) - _count(max(a, klo) - a, r, o)
                total += nq * nk * len(range(h, heads, r))
    return total


@functools.lru_cache(maxsize=None)
def _residue_union(classes):
    """The positions x mod L (L = lcm of the r) with x = c mod r for some (r, c), as a bool array."""
    period = math.lcm(*(r for r, _ in classes))
    hit = np.zeros(period, dtype=bool)
    for r, c in classes:
        hit[c % r::r] = True
    return hit


def _count_hits(hit, lo, n):
    """#{p in [lo, lo + n): hit[p mod len(hit)]}."""
    period = len(hit)
    full, rest = divmod(n, period)
    tail = (lo + full * period + np.arange(rest)) % period
    return full * int(hit.sum()) + int(hit[tail].sum())


def dilated_rows(branches, qlo, qn, klo, kn, heads, head_base=0):
    """(row, head) units of the key chunk the query chunk reads: per head, the rows selected by a
    branch whose segment holds both chunks (each chunk inside one segment of every branch that
    reaches across: the sizes here are powers of two). Heads as in dilated_pairs."""
    total = 0
    for h in range(head_base, head_base + heads):
        classes = []
        for w, r in branches:
            s0, s1 = _shared_segments(qlo, qn, klo, kn, w)
            if s0 > s1:
                continue
            assert s0 == s1 and w >= kn, "a chunk spans several segments of a branch that reaches across"
            classes.append((r, (s0 * w + h % r) % r))
        if classes:
            total += _count_hits(_residue_union(tuple(sorted(classes))), klo, kn)
    return total


def causal_pairs(qchunks, kchunks, heads):
    total = 0
    for a, n in qchunks:
        for b, m in kchunks:
            total += n * m if a > b else (n * (n + 1) // 2 if a == b else 0)
    return total * heads


def causal_rows(qchunks, kchunks, heads):
    return sum(m for b, m in kchunks if any(a >= b for a, _ in qchunks)) * heads


# BigBird as in examples/bigbird.json: 128-token blocks, a block attends its neighbours (local 1),
# blocks 0 and 1 attend and are attended by every block (global), and each other block pair is
# kept with probability 0.025, independently per query head (random; docs/spec.md).
BIGBIRD = {"block": 128, "global": (0, 1), "density": 0.025, "seed": 2020}


def _splitmix64(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def bigbird_blocks(bb, h, qb, kb):
    """The kept block pairs of head h between query blocks qb and key blocks kb (exact: the random
    blocks as attnjit hashes them), bool [len(qb), len(kb)]."""
    q, k = np.asarray(qb, dtype=np.int64)[:, None], np.asarray(kb, dtype=np.int64)[None, :]
    glob = np.isin(q, bb["global"]) | np.isin(k, bb["global"])
    with np.errstate(over="ignore"):
        x = _splitmix64(np.uint64(bb["seed"]) ^ np.uint64(h))
        x = _splitmix64(x ^ q.astype(np.uint64))
        x = _splitmix64(x ^ k.astype(np.uint64))
    rand = (x >> np.uint64(11)).astype(np.float64) * 2.0**-53 < bb["density"]
    return (np.abs(k - q) <= 1) | glob | rand


def _bigbird_fixed(bb, qb, kb):
    """The local and global blocks (every head) between block ranges qb and kb, without a matrix:
    kept pairs per query block, and whether each query block and each key block keeps any."""
    g = np.asarray(bb["global"])
    q0, q1, k0, k1 = qb[0], qb[-1] + 1, kb[0], kb[-1] + 1
    kg, qg = g[(g >= k0) & (g < k1)], g[(g >= q0) & (g < q1)]
    band = np.clip(np.minimum(qb + 2, k1) - np.maximum(qb - 1, k0), 0, None)
    band_g = ((kg[None, :] >= qb[:, None] - 1) & (kg[None, :] <= qb[:, None] + 1)).sum(axis=1)
    q_global = np.isin(qb, g)
    per_row = np.where(q_global, len(kb), band - band_g + len(kg))
    kband = np.clip(np.minimum(kb + 2, q1) - np.maximum(kb - 1, q0), 0, None)
    return per_row, q_global | (len(kg) > 0) | (band > 0), np.isin(kb, g) | (len(qg) > 0) | (kband > 0)


def bigbird_counts(bb, qc, kc, heads, exact, head_base=0):
    """(pairs, key rows read, query rows with work summed over chunk pairs) between chunk lists qc
    and kc, in (row, head) units: exact (the random blocks hashed, small sizes; heads head_base ..
    head_base + heads - 1, as a head slice hashes them) or expected (each random block kept with
    probability density, large sizes)."""
    blk, d = bb["block"], bb["density"]
    pairs = rows = qrows = 0.0
    read_k = {}
    for a, n in qc:
        for b, m in kc:
            qb, kb = np.arange(a // blk, (a + n) // blk), np.arange(b // blk, (b + m) // blk)
            if exact:
                for h in range(heads):
                    kept = bigbird_blocks(bb, head_base + h, qb, kb)
                    pairs += kept.sum() * blk * blk
                    qrows += kept.any(axis=1).sum() * blk
                    read_k.setdefault((b, h), np.zeros(len(kb), dtype=bool))
                    read_k[(b, h)] |= kept.any(axis=0)
                continue
            per_row, q_any, k_any = _bigbird_fixed(bb, qb, kb)
            fixed = per_row.sum()
            pairs += heads * blk * blk * (fixed + d * (len(qb) * len(kb) - fixed))
            qrows += heads * blk * np.where(q_any, 1.0, 1.0 - (1.0 - d) ** len(kb)).sum()
            miss = read_k.setdefault((b, 0), np.ones(len(kb)))  # P(a key block is read by no query chunk)
            miss *= np.where(k_any, 0.0, (1.0 - d) ** len(qb))
    if exact:
        rows = sum(r.sum() for r in read_k.values()) * blk
    else:
        rows = heads * blk * sum((1.0 - miss).sum() for miss in read_k.values())
    return pairs, rows, qrows


def bigbird_split(bb, chunks):
    """A rank's chunks cut at BigBird's global query blocks: (home, away) chunk lists. A global row
    attends every key, far over 4 times the mean row at these sizes, so attnjit.distributed
    computes it on the ranks that hold its keys (its heavy rows; --check compares these pieces with
    the comm plan's)."""
    blk, glob = bb["block"], sorted(bb["global"])
    home, away = [], []
    for a, n in chunks:
        at = a
        for g in glob:
            lo, hi = max(g * blk, a), min((g + 1) * blk, a + n)
            if lo >= hi:
                continue
            if lo > at:
                home.append((at, lo - at))
            if away and away[-1][0] + away[-1][1] == lo:
                away[-1] = (away[-1][0], hi - away[-1][0])
            else:
                away.append((lo, hi - lo))
            at = hi
        if at < a + n:
            home.append((at, a + n - at))
    return home, away


# Documents packed into the sequence, each with a causal mask: documents of DOC_LEN tokens, as the
# pattern {"segment": DOC_LEN, "causal": true} (a query attends the earlier keys of its segment).
DOC_LEN = 98304


def _doc_spans(lo, n, doc):
    """(segment, start, end) of [lo, lo + n) cut at the segments of `doc` tokens."""
    out, at = [], lo
    while at < lo + n:
        end = min(lo + n, (at // doc + 1) * doc)
        out.append((at // doc, at, end))
        at = end
    return out


def _causal_count(q0, q1, k0, k1):
    """#{(i, j): q0 <= i < q1, k0 <= j < k1, j <= i}."""
    def upto(x):  # sum over i in [k0, x) of (i + 1 - k0), then the rows past k1 with every key
        a = min(max(x, k0), k1) - k0
        return a * (a + 1) // 2 + max(0, x - k1) * (k1 - k0)
    return upto(q1) - upto(q0)


def document_counts(doc, qc, kc, heads):
    """(pairs, key rows read, query rows with work summed over chunk pairs) between chunk lists qc
    and kc of causal documents of `doc` tokens, in (row, head) units."""
    pairs = qrows = 0
    reach = {}  # (key chunk, segment) -> the last query row of this rank in that segment
    for a, n in qc:
        for b, m in kc:
            for seg, q0, q1 in _doc_spans(a, n, doc):
                for seg_k, k0, k1 in _doc_spans(b, m, doc):
                    if seg_k != seg:
                        continue
                    pairs += _causal_count(q0, q1, k0, k1)
                    qrows += max(0, q1 - max(q0, k0))
                    reach[(b, seg)] = max(reach.get((b, seg), k0), q1)
    rows = 0
    for b, m in kc:
        for seg, k0, k1 in _doc_spans(b, m, doc):
            rows += max(0, min(k1, reach.get((b, seg), k0)) - k0)
    return pairs * heads, rows * heads, qrows * heads


def document_work(doc, heads):
    """work(start, length) for balanced_layout and best_layout: a chunk's attended pairs."""
    return lambda start, n: sum(_causal_count(q0, q1, seg * doc, q1) for seg, q0, q1 in _doc_spans(start, n, doc)) * heads


def pair_counts(kind, branches, seq, world, layout, heads, exact=False, head_base=0):
    """pairs[q][k], rows[q][k] (key rows read) and qrows[q][k] (query rows with work; (row, head)
    units) for every (query rank, key rank), of the query rows computed on their rank; visits[q][k],
    the pairs of rank q's heavy rows computed on rank k against its keys, and away[q], those rows
    ((row, head) units; BigBird's global rows, none in the other patterns here). With head
    parallelism: the ring's ranks (world = W / u), its layout (head_parallel_layout) and the heads
    of one slice (heads = H / u from head_base on)."""
    pairs, rows, qrows, visits = (np.zeros((world, world)) for _ in range(4))
    away = np.zeros(world)
    for q in range(world):
        for k in range(world):
            qc, kc = chunks_of(seq, world, q, layout), chunks_of(seq, world, k, layout)
            if kind == "bigbird":
                qc, gone = bigbird_split(branches, qc)
                visits[q, k] = bigbird_counts(branches, gone, kc, heads, exact, head_base)[0] if gone else 0
                away[q] = sum(n for _, n in gone) * heads
            if kind == "documents":
                pairs[q, k], rows[q, k], qrows[q, k] = document_counts(branches, qc, kc, heads)
                if q == k:
                    rows[q, k] = 0
            elif kind == "bigbird":
                pairs[q, k], rows[q, k], qrows[q, k] = bigbird_counts(branches, qc, kc, heads, exact, head_base)
                if q == k:
                    rows[q, k] = 0
            elif kind == "dense causal":
                pairs[q, k] = causal_pairs(qc, kc, heads)
                rows[q, k] = causal_rows(qc, kc, heads) if q != k else 0
                qrows[q, k] = sum(n for a, n in qc for b, _ in kc if a >= b) * heads  # per chunk pair (one merge each)
            else:
                pairs[q, k] = sum(dilated_pairs(branches, a, n, b, m, heads, head_base) for a, n in qc for b, m in kc)
                rows[q, k] = (sum(dilated_rows(branches, a, n, b, m, heads, head_base) for a, n in qc for b, m in kc)
                              if q != k else 0)
                # The query side of the same count (the branches reaching across select rows alike).
                qrows[q, k] = (sum(dilated_rows(branches, b, m, a, n, heads, head_base) for a, n in qc for b, m in kc)
                               if q != k else sum(n for _, n in qc) * heads)
    return pairs, rows, qrows, visits, away


def bandwidth(src, dst, per_node=8):
    """The link between two ranks of a ring with `per_node` ranks per node of 8 GPUs (8 / u with
    head parallelism: ring rank g's GPUs are g*u .. g*u + u - 1, inside one node)."""
    return NVLINK if src // per_node == dst // per_node else IB


def steps_ahead(moved, budget):
    """The backward's steps in flight (CommPlan.steps_ahead): as many as fit in `budget` bytes at
    every rank's largest step, at least one, the least over the ranks."""
    world = moved.shape[1]
    most = moved[1:].max(axis=0) if world > 1 else np.zeros(world)
    return int(min(max(1, min(world - 1, budget // m if m else world - 1)) for m in most)) if world > 1 else 0


def ring_time(comp, xfer, moved, budget=None, ahead=None, per_node=8):
    """The ring's time: each rank runs its steps in order (comp[s][r], the local step 0 first) and
    starts their transfers (xfer[s][r] to receive; moved[s][r] bytes sent and received) ahead, as
    attnjit.distributed does: in the forward as many steps as fit in `budget` bytes, at least one;
    in the backward `ahead` steps. A step's kernels wait for its rows, and the transfers into a rank
    take its NVLink or its InfiniBand link one after another. The slowest rank's end."""
    world, end = comp.shape[1], 0.0
    for r in range(world):
        link_free, arrive, started, in_flight, t = {}, {}, 1, 0.0, 0.0
        for s in range(world):  # step 0 is local: the first transfers start before it
            if s:
                t = max(t, arrive[s])
                in_flight -= moved[s, r]
            while started < world and (started == s + 1 or (started <= s + ahead if budget is None
                                                             else in_flight + moved[started, r] <= budget)):
                link = bandwidth((r - started) % world, r, per_node)
                arrive[started] = link_free[link] = max(t, link_free.get(link, 0.0)) + xfer[started, r]
                in_flight += moved[started, r]
                started += 1
            t += comp[s, r]
        end = max(end, t)
    return end


# Head parallelism (ring_attention's head_parallel = u): an all_to_all inside each head group of u
# GPUs (one node, NVLink) before the ring and its reverse after it, one per tensor
# (python/attnjit/_head_parallel.py). Bytes per (row, head) element of a GPU's local rows, (in
# before the ring, back after it); 16 kv heads as 16 query heads here.
# - forward: Q, K, V in (bf16); O (bf16) and LSE (fp32) back;
# - backward: dO in (bf16: the ring's backward keeps the pooled Q, K, V, O and LSE of its forward;
#   the LSE's gradient would go in too where the LSE is in the loss); dQ, dK, dV back in the inputs'
#   dtype (bf16).
# A GPU sends and receives (u - 1) / u of those bytes at NVLINK each way, and each tensor is copied
# once between the local and the pooled order (the send buffer going in, the received pieces coming
# back: read and write at HBM); not overlapped with the ring's kernels.
A2A_BYTES = {"forward": (3 * HEAD_DIM * BYTES, HEAD_DIM * BYTES + 4),
             "backward": (HEAD_DIM * BYTES, 3 * HEAD_DIM * BYTES)}
HEAD_GROUPS = (1, 2, 4, 8)  # u: a head group inside one node of 8


def all_to_all(units, unit_bytes, u):
    """(bytes each GPU sends, seconds) of one all_to_all of `units` (row, head) elements of
    `unit_bytes` each inside a head group of u GPUs, with its copy between the two orders."""
    if u == 1:
        return 0.0, 0.0
    sent = units * unit_bytes * (u - 1) / u
    return sent, sent / NVLINK + 2 * units * unit_bytes / HBM


def ring_model(kind, counts, world, per_node, local, direction):
    """One direction of one ring (one head slice with head parallelism): its time and the LongNet
    scheme's, both without the all_to_alls, its kernels' time summed over its ranks, and its
    slowest rank's per-step compute and transfer, from pair_counts' counts over its `world` ranks."""
    pairs, rows, qrows, visits, away = counts
    fwd_tp, bwd_tp = THROUGHPUT[kind]
    tp, flops_factor, bytes_factor = (fwd_tp, 1.0, 1.0) if direction == "forward" else (bwd_tp, 2.5, 3.0)
    # The backward moves the K/V rows again and sends their dK/dV (fp32: twice the bytes) back.
    kv = 2 * HEAD_DIM * BYTES  # K and V bytes per (row, kv head)

    def per_step(m):  # m[query rank, key rank] laid out by step: [s][r] = m[r, r - s]
        return np.array([[m[r, (r - s) % world] for r in range(world)] for s in range(world)])

    def link(src, dst):
        return bandwidth(src, dst, per_node)

    once = local * HEAD_DIM * ONCE_BYTES[direction] / HBM
    merge = local * HEAD_DIM * MERGE_BYTES[direction] / HBM
    first_merge = local * HEAD_DIM * FIRST_MERGE_BYTES[direction] / HBM
    kernels = per_step(pairs) * 4 * HEAD_DIM * flops_factor / tp
    part = per_step(qrows) / local
    first = np.zeros_like(part)
    first[0] = np.minimum(part[0], 1.0)  # the local step: each row's first merge
    merges = merge * (part - first) + first_merge * first
    stage = per_step(rows) * HEAD_DIM * STAGE_BYTES[direction] / HBM
    comp = kernels + merges + stage
    xfer = np.array([[rows[r, (r - s) % world] * kv * bytes_factor / link((r - s) % world, r) for r in range(world)]
                     for s in range(world)])
    # The ring's steps started ahead (ring_time): the forward's within the local K/V's bytes, the
    # backward's a number of steps every rank shares (steps_ahead). A backward step's transfer
    # carries its K/V in and their dK/dV back (bytes_factor); the last step's dK/dV are waited
    # for at the end.
    moved = np.array([[(rows[r, (r - s) % world] + rows[(r + s) % world, r]) * kv for r in range(world)]
                      for s in range(world)])
    if direction == "forward":
        steps = ring_time(comp, xfer, moved, budget=local * kv, per_node=per_node)
    else:
        steps = ring_time(comp, xfer, moved, ahead=steps_ahead(moved, local * kv), per_node=per_node)
        steps += xfer[world - 1].max() * 2 / 3 if world > 1 else 0.0
    # Heavy rows: their Q (dO, LSE and D in the backward) goes out in one collective before the
    # ring, under way during it; after the ring each rank computes its visitors against its own
    # keys and the partial (O, LSE) in fp32 (dQ in fp32) go back, to each owner over its links
    # in parallel.
    host = visits.sum(axis=0) * 4 * HEAD_DIM * flops_factor / tp
    out_b = (HEAD_DIM * BYTES if direction == "forward" else 2 * HEAD_DIM * BYTES + 8)
    back_b = (HEAD_DIM + 1) * 4 if direction == "forward" else HEAD_DIM * 4
    hosts = [[k for k in range(world) if k != q and visits[q, k] > 0] for q in range(world)]

    def links(q, unit):  # seconds for away[q] units of `unit` bytes to or from every host of q
        nv = sum(away[q] * unit for k in hosts[q] if link(k, q) == NVLINK)
        ib = sum(away[q] * unit for k in hosts[q] if link(k, q) == IB)
        return max(nv / NVLINK, ib / IB)

    sent = max((links(q, out_b) for q in range(world)), default=0.0)
    back = max((links(q, back_b) for q in range(world)), default=0.0)
    steps = max(steps, sent) + host.max() + back + once
    # LongNet's scheme: everything moved first (the links of a rank in parallel), then the kernels.
    nv = np.array([sum(rows[r, k] for k in range(world) if k != r and link(k, r) == NVLINK) for r in range(world)])
    ib = np.array([sum(rows[r, k] for k in range(world) if link(k, r) == IB) for r in range(world)])
    gather = (max(max(np.maximum(nv * kv * bytes_factor / NVLINK, ib * kv * bytes_factor / IB)), sent) +
              (comp.sum(axis=0) + host).max() + back + once)
    return {"steps": steps, "gather": gather,
            "kernels": (pairs.sum() + visits.sum()) * 4 * HEAD_DIM * flops_factor / tp,
            "compute": comp[1:].max() if world > 1 else 0.0, "transfer": xfer[1:].max() if world > 1 else 0.0}


def model(kind, branches, seq, world, layout, u=1):
    """Per-step compute and transfer times (s) and the efficiencies of both strategies, with head
    parallelism u: the all_to_alls inside head groups of u GPUs around rings of world / u ranks,
    each over H / u heads and pooled chunks (head_parallel_layout) of u * S / W rows."""
    ring, heads, per_node = world // u, HEADS // u, 8 // u
    ring_layout = head_parallel_layout(seq, world, u, layout)
    # The rings of the u head slices run side by side. Dense causal, documents and BigBird (its random
    # blocks counted by their probability) cost the same in every head; LongNet's heads differ in
    # their offsets (h mod r), so each slice is counted.
    slices = range(u) if kind == "longnet" else range(1)
    counts = [pair_counts(kind, branches, seq, ring, ring_layout, heads, head_base=j * heads) for j in slices]
    local = seq // world * HEADS  # (row, head) units per GPU: u * S/W rows of H/u heads in the ring
    kv = 2 * HEAD_DIM * BYTES
    out = {"u": u, "ring_layout": ring_layout}
    for direction in ("forward", "backward"):
        rings = [ring_model(kind, c, ring, per_node, local, direction) for c in counts]
        a_in, t_in = all_to_all(local, A2A_BYTES[direction][0], u)
        a_out, t_out = all_to_all(local, A2A_BYTES[direction][1], u)
        ideal = sum(x["kernels"] for x in rings) * u / len(rings) / world  # the kernels alone, balanced over W GPUs
        steps = t_in + max(x["steps"] for x in rings) + t_out
        gather = t_in + max(x["gather"] for x in rings) + t_out
        out[direction] = {"compute_ms": 1e3 * max(x["compute"] for x in rings),
                          "transfer_ms": 1e3 * max(x["transfer"] for x in rings),
                          "a2a_gb": (a_in + a_out) / 1e9, "a2a_ms": 1e3 * (t_in + t_out),
                          "ring": ideal / steps, "longnet": ideal / gather, "total_ms": 1e3 * steps}
    work = np.concatenate([pairs.sum(axis=1) + visits.sum(axis=0) for pairs, _, _, visits, _ in counts])
    out["imbalance"] = work.max() / work.mean() - 1 if work.mean() else 0.0
    out["gb_per_rank"] = max(rows.sum(axis=1).max() for _, rows, _, _, _ in counts) * kv / 1e9
    out["ring_gb_per_rank"] = (ring - 1) * local * kv / 1e9  # every pooled chunk to every ring rank
    return out


def head_groups(world):
    """The u that fit: dividing the world size and the heads, inside a node of 8."""
    return [u for u in HEAD_GROUPS if world % u == 0 and HEADS % u == 0 and u <= 8]


def best_model(kind, branches, seq, world, layout, tie=0.02):
    """The model at the u whose forward plus backward is fastest, and the model at u = 1. Times within
    `tie` of the fastest count as a tie, won by the smaller u: the model's memory passes are estimates,
    and a larger u adds collectives whose latency it leaves out."""
    models = [model(kind, branches, seq, world, layout, u) for u in head_groups(world)]
    total = [m["forward"]["total_ms"] + m["backward"]["total_ms"] for m in models]
    best = next(m for m, t in zip(models, total) if t <= min(total) * (1 + tie))
    return best, models[0]


CASES = [("dense causal", None, "zigzag"), ("documents", None, "auto"), ("longnet", "example", "contiguous"),
         ("longnet", "geometric", "contiguous"), ("bigbird", "example", "contiguous")]


def documents_spec(doc):
    return {"attnjit": 1, "branches": [{"segment": doc, "causal": True}]}


def auto_layout(kind, branches, seq, world, heads):
    """The layout attnjit.nn's layout="auto" would pick (best_layout), weighed by the model's formula."""
    assert kind == "documents"
    return best_layout(documents_spec(branches), seq, heads, world_size=world, work=document_work(branches, heads))


def tables(seqs, worlds):
    print("| pattern | tokens | GPUs | layout | u | work imbalance | step compute ms | step transfer ms "
          "| K/V GB per GPU (plain ring) | all_to_all GB fwd / bwd | all_to_all ms fwd / bwd | ring fwd / bwd "
          "| ring at u = 1 fwd / bwd | LongNet scheme fwd / bwd | forward s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, config, layout in CASES:
        for seq in seqs:
            for world in worlds:
                branches = (BIGBIRD if kind == "bigbird" else DOC_LEN if kind == "documents" else None if config is None
                            else longnet_example() if config == "example" else longnet_geometric(seq))
                lay = auto_layout(kind, branches, seq, world, HEADS) if layout == "auto" else layout
                m, plain = best_model(kind, branches, seq, world, lay)
                f, b = m["forward"], m["backward"]
                name = ("BigBird (example)" if kind == "bigbird" else f"documents of {DOC_LEN // 1024}K, causal"
                        if kind == "documents" else kind if config is None else f"LongNet ({config})")
                shown = str(lay) + (" (auto)" if layout == "auto" else "")
                a2a = ("- | -" if m["u"] == 1 else
                       f"{f['a2a_gb']:.2f} / {b['a2a_gb']:.2f} | {f['a2a_ms']:.1f} / {b['a2a_ms']:.1f}")
                print(f"| {name} | {seq // 2**20}M | {world} | {shown} | {m['u']} | {100 * m['imbalance']:.1f}% | "
                      f"{f['compute_ms']:.1f} | {f['transfer_ms']:.1f} | {m['gb_per_rank']:.2f} ({m['ring_gb_per_rank']:.2f}) | "
                      f"{a2a} | {100 * f['ring']:.0f}% / {100 * b['ring']:.0f}% | "
                      f"{100 * plain['forward']['ring']:.0f}% / {100 * plain['backward']['ring']:.0f}% | "
                      f"{100 * f['longnet']:.0f}% / {100 * b['longnet']:.0f}% | {f['total_ms'] / 1e3:.2f} |", flush=True)


def compare(kind, branches, p, seq, world, layout, heads, head_base=0, what=""):
    """The model's counts (pair_counts) against the comm plan's for pattern p over `world` ranks:
    per rank pair the pairs, rows and query rows, the heavy rows and their visits, and the backward's
    steps in flight. The number of mismatches, each printed."""
    import attnjit.distributed as ad

    failures = 0
    plan = ad.comm_plan(p, seq, heads, world_size=world, layout=layout)
    pairs, rows, qrows, visits, away = pair_counts(kind, branches, seq, world, layout, heads, exact=True,
                                                   head_base=head_base)
    for q in range(world):
        want_away = plan.away_offsets(q)[1] * heads
        if away[q] != want_away:
            failures += 1
            print(f"MISMATCH {kind} {layout}{what} seq {seq} world {world} rank {q}: heavy rows, model {away[q]:.0f}, "
                  f"attnjit {want_away} ({plan.away[q]})")
        for k in range(world):
            kc = chunks_of(seq, world, k, layout)

            def stats(pieces):
                return sum(p.stats(n, heads, m, heads, gs, b)["attended_pairs"] for _, n, gs in pieces for b, m in kc)

            want_pairs, want_visits = stats(plan.home[q]), stats(plan.away[q])
            want_rows = int(plan.rows[(q, k)].sum()) if (q, k) in plan.rows and q != k else 0
            want_qrows = plan.query_rows(q, k)  # what each piece pair's kernels write and merge
            ok = (pairs[q, k] == want_pairs and rows[q, k] == want_rows and qrows[q, k] == want_qrows and
                  (pairs[q, k] > 0) == ((q, k) in plan.pairs) and visits[q, k] == want_visits and
                  (visits[q, k] > 0) == bool(plan.visit(q, k)))
            if not ok:
                failures += 1
                print(f"MISMATCH {kind} {layout}{what} seq {seq} world {world} ranks ({q}, {k}): model pairs "
                      f"{pairs[q, k]:.0f} rows {rows[q, k]:.0f} query rows {qrows[q, k]:.0f} visits "
                      f"{visits[q, k]:.0f}; attnjit pairs {want_pairs} rows {want_rows} query rows {want_qrows} "
                      f"visits {want_visits}")
    # The backward's steps in flight, from the model's rows and from the comm plan's.
    moved = np.array([[rows[r, (r - s) % world] + rows[(r + s) % world, r] for r in range(world)]
                      for s in range(world)])
    model_ahead = steps_ahead(moved, seq // world * heads)
    want_ahead = min(plan.steps_ahead(r) for r in range(world)) if world > 1 else 0
    if model_ahead != want_ahead:
        failures += 1
        print(f"MISMATCH {kind} {layout}{what} seq {seq} world {world}: backward steps in flight, model {model_ahead}, "
              f"attnjit {want_ahead}")
    shape = ("scaled down" if kind in ("bigbird", "documents") else "example-like" if branches and branches[-1][1] == 12
             else "geometric" if branches else "causal")
    print(f"checked {kind} ({shape}), {layout}{what}, seq {seq}, {world} ranks: steps with work {len(plan.pairs)}, "
          f"rows moved {plan.moved_rows()}, backward steps in flight {want_ahead}, "
          f"heavy rows {plan.away_offsets(0)[1] if plan.has_away else 0}")
    return failures


def check():
    """The model's pair, row and step counts against attnjit's at small sizes (scaled-down LongNets),
    without and with head parallelism."""
    import attnjit
    import attnjit.distributed as ad

    heads, failures = 4, 0
    specs = [("dense causal", None, {"attnjit": 1, "causal": True, "branches": [{"segment": "full"}]}, "zigzag"),
             ("longnet", [(128, 1), (256, 2), (512, 4), (1024, 6), (2048, 12)], None, "contiguous"),
             ("longnet", None, None, "contiguous"),
             ("bigbird", dict(BIGBIRD, block=32), None, "contiguous"), ("bigbird", dict(BIGBIRD, block=32), None, "zigzag"),
             ("documents", 1024, None, "contiguous"), ("documents", 1024, None, "auto"), ("documents", 1536, None, "auto")]
    # (seq, world, u): u = 1 is the plain ring; u > 1 the rings of head parallelism, one per head slice
    # (world / u ring ranks, heads / u heads, the pooled chunks of head_parallel_layout).
    for seq, world, u in ((4096, 2, 1), (4096, 4, 1), (4096, 8, 1), (8192, 8, 1), (4096, 4, 2), (8192, 8, 2)):
        for kind, branches, spec, layout in specs:
            if kind == "longnet":
                branches = branches or longnet_geometric(seq, base=64)
                spec = {"attnjit": 1, "branches": [{"segment": w, "dilation": r} for w, r in branches]}
            if kind == "bigbird":
                spec = {"attnjit": 1, "branches": [{"segment": "full"}], "layout": {"block": branches["block"], "union": [
                    {"local": 1}, {"global": list(branches["global"])},
                    {"random": {"density": branches["density"], "seed": branches["seed"]}}]}}
            if kind == "documents":
                spec = documents_spec(branches)
            p = attnjit.Pattern.from_json(spec)
            if layout == "auto":  # the model's layout (its formula's weights) is attnjit's own (Pattern.stats)
                layout = auto_layout(kind, branches, seq, world, heads)
                want_layout = ad.best_layout(p, seq, heads, world_size=world)
                if str(layout) != str(want_layout) or (not isinstance(layout, str) and layout.chunks != want_layout.chunks):
                    failures += 1
                    print(f"MISMATCH {kind} seq {seq} world {world}: auto layout, model {layout}, attnjit {want_layout}")
            if u == 1:
                failures += compare(kind, branches, p, seq, world, layout, heads)
                continue
            ring_layout = head_parallel_layout(seq, world, u, layout)

            def rows_of(chunks):
                return np.concatenate([np.arange(a, a + n) for a, n in chunks])

            for g in range(world // u):  # ring rank g: the rows of ranks g*u .. g*u + u - 1, in order
                pooled = [c for i in range(u) for c in chunks_of(seq, world, g * u + i, layout)]
                if not np.array_equal(rows_of(chunks_of(seq, world // u, g, ring_layout)), rows_of(pooled)):
                    failures += 1
                    print(f"MISMATCH {kind} {layout} seq {seq} world {world}: head_parallel_layout's ring rank {g} "
                          f"holds {chunks_of(seq, world // u, g, ring_layout)}, not the chunks of its head group {pooled}")
            h = heads // u
            for j in range(u):
                failures += compare(kind, branches, p.head_slice(j * h, h, heads), seq, world // u, ring_layout, h,
                                    head_base=j * h,
                                    what=f" (head parallel {u} of {world} ranks, heads {j * h}-{j * h + h - 1})")
    # At the table's sizes the random blocks are counted by their probability: against the exact
    # count (hashed) in total at 32768 tokens on 8 and 16 ranks.
    bb = dict(BIGBIRD, block=32)
    for seq, world, layout in ((32768, 8, "contiguous"), (32768, 16, "zigzag")):
        exact = pair_counts("bigbird", bb, seq, world, layout, heads, exact=True)[:3]
        expected = pair_counts("bigbird", bb, seq, world, layout, heads, exact=False)[:3]
        ratios = [float(e.sum() / x.sum()) for e, x in zip(expected, exact)]
        print(f"bigbird expected / exact at {seq} tokens, {world} ranks, {layout}: pairs {ratios[0]:.4f}, rows {ratios[1]:.4f}, "
              f"query rows {ratios[2]:.4f}")
        if any(abs(r - 1) > 0.02 for r in ratios):
            failures += 1
            print("MISMATCH bigbird: the expected counts are off the exact ones by more than 2%")
    print("model == attnjit" if not failures else f"{failures} mismatches")
    return failures == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare the model's counts with attnjit's comm plans")
    ap.add_argument("--seq", default="1,4,16", help="sequence lengths in Mi tokens")
    ap.add_argument("--gpus", default="8,16,32,64")
    args = ap.parse_args()
    if args.check:
        sys.exit(0 if check() else 1)
    tables([int(x) * 2**20 for x in args.seq.split(",")], [int(x) for x in args.gpus.split(",")])


if __name__ == "__main__":
    main()
