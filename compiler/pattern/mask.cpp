// The mask semantics (docs/spec.md).
#include "compiler/pattern/mask.hpp"

#include <algorithm>
#include <numeric>

#include "compiler/pattern/random_layout.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {
namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Positions [segment_start(p), segment_start(p) + w) form p's segment; "full" is one segment from 0.
int64_t segment_start(const Branch& br, int64_t pos) { return br.segment ? pos / *br.segment * *br.segment : 0; }

bool dynamic_allows(const Layout& l, int64_t h, int64_t qb, int64_t kb, const DynamicLayout* d) {
  if (!d) {
    throw UserError(l.path + "/dynamic", "this layout is given at run time, but no table was supplied; "
                                         "pass its CSR table (CLI: --dynamic FILE)");
  }
  if (d->standin == DynamicLayout::Standin::EveryBlock) return true;
  const int64_t q_blocks = (static_cast<int64_t>(d->row_offsets.size()) - 1) / d->heads;
  if (qb >= q_blocks) return false;  // check_dynamic_layout() makes this unreachable for valid calls
  if (kb > INT32_MAX) return false;  // the table's key blocks are int32: never listed
  const int64_t row = (d->heads == 1 ? 0 : h) * q_blocks + qb;
  const auto begin = d->col_indices.begin() + d->row_offsets[row];
  const auto end = d->col_indices.begin() + d->row_offsets[row + 1];
  return std::binary_search(begin, end, static_cast<int32_t>(kb));
}

void collect_dynamic(const Layout& l, std::vector<const Layout*>& out) {
  if (l.kind == Layout::Kind::Dynamic) out.push_back(&l);
  for (const Layout& c : l.children) collect_dynamic(c, out);
}

}  // namespace

int64_t head_group(int64_t h, int64_t heads_q, int64_t groups) {
  const int64_t base = heads_q / groups, extra = heads_q % groups;
  // The first `extra` groups hold base + 1 heads each.
  if (h < extra * (base + 1)) return h / (base + 1);
  return extra + (h - extra * (base + 1)) / base;
}

bool branch_has_head(const Pattern& p, size_t b, int64_t h, int64_t heads_q) {
  if (p.combine == Combine::HeadGroups) return head_group(h, heads_q, static_cast<int64_t>(p.branches.size())) == static_cast<int64_t>(b);
  const auto& heads = p.branches[b].heads;
  return !heads || std::binary_search(heads->begin(), heads->end(), h);
}

int64_t branch_offset(const Branch& br, int64_t h, int64_t heads_q) {
  switch (br.offset.rule) {
    case OffsetRule::HeadMod: return h % br.dilation;
    case OffsetRule::HeadBlock:  // h * r reaches 2^93 for sizes and dilations below their limits
      return static_cast<int64_t>(static_cast<__int128>(h) * br.dilation / heads_q);
    case OffsetRule::Torchscale: {  // torchscale pads the heads to a multiple of r: ceil(Hq/r) per offset
      const int64_t per = heads_q / br.dilation + (heads_q % br.dilation != 0);
      return h / per;
    }
    case OffsetRule::Fixed: return br.offset.value;
    case OffsetRule::Group: break;  // resolved to Fixed when the pattern is built
  }
  ATTNJIT_CHECK(false, "offset rule 'group' survived pattern resolution");
}

bool position_selected(const Branch& br, int64_t off, int64_t pos) {
  return (pos - segment_start(br, pos)) % br.dilation == off;
}

bool layout_allows(const Layout& l, int64_t h, int64_t qpos, int64_t kpos, const DynamicLayout* dynamic) {
  const int64_t qb = qpos / l.bq, kb = kpos / l.bk;
  switch (l.kind) {
    case Layout::Kind::Local: return std::abs(kb - qb) <= l.local;
    case Layout::Kind::Global:
      return std::binary_search(l.blocks.begin(), l.blocks.end(), qb) || std::binary_search(l.blocks.begin(), l.blocks.end(), kb);
    case Layout::Kind::Strided: return kb % l.stride == l.phase;
    case Layout::Kind::Offsets: return std::binary_search(l.blocks.begin(), l.blocks.end(), kb - qb);
    case Layout::Kind::Random:
      return random_block_kept(l.seed, l.density, static_cast<uint64_t>(l.head_base + h), static_cast<uint64_t>(qb), static_cast<uint64_t>(kb));
    case Layout::Kind::Explicit: {
      const auto& pairs = l.per_head.empty() ? l.explicit_blocks : l.per_head.at(static_cast<size_t>(h));
      return std::binary_search(pairs.begin(), pairs.end(), Layout::BlockPair{qb, kb});
    }
    case Layout::Kind::Union:
      return std::any_of(l.children.begin(), l.children.end(),
                         [&](const Layout& c) { return layout_allows(c, h, qpos, kpos, dynamic); });
    case Layout::Kind::Intersect:
      return std::all_of(l.children.begin(), l.children.end(),
                         [&](const Layout& c) { return layout_allows(c, h, qpos, kpos, dynamic); });
    case Layout::Kind::Dynamic: return dynamic_allows(l, h, qb, kb, dynamic);
  }
  return false;
}

