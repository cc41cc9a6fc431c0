// The canonical text of a Pattern and its hash. The text is a contract: dumps, FileCheck tests and
// cache keys read it, so change it only together with the version line.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "compiler/support/sha256.hpp"
#include "compiler/pattern/pattern.hpp"

namespace attnjit {
namespace {

// Shortest of %.15g / %.17g that reads back to the same double: exact, and 0.025 stays "0.025".
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <typename T, typename F>
void join(std::ostream& os, const std::vector<T>& items, F&& each) {
  for (size_t n = 0; n < items.size(); ++n) {
    if (n) os << ",";
    each(items[n]);
  }
}

// How much of the explicit lists to print: all of them (the canonical text), or the first
// `max_listed` pairs of each, counting the rest (a summary for people).
struct Listing {
  size_t max_listed = SIZE_MAX;
  int64_t not_shown = 0;
};

void print_pairs(std::ostream& os, const std::vector<Layout::BlockPair>& pairs, Listing& listing) {
  os << "[";
  const size_t shown = std::min(pairs.size(), listing.max_listed);
  for (size_t n = 0; n < shown; ++n) os << (n ? "," : "") << "(" << pairs[n].first << "," << pairs[n].second << ")";
  if (shown < pairs.size()) {
    os << (shown ? ", " : "") << "... " << pairs.size() - shown << " more blocks";
    listing.not_shown += static_cast<int64_t>(pairs.size() - shown);
  }
  os << "]";
}

void print_layout(std::ostream& os, const Layout& l, Listing& listing) {
  os << to_string(l.kind) << "<" << l.bq << "x" << l.bk << ">(";
  switch (l.kind) {
    case Layout::Kind::Local: os << l.local; break;
    case Layout::Kind::Global:
    case Layout::Kind::Offsets: join(os, l.blocks, [&](int64_t b) { os << b; }); break;
    case Layout::Kind::Strided: os << "stride=" << l.stride << ",phase=" << l.phase; break;
    case Layout::Kind::Random:
      os << "density=" << num(l.density) << ",seed=" << l.seed;
      if (l.head_base) os << ",head_base=" << l.head_base;  // only when set: hashes of existing specs stay
      break;
    case Layout::Kind::Explicit:
      if (l.per_head.empty()) {
        print_pairs(os, l.explicit_blocks, listing);
      } else {
        os << "per_head=";
        join(os, l.per_head, [&](const std::vector<Layout::BlockPair>& h) { print_pairs(os, h, listing); });
      }
      break;
    case Layout::Kind::Union:
    case Layout::Kind::Intersect: join(os, l.children, [&](const Layout& c) { print_layout(os, c, listing); }); break;
    case Layout::Kind::Dynamic: break;
  }
  os << ")";
}

std::string print_pattern(const Pattern& p, Listing& listing) {
  std::ostringstream os;
  os << "attnjit-pattern v" << kSpecVersion << "\n";
  os << "combine " << to_string(p.combine);
  if (p.combine == Combine::HeadGroups) os << " group_scale " << (p.group_scale == GroupScale::Mean ? "mean" : "none");
  os << "\nscale " << (p.scale ? num(*p.scale) : std::string("1/sqrt(head_dim)")) << "\n";
  for (size_t n = 0; n < p.branches.size(); ++n) {
    const Branch& b = p.branches[n];
    os << "branch " << n << ": segment=" << (b.segment ? std::to_string(*b.segment) : std::string("full"))
       << " dilation=" << b.dilation << " offset=";
    if (b.offset.rule == OffsetRule::Fixed) os << b.offset.value; else os << to_string(b.offset.rule);
    os << " heads=";
    if (b.heads) { join(os, *b.heads, [&](int64_t h) { os << h; }); } else { os << "all"; }
    os << " causal=" << (b.causal ? "true" : "false") << " window=[" << b.window.left << "," << b.window.right << "]";
    os << " layout=";
    if (b.layout) print_layout(os, *b.layout, listing); else os << "none";
    os << "\n";
  }
  return os.str();
}

}  // namespace

std::string canonical_layout_text(const Layout& l) {
  std::ostringstream os;
  Listing all;
  print_layout(os, l, all);
  return os.str();
}

std::string canonical_text(const Pattern& p) {
  Listing all;
  return print_pattern(p, all);
}

std::string canonical_summary(const Pattern& p, size_t max_listed, int64_t* not_shown) {
  Listing some{max_listed, 0};
  std::string text = print_pattern(p, some);
  if (not_shown) *not_shown = some.not_shown;
  return text;
}

std::string pattern_hash(const Pattern& p) { return sha256_hex(canonical_text(p)).substr(0, 16); }

}  // namespace attnjit
