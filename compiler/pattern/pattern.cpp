// Pattern: shape-independent validation, shape checks, equality and the builder.
#include "compiler/pattern/pattern.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "compiler/pattern/pattern_validate.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {

bool Layout::operator==(const Layout& o) const {
  return kind == o.kind && bq == o.bq && bk == o.bk && local == o.local && blocks == o.blocks &&
         stride == o.stride && phase == o.phase && density == o.density && seed == o.seed &&
         head_base == o.head_base &&
         explicit_blocks == o.explicit_blocks && per_head == o.per_head && children == o.children;
}

bool Branch::operator==(const Branch& o) const {
  return segment == o.segment && dilation == o.dilation && offset == o.offset && heads == o.heads &&
         causal == o.causal && window == o.window && layout == o.layout;
}

bool Pattern::operator==(const Pattern& o) const {
  return combine == o.combine && group_scale == o.group_scale && scale == o.scale && branches == o.branches;
}

bool layout_has_kind(const Layout& l, Layout::Kind kind) {
  return l.kind == kind || std::any_of(l.children.begin(), l.children.end(),
                                       [kind](const Layout& c) { return layout_has_kind(c, kind); });
}

bool Pattern::has_layout_kind(Layout::Kind kind) const {
  return std::any_of(branches.begin(), branches.end(), [kind](const Branch& b) { return b.layout && layout_has_kind(*b.layout, kind); });
}

bool Pattern::has_dynamic_layout() const { return has_layout_kind(Layout::Kind::Dynamic); }

const char* to_string(Combine c) { return c == Combine::Softmax ? "softmax" : "head_groups"; }

const char* to_string(OffsetRule r) {
  switch (r) {
    case OffsetRule::HeadMod: return "head_mod";
    case OffsetRule::HeadBlock: return "head_block";
    case OffsetRule::Torchscale: return "torchscale";
    case OffsetRule::Group: return "group";
    case OffsetRule::Fixed: return "fixed";
  }
  return "?";
}

const char* to_string(Layout::Kind k) {
  switch (k) {
    case Layout::Kind::Local: return "local";
    case Layout::Kind::Global: return "global";
    case Layout::Kind::Strided: return "strided";
    case Layout::Kind::Offsets: return "offsets";
    case Layout::Kind::Random: return "random";
    case Layout::Kind::Explicit: return "explicit";
    case Layout::Kind::Union: return "union";
    case Layout::Kind::Intersect: return "intersect";
    case Layout::Kind::Dynamic: return "dynamic";
  }
  return "?";
}

double softmax_scale(const Pattern& p, const Shape& s) {
  return p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(s.head_dim));
}

// ---------------------------------------------------------------------------------------------
// Checks that need the shape.

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Explicit per_head lists must match the number of query heads.
static void check_layout_heads(const Layout& l, const Shape& s) {
  if (l.kind == Layout::Kind::Explicit && !l.per_head.empty() && static_cast<int64_t>(l.per_head.size()) != s.heads_q) {
    throw UserError(l.path + (l.from_bitmap ? "/explicit/per_head_bitmap" : "/explicit/per_head"), "has " + std::to_string(l.per_head.size()) +
                                                       " lists but the call has " + std::to_string(s.heads_q) +
                                                       " query heads; give one list per query head");
  }
  for (const Layout& c : l.children) check_layout_heads(c, s);
}

static void check_layout_blocks(const Layout& l, int64_t seq_q, int64_t seq_k) {
  const int64_t q_blocks = ceil_div(seq_q, l.bq), k_blocks = ceil_div(seq_k, l.bk);
  auto check_pairs = [&](const std::vector<Layout::BlockPair>& pairs, const std::string& where) {
    for (const auto& [qb, kb] : pairs) {
      if (qb >= q_blocks || kb >= k_blocks) {
        throw UserError(where, "block [" + std::to_string(qb) + ", " + std::to_string(kb) +
                                   "] lies outside the sequence: with block " + std::to_string(l.bq) + "x" +
                                   std::to_string(l.bk) + " there are " + std::to_string(q_blocks) +
                                   " query blocks and " + std::to_string(k_blocks) +
                                   " key blocks; remove the block or use a longer sequence");
      }
    }
  };
  if (l.kind == Layout::Kind::Explicit) {
    check_pairs(l.explicit_blocks, l.path + (l.from_bitmap ? "/explicit/bitmap" : "/explicit/blocks"));
    for (size_t h = 0; h < l.per_head.size(); ++h)
      check_pairs(l.per_head[h], l.path + (l.from_bitmap ? "/explicit/per_head_bitmap/" : "/explicit/per_head/") + std::to_string(h));
  }
  for (const Layout& c : l.children) check_layout_blocks(c, seq_q, seq_k);
}

void check_blocks_inside_sequence(const Pattern& p, int64_t seq_q, int64_t seq_k) {
  for (const Branch& b : p.branches)
    if (b.layout) check_layout_blocks(*b.layout, seq_q, seq_k);
}