namespace {

// Appends [a, b) clipped to [lo, hi) to `out`, whose intervals end at or before a; touching or
// overlapping the last one extends it.
void push_interval(std::vector<KeyInterval>& out, int64_t a, int64_t b, int64_t lo, int64_t hi) {
  a = std::max(a, lo), b = std::min(b, hi);
  if (a >= b) return;
  if (!out.empty() && a <= out.back().end) {
    out.back().end = std::max(out.back().end, b);
    return;
  }
  out.push_back({a, b});
}

// Key blocks kb (block size bk) whose positions meet [lo, hi): kb in [lo / bk, (hi - 1) / bk].
struct BlockRange {
  int64_t first, last;
};
BlockRange key_blocks(int64_t lo, int64_t hi, int64_t bk) { return {lo / bk, (hi - 1) / bk}; }

}  // namespace

void union_key_intervals(std::vector<KeyInterval>& acc, const std::vector<KeyInterval>& more, std::vector<KeyInterval>& scratch) {
  scratch.clear();
  size_t i = 0, j = 0;
  while (i < acc.size() || j < more.size()) {
    const KeyInterval& next = j == more.size() || (i < acc.size() && acc[i].begin <= more[j].begin) ? acc[i++] : more[j++];
    push_interval(scratch, next.begin, next.end, next.begin, next.end);
  }
  acc.swap(scratch);
}

void intersect_key_intervals(std::vector<KeyInterval>& acc, const std::vector<KeyInterval>& more, std::vector<KeyInterval>& scratch) {
  scratch.clear();
  for (size_t i = 0, j = 0; i < acc.size() && j < more.size();) {
    const int64_t a = std::max(acc[i].begin, more[j].begin), b = std::min(acc[i].end, more[j].end);
    if (a < b) scratch.push_back({a, b});  // pieces of disjoint, gapped lists stay disjoint and gapped
    (acc[i].end < more[j].end ? i : j)++;
  }
  acc.swap(scratch);
}

