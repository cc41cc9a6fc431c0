"""The planning half of attnjit.distributed, with no torch in it: how a sequence is cut into chunks
and dealt out to the ranks (the layouts: contiguous, zigzag, a ChunkLayout from balanced_layout),
and the CommPlan of a ring over them, which names for every pair of ranks the chunk pairs that
attend anything, the K/V rows they read and the query rows that attend (compiler/plan's
plan_key_rows and plan_attending_rows, through call_rows). attnjit.distributed exports all of it."""
import bisect
import dataclasses
import functools

import numpy as np

from . import _attnjit
from ._inputs import documents_arg
from ._pattern import as_pattern

LAYOUTS = ("contiguous", "zigzag")


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    """Which chunks of the sequence each rank holds: `chunks[r]` is rank r's (global start,
    length) pairs in local order. Every rank holds the same number of chunks, all of one length,
    and together they cut [0, seq_len) exactly (checked when made). `work[r]` is the attended pairs
    (per branch, over all heads) of rank r's query rows, what its kernels compute."""
    name: str
    seq_len: int
    chunks: tuple
    work: tuple = ()

    def __post_init__(self):
        starts = sorted(c for rank in self.chunks for c in rank)
        sizes = {n for _, n in starts}
        counts = {len(rank) for rank in self.chunks}
        if len(sizes) != 1 or len(counts) != 1:
            raise ValueError(f"layout {self.name!r}: every rank must hold the same number of chunks of one length "
                             f"(got lengths {sorted(sizes)}, counts per rank {sorted(counts)})")
        at = 0
        for start, n in starts:
            if start != at:
                raise ValueError(f"layout {self.name!r}: the chunks must cut [0, {self.seq_len}) exactly; " +
                                 (f"position {start} is held twice" if start < at else f"position {at} is held by no rank"))
            at += n
        if at != self.seq_len:
            raise ValueError(f"layout {self.name!r}: the chunks cover [0, {at}), not [0, {self.seq_len})")

    @property
    def imbalance(self) -> float:
        """max(work) / mean(work) - 1: 0 when every rank computes the same number of pairs."""
        mean = sum(self.work) / len(self.work) if self.work else 0
        return max(self.work) / mean - 1 if mean else 0.0

    def __str__(self):
        return self.name


def _stats_work(p, seq_len, heads_q, heads_kv, cu_seqlens=None):
    """work(start, length): the attended pairs of those query rows against the whole sequence, or,
    with packed documents, against their documents (positions from each document's start)."""
    docs = check_documents(cu_seqlens, seq_len)
    if docs is None:
        return lambda start, n: int(p.stats(n, heads_q, seq_len, heads_kv, q_offset=start)["attended_pairs"])

    def work(start, n):
        total = 0
        for i in range(bisect.bisect_right(docs, start) - 1, len(docs) - 1):
            ds, de = docs[i], docs[i + 1]
            if ds >= start + n:
                break
            lo, hi = max(start, ds), min(start + n, de)
            if lo < hi:
                total += int(p.stats(hi - lo, heads_q, de - ds, heads_kv, q_offset=lo - ds)["attended_pairs"])
        return total

    return work