void check_shape(const Shape& s, const std::string& prefix) {
  auto size = [&](int64_t v, const char* name) {
    if (v < 1) throw UserError(prefix + name, "must be at least 1, got " + std::to_string(v));
    if (v > kMaxSize) {
      throw UserError(prefix + name, std::to_string(v) + " is larger than attnjit supports (at most " +
                                         std::to_string(kMaxSize) + " = 2^31 - 1: plans and kernels count rows, "
                                         "tiles and heads in 32 bits); split the call into chunks with offsets");
    }
  };
  size(s.batch, "batch");
  size(s.seq_q, "seq_q");
  size(s.seq_k, "seq_k");
  size(s.heads_q, "heads_q");
  size(s.heads_kv, "heads_kv");
  size(s.head_dim, "head_dim");
  size(s.head_dim_v, "head_dim_v");
  // Sizes <= 2^31 - 1, so a product of three fits int128 and is checked before anything allocates.
  auto elements = [&](const char* tensors, const char* dims, int64_t seq, int64_t heads) {
    const __int128 n = static_cast<__int128>(s.batch) * seq * heads * std::max(s.head_dim, s.head_dim_v);
    if (n >= kMaxPosition) {
      throw UserError(prefix + "shape", std::string("the ") + tensors + " would hold " + dims +
                                            " = more than 2^62 elements; use a smaller shape or split the call "
                                            "into chunks with offsets");
    }
  };
  elements("queries", "batch * seq_q * heads_q * head_dim", s.seq_q, s.heads_q);
  elements("keys", "batch * seq_k * heads_kv * head_dim", s.seq_k, s.heads_kv);
  // Every position lies below kMaxPosition; offsets and lengths are checked as written, before
  // anything adds them.
  auto offset = [&](int64_t off, int64_t len, const char* name, const char* len_name) {
    if (off < 0) throw UserError(prefix + name, "must be >= 0, got " + std::to_string(off));
    if (off > kMaxPosition - len) {
      throw UserError(prefix + name, std::to_string(off) + " + " + len_name + " " + std::to_string(len) +
                                         " goes past the largest position attnjit supports (2^62 = " +
                                         std::to_string(kMaxPosition) + "); use an offset of at most " +
                                         std::to_string(kMaxPosition - len));
    }
  };
  offset(s.q_offset, s.seq_q, "q_offset", "seq_q");
  offset(s.k_offset, s.seq_k, "k_offset", "seq_k");
  if (s.heads_q % s.heads_kv != 0) {
    throw UserError(prefix + "heads_kv", std::to_string(s.heads_kv) + " does not divide heads_q " +
                                             std::to_string(s.heads_q) +
                                             "; each key/value head must serve the same number of query heads");
  }
}

void check_pattern_fits(const Pattern& p, const Shape& s) {
  check_shape(s, "");
  if (p.combine == Combine::HeadGroups && static_cast<int64_t>(p.branches.size()) > s.heads_q) {
    throw UserError("/branches", "head_groups needs one query head per branch at least, but there are " +
                                     std::to_string(p.branches.size()) + " branches and " +
                                     std::to_string(s.heads_q) + " query heads; use fewer branches or more heads");
  }
  for (const Branch& b : p.branches) {
    if (b.heads) {
      for (size_t n = 0; n < b.heads->size(); ++n) {
        const int64_t h = (*b.heads)[n];
        if (h >= s.heads_q) {
          throw UserError(b.path + "/heads/" + std::to_string(n),
                          "head " + std::to_string(h) + " is out of range: the call has " + std::to_string(s.heads_q) +
                              " query heads (0.." + std::to_string(s.heads_q - 1) + ")");
        }
      }
    }
    if (b.layout) check_layout_heads(*b.layout, s);
  }
}

// ---------------------------------------------------------------------------------------------
// Builder.

std::vector<Layout::BlockPair> blocks_from_bitmap(const std::vector<std::string>& rows, const std::string& where) {
  uint64_t kept = 0;
  for (const std::string& row : rows) kept += static_cast<uint64_t>(std::count(row.begin(), row.end(), '1'));
  check_explicit_block_count(kept, where);  // before storing any
  std::vector<Layout::BlockPair> out;
  out.reserve(kept);
  for (size_t qb = 0; qb < rows.size(); ++qb) {
    const std::string& row = rows[qb];
    for (size_t kb = 0; kb < row.size(); ++kb) {
      if (row[kb] == '1') {
        out.emplace_back(static_cast<int64_t>(qb), static_cast<int64_t>(kb));
      } else if (row[kb] != '0') {
        const unsigned char c = static_cast<unsigned char>(row[kb]);
        const std::string shown = c >= 0x20 && c < 0x7f ? "'" + std::string(1, row[kb]) + "'" : "byte " + std::to_string(c);
        throw UserError(where + "/" + std::to_string(qb), "character " + std::to_string(kb) + " is " + shown +
                                                              "; a bitmap row has '1' (block kept) and '0' (not kept) only");
      }
    }
  }
  return out;
}