void layout_key_intervals(const Layout& l, int64_t h, int64_t qpos, int64_t lo, int64_t hi, const DynamicLayout* dynamic,
                          std::vector<KeyInterval>& out) {
  out.clear();
  if (lo >= hi) return;
  const int64_t qb = qpos / l.bq, bk = l.bk;
  const BlockRange r = key_blocks(lo, hi, bk);
  auto block = [&](int64_t kb) { push_interval(out, kb * bk, (kb + 1) * bk, lo, hi); };
  switch (l.kind) {
    case Layout::Kind::Local: {
      // Clipped to the key blocks in range before scaling: (qb +- local) * bk could leave int64.
      const int64_t first = std::max(qb - l.local, r.first), last = std::min(qb + l.local, r.last);
      if (first <= last) push_interval(out, first * bk, (last + 1) * bk, lo, hi);
      return;
    }
    case Layout::Kind::Global:
      if (std::binary_search(l.blocks.begin(), l.blocks.end(), qb)) return push_interval(out, lo, hi, lo, hi);
      for (int64_t kb : l.blocks)
        if (kb >= r.first && kb <= r.last) block(kb);
      return;
    case Layout::Kind::Strided: {
      if (l.stride == 1) return push_interval(out, lo, hi, lo, hi);
      const int64_t first = r.first + ((l.phase - r.first) % l.stride + l.stride) % l.stride;
      for (int64_t kb = first; kb <= r.last; kb += l.stride) block(kb);
      return;
    }
    case Layout::Kind::Offsets:
      for (int64_t off : l.blocks)
        if (qb + off >= r.first && qb + off <= r.last) block(qb + off);
      return;
    case Layout::Kind::Random: {
      const RandomBlockRow row(l.seed, l.density, static_cast<uint64_t>(l.head_base + h), static_cast<uint64_t>(qb));
      for (int64_t kb = r.first; kb <= r.last; ++kb)
        if (row.kept(static_cast<uint64_t>(kb))) block(kb);
      return;
    }
    case Layout::Kind::Explicit: {
      const auto& pairs = l.per_head.empty() ? l.explicit_blocks : l.per_head.at(static_cast<size_t>(h));
      for (auto it = std::lower_bound(pairs.begin(), pairs.end(), Layout::BlockPair{qb, r.first});
           it != pairs.end() && it->first == qb && it->second <= r.last; ++it)
        block(it->second);
      return;
    }
    case Layout::Kind::Dynamic: {
      if (!dynamic) dynamic_allows(l, h, qb, 0, dynamic);  // throws the "no table" error
      if (dynamic->standin == DynamicLayout::Standin::EveryBlock) return push_interval(out, lo, hi, lo, hi);
      const int64_t q_blocks = (static_cast<int64_t>(dynamic->row_offsets.size()) - 1) / dynamic->heads;
      if (qb >= q_blocks || r.first > INT32_MAX) return;  // key blocks past int32 are never listed
      const int64_t row = (dynamic->heads == 1 ? 0 : h) * q_blocks + qb;
      const auto end = dynamic->col_indices.begin() + dynamic->row_offsets[static_cast<size_t>(row + 1)];
      for (auto it = std::lower_bound(dynamic->col_indices.begin() + dynamic->row_offsets[static_cast<size_t>(row)], end,
                                      static_cast<int32_t>(r.first));
           it != end && *it <= r.last; ++it)
        block(*it);
      return;
    }
    case Layout::Kind::Union:
    case Layout::Kind::Intersect: {
      std::vector<KeyInterval> child, scratch;
      for (size_t c = 0; c < l.children.size(); ++c) {
        layout_key_intervals(l.children[c], h, qpos, lo, hi, dynamic, c == 0 ? out : child);
        if (c == 0) continue;
        if (l.kind == Layout::Kind::Union) union_key_intervals(out, child, scratch);
        else intersect_key_intervals(out, child, scratch);
        if (l.kind == Layout::Kind::Intersect && out.empty()) return;
      }
      return;
    }
  }
}

DocumentOfRow document_of_row(const MaskContext& c, int64_t i) {
  if (!c.documents) return {c, 0};
  const std::vector<int64_t>& cu = *c.documents;
  // The last document starting at or before i that is not empty.
  const size_t d = static_cast<size_t>(std::upper_bound(cu.begin(), cu.end(), i) - cu.begin()) - 1;
  Shape s = c.shape;
  s.seq_q = s.seq_k = cu[d + 1] - cu[d];
  s.q_offset = s.k_offset = 0;
  return {MaskContext{c.pattern, s, c.dynamic, nullptr}, cu[d]};
}

void check_documents(const Pattern& p, const Shape& s, const std::vector<int64_t>& cu, bool has_dynamic_table,
                     const std::string& source) {
  if (cu.size() < 2) throw UserError(source, "needs at least two entries (0 and the sequence length), got " + std::to_string(cu.size()));
  if (cu.front() != 0) throw UserError(source, "must start at 0, got " + std::to_string(cu.front()));
  for (size_t d = 1; d < cu.size(); ++d) {
    if (cu[d] < cu[d - 1]) {
      throw UserError(source, "must not decrease: entry " + std::to_string(d) + " is " + std::to_string(cu[d]) +
                                  " after " + std::to_string(cu[d - 1]) + " (document lengths are differences)");
    }
  }
  if (s.batch != 1) {
    throw UserError(source, "packed documents are one sequence: batch must be 1, got " + std::to_string(s.batch) +
                                "; concatenate the batch along the sequence");
  }
  if (s.seq_q != s.seq_k) {
    throw UserError(source, "packed documents need seq_q == seq_k (one sequence), got " + std::to_string(s.seq_q) + " and " +
                                std::to_string(s.seq_k));
  }
  if (cu.back() != s.seq_q) {
    throw UserError(source, "must end at the sequence length " + std::to_string(s.seq_q) + ", got " + std::to_string(cu.back()));
  }
  if (s.q_offset != 0 || s.k_offset != 0) {
    throw UserError(source, "cannot be combined with offsets (positions restart at 0 in every document); "
                            "drop the offsets or the documents");
  }
  if (p.has_dynamic_layout() || has_dynamic_table) {
    throw UserError(source, "packed documents with a dynamic layout are not supported yet; run the documents as "
                            "separate calls");
  }
}