def balanced_layout(pattern, seq_len: int, heads_q: int, heads_kv: int = None, *, world_size: int,
                    chunks_per_rank: int = 2, work=None, cu_seqlens=None) -> ChunkLayout:
    """A layout that gives every rank the same share of `pattern`'s work: the sequence is cut into
    world_size * chunks_per_rank equal chunks, each weighed by the attended pairs of its query rows
    against the whole sequence (Pattern.stats at the chunk's offset), and dealt out largest first to
    the rank with the least work that still has room, then improved by swaps between the heaviest and
    the lightest rank. The same on every rank (it depends only on its arguments). `work(start,
    length)`, when given, weighs a chunk instead (bench/scaling_model.py passes its formulas);
    `cu_seqlens`, packed documents as ring_attention takes them, weighs each chunk within its
    documents."""
    p = as_pattern(pattern)
    heads_kv = heads_q if heads_kv is None else heads_kv
    parts = world_size * chunks_per_rank
    if chunks_per_rank < 1 or world_size < 1:
        raise ValueError(f"balanced_layout: world_size ({world_size}) and chunks_per_rank ({chunks_per_rank}) must be >= 1")
    if seq_len <= 0 or seq_len % parts:
        raise ValueError(f"sequence length {seq_len} is not a positive multiple of {parts} (balanced layout: "
                         f"{world_size} ranks x {chunks_per_rank} chunks); pad the sequence or pick another chunks_per_rank")
    n = seq_len // parts
    work = work or _stats_work(p, seq_len, heads_q, heads_kv, cu_seqlens)
    weight = [work(c * n, n) for c in range(parts)]
    owner, load, held = [None] * parts, [0] * world_size, [[] for _ in range(world_size)]
    for c in sorted(range(parts), key=lambda c: (-weight[c], c)):
        r = min((r for r in range(world_size) if len(held[r]) < chunks_per_rank), key=lambda r: (load[r], r))
        held[r].append(c)
        load[r] += weight[c]
    for _ in range(parts * parts):  # swaps between the heaviest and the lightest rank while they help
        hi = max(range(world_size), key=lambda r: (load[r], -r))
        lo = min(range(world_size), key=lambda r: (load[r], r))
        best = None
        for a in held[hi]:
            for b in held[lo]:
                d = weight[a] - weight[b]
                peak = max(load[hi] - d, load[lo] + d)
                if d > 0 and peak < load[hi] and (best is None or peak < best[0]):
                    best = (peak, a, b, d)
        if best is None:
            break
        _, a, b, d = best
        held[hi][held[hi].index(a)], held[lo][held[lo].index(b)] = b, a
        load[hi] -= d
        load[lo] += d
    chunks = tuple(tuple((c * n, n) for c in sorted(h)) for h in held)
    return ChunkLayout(f"balanced:{chunks_per_rank}", seq_len, chunks, tuple(load))


def best_layout(pattern, seq_len: int, heads_q: int, heads_kv: int = None, *, world_size: int,
                max_chunks_per_rank: int = 8, margin: float = 0.02, work=None, cu_seqlens=None):
    """The layout under which `pattern`'s work is shared out most evenly at this length: of
    "contiguous", "zigzag" and balanced_layout(..., chunks_per_rank) for 2, 4, ... up to
    `max_chunks_per_rank` chunks, in that order, the first unless a later one's imbalance (max /
    mean of the attended pairs of each rank's query rows, minus 1) is lower by more than `margin`
    (an earlier layout has fewer, larger chunk pairs). A layout that cannot cut this length is
    passed over. The same on every rank. `work` and `cu_seqlens` as in balanced_layout."""
    p = as_pattern(pattern)
    heads_kv = heads_q if heads_kv is None else heads_kv
    if world_size < 1:
        raise ValueError(f"best_layout: world_size ({world_size}) must be >= 1")
    work = work or _stats_work(p, seq_len, heads_q, heads_kv, cu_seqlens)
    best = None
    cuts = [2 ** i for i in range(1, max(1, max_chunks_per_rank).bit_length()) if 2 ** i <= max_chunks_per_rank]
    for name in LAYOUTS + tuple(cuts):
        # A layout that cannot cut this length is passed over; any other error (the pattern does not
        # fit the heads, a bad cu_seqlens) is the caller's and goes up as it is.
        parts = world_size * name if not isinstance(name, str) else _parts(name, world_size)
        if seq_len <= 0 or seq_len % parts:
            continue
        if not isinstance(name, str):
            layout = balanced_layout(p, seq_len, heads_q, heads_kv, world_size=world_size, chunks_per_rank=name, work=work)
        else:
            chunks = [chunks_of(seq_len, world_size, r, name) for r in range(world_size)]
            layout = ChunkLayout(name, seq_len, tuple(tuple(c) for c in chunks),
                                 tuple(sum(work(a, n) for a, n in c) for c in chunks))
        if best is None or layout.imbalance < best.imbalance - margin:
            best = layout
    if best is None:
        raise ValueError(f"sequence length {seq_len} is not a positive multiple of {world_size} (no layout cuts it over "
                         f"{world_size} ranks); pad the sequence")
    return best.name if best.name in LAYOUTS else best


def _check_layout(layout):
    if isinstance(layout, ChunkLayout):
        return
    if layout == "auto":
        raise ValueError("layout: 'auto' needs the pattern; pass best_layout(pattern, seq_len, heads_q, heads_kv, "
                         "world_size=...) here and to shard (an attnjit.nn module's sequence_parallel(layout='auto') does it)")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)} or a ChunkLayout (balanced_layout), got {layout!r}")


def _parts(layout: str, world_size: int) -> int:
    """How many equal chunks a named layout cuts the sequence into: one per rank, or two (zigzag)."""
    return world_size if layout == "contiguous" else 2 * world_size


