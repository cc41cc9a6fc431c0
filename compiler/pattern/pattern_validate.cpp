// Default resolution and shape-independent checks for Patterns.
#include "compiler/pattern/pattern_validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compiler/support/error.hpp"

namespace attnjit {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Shortest round-trip form of a double, as written in JSON ("1.5", "-0.1", "1e-09"), not to_string's "1.500000".
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <typename T>
void sort_unique(std::vector<T>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// Lengths, block sizes, block indices and distances lie below kMaxPosition (pattern.hpp), so a
// position plus any of them stays inside int64.
void check_below_limit(int64_t v, const std::string& path, const std::string& what, const std::string& fix) {
  if (v >= kMaxPosition || v <= -kMaxPosition) {
    throw UserError(path, what + " " + str(v) + " is beyond the largest position attnjit supports (2^62 = " +
                              str(kMaxPosition) + "); " + fix);
  }
}

// An extent of kMaxPosition or more reaches past any position: the same as unbounded, stored as
// -1 so both spellings mean, print and hash the same.
Window resolve_window(Window w, const std::string& path) {
  if (w.left < -1) throw UserError(path + "/0", "left extent " + str(w.left) + " is below -1; use -1 for unbounded or a value >= 0");
  if (w.right < -1) throw UserError(path + "/1", "right extent " + str(w.right) + " is below -1; use -1 for unbounded or a value >= 0");
  if (w.left >= kMaxPosition) w.left = -1;
  if (w.right >= kMaxPosition) w.right = -1;
  return w;
}

}  // namespace

void check_explicit_block_count(uint64_t n, const std::string& where) {
  if (n <= static_cast<uint64_t>(kExplicitBlocksCap)) return;
  throw UserError(where, "lists " + std::to_string(n) + " blocks; an explicit layout lists at most " +
                             std::to_string(kExplicitBlocksCap) + " (2^20) over all its heads; give a larger one at "
                             "run time as a dynamic layout (a CSR table) or build it from generators (local, global, "
                             "strided, union, ...)");
}

namespace {

void check_block_pairs(std::vector<Layout::BlockPair>& pairs, const std::string& path) {
  for (size_t n = 0; n < pairs.size(); ++n) {
    if (pairs[n].first < 0 || pairs[n].second < 0) {
      throw UserError(path + "/" + std::to_string(n), "block indices must be >= 0, got [" + str(pairs[n].first) +
                                                          ", " + str(pairs[n].second) + "]");
    }
    check_below_limit(std::max(pairs[n].first, pairs[n].second), path + "/" + std::to_string(n), "block index",
                      "no sequence reaches that block");
  }
  sort_unique(pairs);
}

// Fills in missing paths (builder-made layouts) and checks the node and its children.
void validate_layout(Layout& l, const std::string& path) {
  if (l.path.empty()) l.path = path;
  const std::string& p = l.path;
  if (l.bq < 1 || l.bk < 1) {
    throw UserError(p + "/block", "block sizes must be positive, got " + str(l.bq) + "x" + str(l.bk) +
                                      "; use e.g. 128 or [64, 128]");
  }
  check_below_limit(std::max(l.bq, l.bk), p + "/block", "block size", "use e.g. 128 or [64, 128]");
  switch (l.kind) {
    case Layout::Kind::Local:
      if (l.local < 0) throw UserError(p + "/local", "max block distance must be >= 0, got " + str(l.local));
      check_below_limit(l.local, p + "/local", "max block distance", "a distance past the sequence keeps every block; "
                        "use one below 2^62, or no layout");
      break;
    case Layout::Kind::Global:
    case Layout::Kind::Offsets: {
      const bool global = l.kind == Layout::Kind::Global;
      for (size_t n = 0; n < l.blocks.size(); ++n) {
        const std::string at = p + (global ? "/global/" : "/offsets/") + std::to_string(n);
        if (global && l.blocks[n] < 0) throw UserError(at, "block index must be >= 0, got " + str(l.blocks[n]));
        check_below_limit(l.blocks[n], at, global ? "block index" : "block offset", "no sequence reaches that block");
      }
      sort_unique(l.blocks);
      break;
    }
    case Layout::Kind::Strided:
      if (l.stride < 1) throw UserError(p + "/strided/stride", "stride must be >= 1, got " + str(l.stride));
      check_below_limit(l.stride, p + "/strided/stride", "stride", "use a stride below 2^62");
      if (l.phase < 0 || l.phase >= l.stride) {
        throw UserError(p + "/strided/phase", "phase " + str(l.phase) + " is out of range; it must lie in [0, " +
                                                  str(l.stride) + ") for stride " + str(l.stride));
      }
      break;
    case Layout::Kind::Random:
      if (!(l.density >= 0.0 && l.density <= 1.0)) {
        throw UserError(p + "/random/density", "density must lie in [0, 1], got " + num(l.density));
      }
      if (l.head_base < 0 || l.head_base > kMaxSize) {
        throw UserError(p + "/random/head_base", "head_base must lie in [0, 2^31 - 1] (the global index of the call's "
                                                 "head 0), got " + str(l.head_base));
      }
      break;
    case Layout::Kind::Explicit: {
      uint64_t total = l.explicit_blocks.size();
      for (const auto& h : l.per_head) total += h.size();
      check_explicit_block_count(total, p + "/explicit/" + (l.from_bitmap ? (l.per_head.empty() ? "bitmap" : "per_head_bitmap")
                                                                          : (l.per_head.empty() ? "blocks" : "per_head")));
      check_block_pairs(l.explicit_blocks, p + "/explicit/blocks");
      for (size_t h = 0; h < l.per_head.size(); ++h)
        check_block_pairs(l.per_head[h], p + "/explicit/per_head/" + std::to_string(h));
      break;
    }
    case Layout::Kind::Union:
    case Layout::Kind::Intersect: {
      const std::string key = to_string(l.kind);
      if (l.children.empty()) throw UserError(p + "/" + key, "needs at least one layout in the list");
      for (size_t n = 0; n < l.children.size(); ++n) validate_layout(l.children[n], p + "/" + key + "/" + std::to_string(n));
      // Both are commutative and idempotent: children in canonical order, repeats dropped, so
      // equal meanings print (and hash) equally. Stable, so paths of equal children stay first-come.
      std::stable_sort(l.children.begin(), l.children.end(), [](const Layout& a, const Layout& b) {
        return canonical_layout_text(a) < canonical_layout_text(b);
      });
      l.children.erase(std::unique(l.children.begin(), l.children.end()), l.children.end());
      break;
    }
    case Layout::Kind::Dynamic:
      break;
  }
}

Offset resolve_offset(const UnresolvedBranch& ub, Combine combine, size_t index, const std::string& path) {
  Offset off = ub.offset.value_or(Offset{combine == Combine::Softmax ? OffsetRule::HeadMod : OffsetRule::Group, 0});
  if (off.rule == OffsetRule::Fixed && (off.value < 0 || off.value >= ub.dilation)) {
    throw UserError(path + "/offset", "offset " + str(off.value) + " is out of range; it must lie in [0, " +
                                          str(ub.dilation) + ") for dilation " + str(ub.dilation));
  }
  // The group rule and dilation 1 do not depend on the head: resolving them here makes equal
  // meanings print equal canonical text (and share cache entries).
  if (off.rule == OffsetRule::Group) off = Offset{OffsetRule::Fixed, static_cast<int64_t>(index) % ub.dilation};
  if (ub.dilation == 1) off = Offset{OffsetRule::Fixed, 0};
  return off;
}

Branch resolve_branch(UnresolvedBranch& ub, const UnresolvedPattern& u, size_t index) {
  const std::string path = "/branches/" + std::to_string(index);
  Branch b;
  b.path = path;
  if (ub.segment && *ub.segment < 1) {
    throw UserError(path + "/segment", "segment length must be a positive integer or \"full\", got " + str(*ub.segment));
  }
  if (ub.segment) {
    check_below_limit(*ub.segment, path + "/segment", "segment length",
                      "use \"full\" for one segment over the whole sequence");
  }
  if (ub.dilation < 1) throw UserError(path + "/dilation", "dilation must be >= 1, got " + str(ub.dilation));
  check_below_limit(ub.dilation, path + "/dilation", "dilation", "use a dilation below 2^62");
  if (ub.segment && ub.dilation > *ub.segment) {
    throw UserError(path + "/dilation", "dilation " + str(ub.dilation) + " is larger than the segment " +
                                            str(*ub.segment) + "; use a dilation between 1 and " + str(*ub.segment) +
                                            " or a longer segment");
  }
  b.segment = ub.segment;
  b.dilation = ub.dilation;
  b.offset = resolve_offset(ub, u.combine, index, path);
  if (ub.heads) {
    if (u.combine == Combine::HeadGroups) {
      throw UserError(path + "/heads", "under combine \"head_groups\" the heads of a branch are its group; "
                                       "remove \"heads\" or use combine \"softmax\"");
    }
    std::vector<int64_t> heads = *ub.heads;
    for (size_t n = 0; n < heads.size(); ++n) {
      if (heads[n] < 0) throw UserError(path + "/heads/" + std::to_string(n), "head index must be >= 0, got " + str(heads[n]));
    }
    if (heads.empty()) {
      throw UserError(path + "/heads", "is empty, so the branch applies to no head; list at least one query head, "
                                       "or remove \"heads\" for all heads");
    }
    std::sort(heads.begin(), heads.end());
    if (const auto dup = std::adjacent_find(heads.begin(), heads.end()); dup != heads.end()) {
      throw UserError(path + "/heads", "lists head " + str(*dup) + " twice; list each query head once");
    }
    b.heads = std::move(heads);
  }
  b.causal = ub.causal.value_or(u.causal);
  b.window = ub.window ? resolve_window(*ub.window, path + "/window") : u.window;
  if (ub.layout) {
    b.layout = std::move(ub.layout);
    validate_layout(*b.layout, path + "/layout");
  } else if (u.layout) {
    b.layout = u.layout;  // validated once at pattern level; keeps the "/layout" path
  }
  return b;
}

}  // namespace

Pattern resolve_and_validate(UnresolvedPattern u) {
  if (u.branches.empty()) throw UserError("/branches", "needs at least one branch, e.g. [{\"segment\": \"full\"}]");
  if (u.branches.size() > kMaxBranches) {
    throw UserError("/branches", "has " + std::to_string(u.branches.size()) + " branches; at most " +
                                     std::to_string(kMaxBranches) + " are supported");
  }
  if (u.scale && !(std::isfinite(*u.scale) && *u.scale > 0.0)) {
    throw UserError("/scale", "must be a positive finite number, got " + num(*u.scale) +
                                  "; leave it out for 1/sqrt(head_dim)");
  }
  u.window = resolve_window(u.window, "/window");
  if (u.layout) validate_layout(*u.layout, "/layout");
  Pattern p;
  p.combine = u.combine;
  p.group_scale = u.group_scale;
  p.scale = u.scale;
  for (size_t n = 0; n < u.branches.size(); ++n) p.branches.push_back(resolve_branch(u.branches[n], u, n));
  return p;
}

}  // namespace attnjit