std::vector<int64_t> parse_cu_seqlens(const std::string& text, const std::string& source) {
  if (text.empty()) {
    throw UserError(source, "is empty; give a comma-separated list of cumulative lengths 0,e_1,...,S, e.g. "
                            "0,37,37,101,150, or leave the option out");
  }
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) {
      throw UserError(source, "'" + printable(text) + "' is not a comma-separated list of non-negative integers, e.g. 0,37,37,101,150");
    }
    // Every entry is a row of one sequence, so at most kMaxSize; more digits than that has is past it.
    const size_t digits = item.size() - std::min(item.find_first_not_of('0'), item.size());
    if (digits > 10 || std::stoll(item) > kMaxSize) {
      throw UserError(source, "entry " + std::to_string(out.size()) + " is " + printable(item) +
                                  ", past the largest sequence length " + std::to_string(kMaxSize) + " (2^31 - 1)");
    }
    out.push_back(std::stoll(item));
    at = comma + 1;
  }
  return out;
}

namespace {

constexpr int64_t kMaxPeriod = int64_t{1} << 40;

// lcm(a, b), or nullopt at kMaxPeriod and beyond (a period that long shares no plans anyway).
std::optional<int64_t> period_lcm(std::optional<int64_t> a, std::optional<int64_t> b) {
  if (!a || !b) return std::nullopt;
  const int64_t step = *b / std::gcd(*a, *b);
  if (step >= kMaxPeriod / *a) return std::nullopt;
  return *a * step;
}

std::optional<int64_t> layout_period(const Layout& l) {
  switch (l.kind) {
    case Layout::Kind::Local:
    case Layout::Kind::Offsets:  // kb - qb: moves with a joint shift unless both blocks are equal
      if (l.bq != l.bk) return std::nullopt;
      return l.bq;
    case Layout::Kind::Strided:  // kb % stride: a shift of P moves kb by P / bk, a multiple of the stride
      if (l.stride >= kMaxPeriod / l.bk) return std::nullopt;
      return period_lcm(l.bq, l.bk * l.stride);
    case Layout::Kind::Union:
    case Layout::Kind::Intersect: {
      std::optional<int64_t> p = period_lcm(l.bq, l.bk);  // the node's own blocks too, to be safe
      for (const Layout& c : l.children) p = period_lcm(p, layout_period(c));
      return p;
    }
    case Layout::Kind::Global:
    case Layout::Kind::Random:
    case Layout::Kind::Explicit:
    case Layout::Kind::Dynamic: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> translation_period(const Pattern& p) {
  std::optional<int64_t> period = 1;
  for (const Branch& br : p.branches) {
    // Selection: the in-segment index modulo the dilation. A segment moves with a shift by its
    // length (and the index with it); without one the position itself is taken modulo the rate.
    period = period_lcm(period, br.segment ? *br.segment : br.dilation);
    if (br.layout) period = period_lcm(period, layout_period(*br.layout));
  }
  return period;
}

bool branch_attends(const MaskContext& c, size_t b, int64_t h, int64_t i, int64_t j) {
  if (c.documents) {
    const DocumentOfRow d = document_of_row(c, i);
    if (j < d.start || j >= d.start + d.context.shape.seq_k) return false;
    return branch_attends(d.context, b, h, i - d.start, j - d.start);
  }
  const Branch& br = c.pattern.branches[b];
  if (!branch_has_head(c.pattern, b, h, c.shape.heads_q)) return false;
  const int64_t qpos = c.shape.q_offset + i, kpos = c.shape.k_offset + j;
  const int64_t off = branch_offset(br, h, c.shape.heads_q);
  if (segment_start(br, qpos) != segment_start(br, kpos)) return false;
  if (!position_selected(br, off, qpos) || !position_selected(br, off, kpos)) return false;
  if (br.causal && kpos > qpos) return false;
  if (br.window.left >= 0 && kpos < qpos - br.window.left) return false;
  if (br.window.right >= 0 && kpos > qpos + br.window.right) return false;
  return !br.layout || layout_allows(*br.layout, h, qpos, kpos, c.dynamic);
}

int attend_count(const MaskContext& c, int64_t h, int64_t i, int64_t j) {
  int n = 0;
  for (size_t b = 0; b < c.pattern.branches.size(); ++b) n += branch_attends(c, b, h, i, j);
  return n;
}

KeyProgression branch_key_candidates(const MaskContext& c, size_t b, int64_t h, int64_t i) {
  if (c.documents) {
    const DocumentOfRow d = document_of_row(c, i);
    KeyProgression kp = branch_key_candidates(d.context, b, h, i - d.start);
    kp.first += d.start, kp.last += d.start;
    return kp;
  }
  const Branch& br = c.pattern.branches[b];
  KeyProgression none;
  if (!branch_has_head(c.pattern, b, h, c.shape.heads_q)) return none;
  const int64_t qpos = c.shape.q_offset + i;
  const int64_t off = branch_offset(br, h, c.shape.heads_q);
  if (!position_selected(br, off, qpos)) return none;
  // Intersect the intervals allowed by the sequence, the segment, causality and the window.
  const int64_t seg = segment_start(br, qpos);
  int64_t lo = std::max(c.shape.k_offset, seg);
  int64_t hi = c.shape.k_offset + c.shape.seq_k - 1;
  if (br.segment) hi = std::min(hi, seg + *br.segment - 1);
  if (br.causal) hi = std::min(hi, qpos);
  if (br.window.left >= 0) lo = std::max(lo, qpos - br.window.left);
  if (br.window.right >= 0) hi = std::min(hi, qpos + br.window.right);
  // Selected keys are seg + off + k * dilation.
  const int64_t base = seg + off;
  const int64_t first = base + std::max<int64_t>(0, ceil_div(lo - base, br.dilation)) * br.dilation;
  if (first > hi) return none;
  const int64_t last = first + floor_div(hi - first, br.dilation) * br.dilation;
  return KeyProgression{first - c.shape.k_offset, last - c.shape.k_offset, br.dilation};
}

int64_t branch_key_count(const MaskContext& c, size_t b, int64_t h, int64_t i) {
  if (c.documents) {
    const DocumentOfRow d = document_of_row(c, i);
    return branch_key_count(d.context, b, h, i - d.start);
  }
  const KeyProgression kp = branch_key_candidates(c, b, h, i);
  const Branch& br = c.pattern.branches[b];
  if (kp.empty() || !br.layout) return kp.count();
  // The intervals the layout keeps over the candidates' span (in time proportional to them), and
  // the progression's members inside each.
  const int64_t qpos = c.shape.q_offset + i, koff = c.shape.k_offset;
  std::vector<KeyInterval> kept;
  layout_key_intervals(*br.layout, h, qpos, koff + kp.first, koff + kp.last + 1, c.dynamic, kept);
  int64_t total = 0;
  for (const KeyInterval& iv : kept) {
    const int64_t lo = iv.begin - koff, hi = iv.end - 1 - koff;  // inside [kp.first, kp.last]
    const int64_t first = kp.first + ceil_div(lo - kp.first, kp.step) * kp.step;
    if (first <= hi) total += (hi - first) / kp.step + 1;
  }
  return total;
}

const DynamicLayout& DynamicLayout::every_block() {
  static const DynamicLayout d{1, {}, {}, Standin::EveryBlock};
  return d;
}

int64_t sanitize_dynamic_table(const int64_t* row_offsets, int64_t rows, const int32_t* col_indices, int64_t n,
                               int64_t k_blocks, DynamicLayout& out) {
  int64_t problems = 0;
  out.row_offsets.assign(1, 0);
  out.col_indices.clear();
  if (rows >= 0 && (row_offsets[0] != 0 || row_offsets[rows] != n)) ++problems;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t raw_begin = row_offsets[r], raw_end = row_offsets[r + 1];
    if (raw_begin < 0 || raw_begin > n || raw_end < raw_begin || raw_end > n) ++problems;
    const int64_t begin = std::clamp<int64_t>(raw_begin, 0, n), end = std::clamp<int64_t>(raw_end, begin, n);
    int64_t last = -1;
    for (int64_t e = begin; e < end; ++e) {
      const int64_t kb = col_indices[e];
      if (kb < 0 || kb >= k_blocks || kb <= last) {
        ++problems;
        continue;
      }
      out.col_indices.push_back(static_cast<int32_t>(kb));
      last = kb;
    }
    out.row_offsets.push_back(static_cast<int64_t>(out.col_indices.size()));
  }
  return problems;
}

namespace {
std::vector<const Layout*> dynamic_nodes(const Pattern& p) {
  std::vector<const Layout*> nodes;
  for (const Branch& br : p.branches)
    if (br.layout) collect_dynamic(*br.layout, nodes);
  return nodes;
}
}  // namespace

int64_t dynamic_key_blocks(const Pattern& p, const Shape& s) {
  int64_t k_blocks = -1;
  for (const Layout* l : dynamic_nodes(p)) {
    const int64_t n = ceil_div(s.k_offset + s.seq_k, l->bk);
    k_blocks = k_blocks < 0 ? n : std::min(k_blocks, n);
  }
  return std::max<int64_t>(k_blocks, 0);
}

int64_t dynamic_query_blocks(const Pattern& p, const Shape& s) {
  int64_t q_blocks = -1;
  for (const Layout* l : dynamic_nodes(p)) {
    const int64_t n = ceil_div(s.q_offset + s.seq_q, l->bq);
    if (q_blocks >= 0 && n != q_blocks) {
      throw UserError(l->path, "the dynamic layouts of a pattern share one table, so they need the same query block size "
                               "(their row counts differ: " + std::to_string(q_blocks) + " and " + std::to_string(n) + ")");
    }
    q_blocks = n;
  }
  return std::max<int64_t>(q_blocks, 0);
}

void check_dynamic_layout(const Pattern& p, const Shape& s, const DynamicLayout& d, const std::string& source) {
  const std::vector<const Layout*> nodes = dynamic_nodes(p);
  if (nodes.empty()) throw UserError(source, "a dynamic layout table was given, but the pattern has no \"dynamic\" layout");
  if (d.heads != 1 && d.heads != s.heads_q) {
    throw UserError(source, "has tables for " + std::to_string(d.heads) + " heads; give 1 (shared) or one per query head (" +
                                std::to_string(s.heads_q) + ")");
  }
  const int64_t k_blocks_any = s.k_offset + s.seq_k;
  for (const Layout* l : nodes) {
    const int64_t q_blocks = ceil_div(s.q_offset + s.seq_q, l->bq), k_blocks = ceil_div(k_blocks_any, l->bk);
    // heads * q_blocks can pass int64 (q_blocks < 2^62), so it is compared by division.
    const int64_t given = static_cast<int64_t>(d.row_offsets.size()) - 1;
    if (given % d.heads != 0 || given / d.heads != q_blocks) {
      const __int128 want = static_cast<__int128>(d.heads) * q_blocks + 1;
      throw UserError(source, "row_offsets has " + std::to_string(d.row_offsets.size()) + " entries; " + l->path +
                                  " needs heads * query_blocks + 1 = " + std::to_string(d.heads) + " * " +
                                  std::to_string(q_blocks) + " + 1" +
                                  (want < INT64_MAX ? " = " + std::to_string(static_cast<int64_t>(want)) : std::string()));
    }
    const int64_t rows = given;
    if (d.row_offsets.front() != 0 || d.row_offsets.back() != static_cast<int64_t>(d.col_indices.size())) {
      throw UserError(source, "row_offsets must start at 0 and end at the number of col_indices (" +
                                  std::to_string(d.col_indices.size()) + ")");
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (d.row_offsets[r + 1] < d.row_offsets[r])
        throw UserError(source, "row_offsets decreases at row " + std::to_string(r) + "; offsets must be non-decreasing");
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = d.row_offsets[r], e = d.row_offsets[r + 1];
      for (int64_t n = b; n < e; ++n) {
        const int64_t kb = d.col_indices[n];
        if (kb < 0 || kb >= k_blocks) {
          throw UserError(source, "row " + std::to_string(r) + " names key block " + std::to_string(kb) +
                                      ", outside [0, " + std::to_string(k_blocks) + ")");
        }
        if (n > b && d.col_indices[n - 1] >= kb) {
          throw UserError(source, "row " + std::to_string(r) + " is not sorted (or repeats a block) at key block " +
                                      std::to_string(kb) + "; list each row's key blocks in increasing order");
        }
      }
    }
  }
}

}  // namespace attnjit