def chunks_of(seq_len: int, world_size: int, rank: int, layout="contiguous"):
    """The chunks rank `rank` holds, in local order, as (global start, length)."""
    if isinstance(layout, ChunkLayout):
        if layout.seq_len != seq_len or len(layout.chunks) != world_size:
            raise ValueError(f"layout {layout.name!r} was made for {layout.seq_len} rows over {len(layout.chunks)} ranks, "
                             f"not {seq_len} over {world_size}")
        return list(layout.chunks[rank])
    _check_layout(layout)
    parts = _parts(layout, world_size)
    if seq_len <= 0 or seq_len % parts:
        raise ValueError(f"sequence length {seq_len} is not a positive multiple of {parts} (layout {layout!r} over "
                         f"{world_size} ranks cuts it into {parts} equal chunks); pad the sequence")
    n = seq_len // parts
    if layout == "contiguous":
        return [(rank * n, n)]
    return [(rank * n, n), ((2 * world_size - 1 - rank) * n, n)]


def head_parallel_layout(seq_len: int, world_size: int, head_parallel: int, layout="contiguous"):
    """The layout of the ring inside head-parallel attention: with `head_parallel` = u, ranks
    g*u .. g*u + u - 1 (a head group) pool their rows under `layout` by one all_to_all, so ring rank g
    of world_size / u holds the chunks of those ranks, in rank order, for its share of the heads.
    "contiguous" stays "contiguous" (the pooled chunks are adjacent); any other layout becomes a
    ChunkLayout named after it. u = 1 returns `layout` itself."""
    u = int(head_parallel)
    if u < 1 or world_size % u:
        raise ValueError(f"head_parallel: expected a divisor of the world size {world_size}, got {head_parallel}")
    if u == 1 or layout == "contiguous":
        chunks_of(seq_len, world_size, 0, layout)  # a length the layout cannot cut fails here too
        return layout
    chunks = [[c for i in range(u) for c in chunks_of(seq_len, world_size, g * u + i, layout)]
              for g in range(world_size // u)]
    return ChunkLayout(f"{layout}/heads:{u}", seq_len, tuple(tuple(c) for c in chunks))


# Heavy rows: a query row whose attended pairs are over HEAVY_ROWS times the mean row's (BigBird's
# global rows, which attend every key) is computed by the ranks that hold its keys. Rows within
# HEAVY_GAP of each other are taken together, and a rank with more than HEAVY_RUNS such runs keeps
# every row at home (a kernel call per run and key chunk would cost more than it saves).
HEAVY_ROWS, HEAVY_GAP, HEAVY_RUNS = 4.0, 64, 8


def heavy_runs(row_pairs, chunks, factor=HEAVY_ROWS, gap=HEAVY_GAP, most=HEAVY_RUNS):
    """The runs of heavy rows of each rank: per rank, (chunk index, global start, length) of the
    rows whose entry of `row_pairs` (attended pairs per row, [seq_len]) is over `factor` times
    the mean, runs closer than `gap` rows joined, never across a chunk's edge. Empty everywhere
    when no row is that heavy, factor is None, or some rank would have more than `most` runs."""
    out = [[] for _ in chunks]
    mean = float(np.mean(row_pairs)) if len(row_pairs) else 0.0
    if factor is None or mean <= 0:
        return out
    heavy = np.asarray(row_pairs) > factor * mean
    for r, held in enumerate(chunks):
        for ci, (start, n) in enumerate(held):
            for i in map(int, np.flatnonzero(heavy[start:start + n])):
                if out[r] and out[r][-1][0] == ci and start + i - (out[r][-1][1] + out[r][-1][2]) < gap:
                    out[r][-1] = (ci, out[r][-1][1], start + i + 1 - out[r][-1][1])
                else:
                    out[r].append((ci, start + i, 1))
        if len(out[r]) > most:
            return [[] for _ in chunks]
    return out


class CommPlan:
    """What ring_attention computes and moves for one pattern, sequence, head count, world size and
    layout; the same on every rank. Made per pair of ranks on first use (a rank needs only the pairs
    it takes part in); `pairs` and `rows` give them all, print() shows them step by step.

    A rank's query rows are cut into pieces, (local start, length, global start), each inside one of
    its chunks. Home pieces (`home[r]`) are computed on their rank against the K/V rows it receives;
    away pieces (`away[r]`: heavy rows, see heavy_runs; none unless `heavy_rows` finds some) are
    sent, as Q, to every rank whose keys they attend, which computes them against its own K/V and
    returns partial (O, LSE) (dQ in the backward). Without heavy rows the home pieces are the chunks.

    `pairs[(qr, kr)]`: the (home piece, key chunk) index pairs of ranks qr and kr that attend
    anything; `rows[(qr, kr)]`: bool [heads_kv, S/W], the K/V rows of rank kr that rank qr's home
    pieces read (a pair with nothing to attend is absent from both); `visit(qr, kr)`: the (away
    piece, key chunk) pairs of qr's away pieces against kr's keys.

    Packed documents (`documents`: the boundaries 0, e_1, ..., S; each attends only itself, its
    positions restarting at 0): the pieces are cut at the boundaries too, a piece's kernels take
    its document's part of a key chunk, and positions are counted from the document's start
    (`call`); no heavy rows then. Finding heavy rows counts every
    row's pairs once per plan (linear in the rows, on every core: 0.3-1.7 s at 1M tokens and 16
    heads on two; plans are cached per shape)."""

    def __init__(self, spec: str, seq_len: int, heads_q: int, heads_kv: int, world_size: int, layout: str,
                 heavy_rows=HEAVY_ROWS, documents=None):
        self.spec = spec
        self.seq_len, self.heads_q, self.heads_kv = seq_len, heads_q, heads_kv
        self.world_size, self.layout, self.heavy_rows = world_size, layout, heavy_rows
        self.documents = None if documents is None else tuple(documents)
        self.chunks = [chunks_of(seq_len, world_size, r, layout) for r in range(world_size)]
        self.local_len = seq_len // world_size
        runs = [[] for _ in range(world_size)]
        if heavy_rows is not None and world_size > 1 and self.documents is None:
            runs = heavy_runs(_attnjit.row_pairs(spec, seq_len, heads_q, seq_len, heads_kv, 0, 0), self.chunks,
                              heavy_rows)
        self.home, self.away = [], []
        for r in range(world_size):
            home, away = [], []
            for ci, (start, n) in enumerate(self.chunks[r]):
                base, at = self.local_start(ci), start
                for _, rs, rn in (x for x in runs[r] if x[0] == ci):
                    if rs > at:
                        home += self._cut(base + at - start, rs - at, at)
                    away.append((base + rs - start, rn, rs))
                    at = rs + rn
                if at < start + n:
                    home += self._cut(base + at - start, start + n - at, at)
            self.home.append(home)
            self.away.append(away)
        self._pairs, self._visits = {}, {}
        self._ahead = {}  # steps_ahead, by rank
        self._units = {}  # _Ring's index tensors, by (rank, strategy), then by what and device

    def _cut(self, local, n, start):
        """Home pieces of rows [start, start + n) (at `local`): one, or one per document they touch."""
        if self.documents is None:
            return [(local, n, start)]
        out, at = [], start
        while at < start + n:
            end = min(start + n, self.document(at)[1])
            out.append((local + at - start, end - at, at))
            at = end
        return out

    def document(self, pos: int):
        """(start, end) of the document holding position `pos` ((0, S) without documents)."""
        if self.documents is None:
            return 0, self.seq_len
        i = bisect.bisect_right(self.documents, pos) - 1
        return self.documents[i], self.documents[i + 1]

    def call(self, qr: int, qi: int, kr: int, ki: int):
        """The kernel call of rank qr's home piece qi against rank kr's key chunk ki: (local query
        start, rows, q_offset, local key start, keys, k_offset), the offsets counted from the
        piece's document's start (global positions without documents); None when the chunk holds
        none of that document's keys."""
        la, n, qs = self.home[qr][qi]
        ks, kn = self.chunks[kr][ki]
        origin, end = self.document(qs)
        lo, hi = max(ks, origin), min(ks + kn, end)
        if lo >= hi:
            return None
        return la, n, qs - origin, self.local_start(ki) + lo - ks, hi - lo, lo - origin

    def pair(self, qr: int, kr: int):
        """(piece pairs, key rows read, {piece pair: query rows computed}) of rank qr's home pieces
        and rank kr's key chunks, or None when they attend nothing. Query rows: bool [rows,
        heads_q] of the piece, None when all."""
        if (qr, kr) not in self._pairs:
            need = np.zeros((self.heads_kv, self.local_len), dtype=bool)
            pairs, queries = [], {}
            for qi in range(len(self.home[qr])):
                for ki in range(len(self.chunks[kr])):
                    c = self.call(qr, qi, kr, ki)
                    if c is None:
                        continue
                    _, ql, qo, ka, kl, ko = c
                    read, computed = _attnjit.call_rows(self.spec, ql, self.heads_q, kl, self.heads_kv, qo, ko)
                    if read.any():
                        pairs.append((qi, ki))
                        need[:, ka:ka + kl] |= read.astype(bool)
                        computed = computed.astype(bool)
                        queries[(qi, ki)] = None if computed.all() else np.ascontiguousarray(computed.T)
            self._pairs[(qr, kr)] = (pairs, need, queries) if pairs else None
        return self._pairs[(qr, kr)]

    def visit(self, qr: int, kr: int):
        """[(away piece, key chunk, query rows computed)] of rank qr's away pieces against rank kr's
        key chunks that attend anything (query rows as in pair; None when all)."""
        if (qr, kr) not in self._visits:
            out = []
            for ai, (_, an, gs) in enumerate(self.away[qr]):
                for ki, (ks, kl) in enumerate(self.chunks[kr]):
                    read, computed = _attnjit.call_rows(self.spec, an, self.heads_q, kl, self.heads_kv, gs, ks)
                    if read.any():
                        computed = computed.astype(bool)
                        out.append((ai, ki, None if computed.all() else np.ascontiguousarray(computed.T)))
            self._visits[(qr, kr)] = out
        return self._visits[(qr, kr)]

    def away_offsets(self, rank: int):
        """Where each away piece of `rank` starts in the block of its away rows (the pieces one
        after another, as they are sent), and the block's length."""
        offsets, at = [], 0
        for _, n, _ in self.away[rank]:
            offsets.append(at)
            at += n
        return offsets, at

    @property
    def has_away(self) -> bool:
        return any(self.away)

    def work(self):
        """The attended pairs (per branch, over all heads) each rank computes: its home pieces
        against the whole sequence, and every rank's away pieces against its own keys."""
        def pairs(n, qs, kn, ks):
            return int(_attnjit.stats(self.spec, n, self.heads_q, kn, self.heads_kv, qs, ks)["attended_pairs"])

        out = []
        for r in range(self.world_size):
            total = sum(pairs(n, qs - self.document(qs)[0], self.document(qs)[1] - self.document(qs)[0], 0)
                        for _, n, qs in self.home[r])
            total += sum(pairs(n, qs, kn, ks) for other in range(self.world_size) for _, n, qs in self.away[other]
                         for ks, kn in self.chunks[r])
            out.append(total)
        return out

    def _all(self, index):
        w = self.world_size
        return {(q, k): self.pair(q, k)[index] for q in range(w) for k in range(w) if self.pair(q, k) is not None}

    @property
    def pairs(self):
        return self._all(0)

    @property
    def rows(self):
        return self._all(1)

    def local_start(self, chunk: int) -> int:
        """Where chunk `chunk` of a rank starts in its local tensor."""
        return sum(n for _, n in self.chunks[0][:chunk])

    def steps_ahead(self, rank: int) -> int:
        """How many steps' K/V transfers rank `rank` can have in flight within the bytes of its
        local K/V (each step's rows sent and received, at the largest of its steps), at least one
        and at most every step: what the ring's backward keeps in flight, agreed as the least over
        the ranks."""
        if rank in self._ahead:
            return self._ahead[rank]
        w, units = self.world_size, self.local_len * self.heads_kv

        def read(qr, kr):
            got = self.pair(qr, kr)
            return 0 if got is None else int(np.count_nonzero(got[1]))

        most = max((read((rank + s) % w, rank) + read(rank, (rank - s) % w) for s in range(1, w)), default=0)
        self._ahead[rank] = max(1, min(w - 1, units // most if most else w - 1))
        return self._ahead[rank]

    def query_rows(self, qr: int, kr: int) -> int:
        """(row, query head) units of rank qr that attend rank kr's keys, summed over their chunk
        pairs (each is one kernel call and one merge): what the step writes and merges."""
        got = self.pair(qr, kr)
        if got is None:
            return 0
        return int(sum(self.home[qr][qi][1] * self.heads_q if rows is None else rows.sum()
                       for (qi, _), rows in got[2].items()))

    def visiting_rows(self) -> int:
        """(row, query head) units of away pieces sent to other ranks in one forward (each comes back
        as partial O and LSE)."""
        return int(sum(self.away_offsets(qr)[1] * self.heads_q for qr in range(self.world_size)
                       for kr in range(self.world_size) if kr != qr and self.visit(qr, kr)))

    def moved_rows(self) -> int:
        """(row, kv head) units of K/V moved in one forward; a plain ring moves
        world_size * (world_size - 1) * S/W * heads_kv."""
        return int(sum(need.sum() for (qr, kr), need in self.rows.items() if qr != kr))

    def __str__(self):
        w, full = self.world_size, self.local_len * self.heads_kv
        lines = [f"; comm plan: {self.seq_len} rows over {w} ranks ({self.layout}), heads {self.heads_q}/{self.heads_kv}",
                 f"; chunks: " + "; ".join(f"rank {r} {', '.join(f'[{s}, {s + n})' for s, n in c)}"
                                          for r, c in enumerate(self.chunks))]
        if isinstance(self.layout, ChunkLayout) and self.layout.work:
            lines.append("; attended pairs per rank: " + ", ".join(f"r{r} {x}" for r, x in enumerate(self.layout.work))
                         + f" (imbalance {100.0 * self.layout.imbalance:.1f}%)")
        if self.has_away:
            lines.append("; heavy rows, computed where their keys are: " + "; ".join(
                f"rank {r} {', '.join(f'[{s}, {s + n})' for _, n, s in a)}" for r, a in enumerate(self.away) if a)
                + f" ({self.visiting_rows()} (row, query head) units sent out)")
        for s in range(w):
            cells = []
            for r in range(w):
                src = (r - s) % w
                got = self.pair(r, src)
                if got is None:
                    cells.append(f"r{r}<-r{src} -")
                else:
                    moved = "local" if s == 0 else f"{100.0 * got[1].sum() / full:.1f}% rows"
                    queries = 100.0 * self.query_rows(r, src) / (self.local_len * self.heads_q)
                    cells.append(f"r{r}<-r{src} {len(got[0])} pairs, {moved}, {queries:.1f}% queries")
            lines.append(f"step {s}: " + " | ".join(cells))
        ring = w * (w - 1) * full
        moved = self.moved_rows()
        lines.append(f"; K/V moved: {moved} of the {ring} (row, kv head) units a plain ring moves"
                     + (f" ({100.0 * moved / ring:.1f}%)" if ring else ""))
        return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=64)
def _cached_plan(spec, seq_len, heads_q, heads_kv, world_size, layout, heavy_rows=HEAVY_ROWS, documents=None):
    return CommPlan(spec, seq_len, heads_q, heads_kv, world_size, layout, heavy_rows, documents)


def check_documents(cu_seqlens, seq_len):
    """cu_seqlens as a tuple of boundaries 0, e_1, ..., seq_len (None when None), or a ValueError
    naming what is wrong."""
    if cu_seqlens is None:
        return None
    docs = tuple(documents_arg(cu_seqlens))
    if len(docs) < 2 or docs[0] != 0 or docs[-1] != seq_len or any(b < a for a, b in zip(docs, docs[1:])):
        shown = f"{list(docs[:4])}{' ...' if len(docs) > 4 else ''}{' ending at ' + str(docs[-1]) if docs else ''}"
        raise ValueError(f"cu_seqlens: expected non-decreasing boundaries from 0 to the whole sequence's length "
                         f"{seq_len} (FlashAttention's varlen, the same on every rank), got {shown}")
    return docs


def check_heavy_rows(heavy_rows):
    if heavy_rows is not None and not (isinstance(heavy_rows, (int, float)) and heavy_rows >= 1):
        raise ValueError(f"heavy_rows: expected a number >= 1 (rows over that many times the mean row's pairs are "
                         f"computed where their keys are) or None (every row at home), got {heavy_rows!r}")
    return None if heavy_rows is None else float(heavy_rows)


def comm_plan(pattern, seq_len: int, heads_q: int, heads_kv: int = None, *, world_size: int,
              layout: str = "contiguous", heavy_rows=HEAVY_ROWS, cu_seqlens=None) -> CommPlan:
    """The CommPlan of ring_attention for a pattern over `seq_len` rows on `world_size` ranks.
    `heavy_rows`: rows whose attended pairs are over this many times the mean row's are computed
    by the ranks holding their keys (heavy_runs); None keeps every row on its rank. `cu_seqlens`:
    packed documents over the whole sequence (global boundaries)."""
    p = as_pattern(pattern)
    heads_kv = heads_q if heads_kv is None else heads_kv
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    return _cached_plan(p.op_spec, int(seq_len), int(heads_q), int(heads_kv), int(world_size), layout,
                        check_heavy_rows(heavy_rows), check_documents(cu_seqlens, int(seq_len)))