namespace layouts {
static Layout make(Layout::Kind k, int64_t bq, int64_t bk) {
  Layout l;
  l.kind = k;
  l.bq = bq;
  l.bk = bk;
  return l;
}
Layout local(int64_t d, int64_t bq, int64_t bk) { Layout l = make(Layout::Kind::Local, bq, bk); l.local = d; return l; }
Layout global(std::vector<int64_t> b, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Global, bq, bk); l.blocks = std::move(b); return l;
}
Layout strided(int64_t stride, int64_t phase, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Strided, bq, bk); l.stride = stride; l.phase = phase; return l;
}
Layout offsets(std::vector<int64_t> d, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Offsets, bq, bk); l.blocks = std::move(d); return l;
}
Layout random(double density, uint64_t seed, int64_t bq, int64_t bk, int64_t head_base) {
  Layout l = make(Layout::Kind::Random, bq, bk); l.density = density; l.seed = seed; l.head_base = head_base; return l;
}
Layout explicit_blocks(std::vector<Layout::BlockPair> b, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Explicit, bq, bk); l.explicit_blocks = std::move(b); return l;
}
Layout explicit_per_head(std::vector<std::vector<Layout::BlockPair>> ph, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Explicit, bq, bk); l.per_head = std::move(ph); return l;
}
Layout explicit_bitmap(const std::vector<std::string>& rows, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Explicit, bq, bk);
  l.explicit_blocks = blocks_from_bitmap(rows, "bitmap");
  l.from_bitmap = true;
  return l;
}
Layout explicit_per_head_bitmap(const std::vector<std::vector<std::string>>& ph, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Explicit, bq, bk);
  for (size_t h = 0; h < ph.size(); ++h) l.per_head.push_back(blocks_from_bitmap(ph[h], "per_head_bitmap/" + std::to_string(h)));
  l.from_bitmap = true;
  return l;
}
Layout hierarchical(const std::vector<HierarchyLevel>& levels, int64_t bq, int64_t bk, const std::string& where) {
  if (levels.empty()) throw UserError(where, "needs at least one level {\"window\": w, \"stride\": s, \"block\": b}");
  Layout l = make(Layout::Kind::Union, bq, bk);
  for (size_t n = 0; n < levels.size(); ++n) {
    const HierarchyLevel& v = levels[n];
    const std::string at = where + "/" + std::to_string(n);
    if (v.window < -1) {
      throw UserError(at + "/window", "must be -1 (unbounded) or a block distance >= 0, got " + std::to_string(v.window));
    }
    if (v.stride < 1) {
      throw UserError(at + "/stride", "must be >= 1 (key block kb is kept iff kb mod stride == 0), got " +
                                          std::to_string(v.stride));
    }
    if (v.stride >= kMaxPosition) {
      throw UserError(at + "/stride", "stride " + std::to_string(v.stride) + " is beyond the largest position attnjit "
                                          "supports (2^62); use a stride below 2^62");
    }
    Layout strided = make(Layout::Kind::Strided, v.bq, v.bk);
    strided.stride = v.stride;
    strided.path = at;
    // A window of 2^62 blocks or more reaches every block (pattern.hpp, kMaxPosition): unbounded.
    if (v.window < 0 || v.window >= kMaxPosition) {
      l.children.push_back(std::move(strided));
      continue;
    }
    Layout local = make(Layout::Kind::Local, v.bq, v.bk);
    local.local = v.window;
    local.path = at;
    Layout both = make(Layout::Kind::Intersect, v.bq, v.bk);
    both.children = {std::move(local), std::move(strided)};
    both.path = at;
    l.children.push_back(std::move(both));
  }
  return l;
}
Layout union_of(std::vector<Layout> c, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Union, bq, bk); l.children = std::move(c); return l;
}
Layout intersect_of(std::vector<Layout> c, int64_t bq, int64_t bk) {
  Layout l = make(Layout::Kind::Intersect, bq, bk); l.children = std::move(c); return l;
}
Layout dynamic(int64_t bq, int64_t bk) { return make(Layout::Kind::Dynamic, bq, bk); }
}  // namespace layouts

Pattern PatternBuilder::build() const {
  UnresolvedPattern u;
  u.combine = combine_;
  u.group_scale = group_scale_;
  u.scale = scale_;
  u.causal = causal_;
  u.window = window_;
  u.layout = layout_;
  for (const BranchSpec& b : branches_) {
    UnresolvedBranch ub;
    ub.segment = b.segment_;
    ub.dilation = b.dilation_;
    ub.offset = b.offset_;
    ub.heads = b.heads_;
    ub.causal = b.causal_;
    ub.window = b.window_;
    ub.layout = b.layout_;
    u.branches.push_back(std::move(ub));
  }
  return resolve_and_validate(std::move(u));
}

}  // namespace attnjit
