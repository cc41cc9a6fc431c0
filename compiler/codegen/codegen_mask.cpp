// The generated mask predicate: one case per branch, each the conjunction of its causal, window
// and layout conditions, with every constant folded in. A new mask kind is a new expression here
// and a helper in templates/mask_lib.cuh, never a new kernel.
#include <cmath>
#include <sstream>

#include "compiler/codegen/codegen.hpp"

namespace attnjit {
namespace {

class PredicateWriter {
public:
  std::string expression(const Layout& l) {
    const std::string qb = "(qpos / " + std::to_string(l.bq) + "ll)", kb = "(kpos / " + std::to_string(l.bk) + "ll)";
    switch (l.kind) {
      case Layout::Kind::Local:
        return "(aj_abs(" + kb + " - " + qb + ") <= " + std::to_string(l.local) + "ll)";
      case Layout::Kind::Global:
        return "(" + membership(l.blocks, qb) + " || " + membership(l.blocks, kb) + ")";
      case Layout::Kind::Strided:
        return "(" + kb + " % " + std::to_string(l.stride) + "ll == " + std::to_string(l.phase) + "ll)";
      case Layout::Kind::Offsets:
        return membership(l.blocks, "(" + kb + " - " + qb + ")");
      case Layout::Kind::Random: {
        // u < density  <=>  (x >> 11) < ceil(density * 2^53); the product is exact in double.
        const double scaled = std::ldexp(l.density, 53);
        const unsigned long long threshold = static_cast<unsigned long long>(std::ceil(scaled));
        return "aj_random_kept(" + std::to_string(l.seed) + "ull, " + std::to_string(threshold) + "ull, head, " + qb +
               ", " + kb + ")";
      }
      case Layout::Kind::Explicit:
        return explicit_blocks(l, qb, kb);
      case Layout::Kind::Union:
      case Layout::Kind::Intersect: {
        const char* op = l.kind == Layout::Kind::Union ? " || " : " && ";
        std::string e = "(";
        for (size_t n = 0; n < l.children.size(); ++n) e += (n ? op : "") + expression(l.children[n]);
        return e + ")";
      }
      case Layout::Kind::Dynamic:
        return "aj_dynamic_allows(p, head, " + qb + ", " + kb + ")";
    }
    return "false";
  }

  std::string tables() const { return tables_.str(); }

private:
  // Short lists become comparisons; longer ones a sorted device table and a binary search.
  std::string membership(const std::vector<int64_t>& values, const std::string& x) {
    if (values.empty()) return "false";
    if (values.size() <= 8) {
      std::string e = "(";
      for (size_t n = 0; n < values.size(); ++n) e += (n ? " || " : "") + x + " == " + std::to_string(values[n]) + "ll";
      return e + ")";
    }
    const std::string name = "aj_list_" + std::to_string(counter_++);
    tables_ << "__device__ const aj_i64 " << name << "[] = {";
    for (size_t n = 0; n < values.size(); ++n) tables_ << (n ? ", " : "") << values[n] << "ll";
    tables_ << "};\n";
    return "aj_sorted_contains(" + name + ", " + std::to_string(values.size()) + ", " + x + ")";
  }

  std::string pair_table(const std::vector<Layout::BlockPair>& pairs) {
    const std::string name = "aj_pairs_" + std::to_string(counter_++);
    tables_ << "__device__ const aj_i64 " << name << "[] = {";
    if (pairs.empty()) tables_ << "0";
    for (size_t n = 0; n < pairs.size(); ++n) tables_ << (n ? ", " : "") << pairs[n].first << "ll, " << pairs[n].second << "ll";
    tables_ << "};\n";
    return name;
  }

  std::string explicit_blocks(const Layout& l, const std::string& qb, const std::string& kb) {
    if (l.per_head.empty()) {
      const std::string t = pair_table(l.explicit_blocks);
      return "aj_pair_contains(" + t + ", " + std::to_string(l.explicit_blocks.size()) + ", " + qb + ", " + kb + ")";
    }
    std::vector<std::string> names;
    for (const auto& h : l.per_head) names.push_back(pair_table(h));
    const std::string id = std::to_string(counter_++);
    tables_ << "__device__ const aj_i64* const aj_heads_" << id << "[] = {";
    for (size_t n = 0; n < names.size(); ++n) tables_ << (n ? ", " : "") << names[n];
    tables_ << "};\n__device__ const int aj_heads_len_" << id << "[] = {";
    for (size_t n = 0; n < l.per_head.size(); ++n) tables_ << (n ? ", " : "") << l.per_head[n].size();
    tables_ << "};\n";
    return "aj_pair_contains(aj_heads_" + id + "[head], aj_heads_len_" + id + "[head], " + qb + ", " + kb + ")";
  }

  std::ostringstream tables_;
  int counter_ = 0;
};

}  // namespace

std::string generate_mask_predicate(const Pattern& p) {
  PredicateWriter w;
  std::ostringstream cases;
  bool any = false;
  for (size_t b = 0; b < p.branches.size(); ++b) {
    const Branch& br = p.branches[b];
    std::vector<std::string> terms;
    if (br.causal) terms.push_back("kpos <= qpos");
    if (br.window.left >= 0) terms.push_back("kpos >= qpos - " + std::to_string(br.window.left) + "ll");
    if (br.window.right >= 0) terms.push_back("kpos <= qpos + " + std::to_string(br.window.right) + "ll");
    if (br.layout) terms.push_back(w.expression(*br.layout));
    if (terms.empty()) continue;  // this branch's tiles are always full
    any = true;
    cases << "    case " << b << ": return ";
    for (size_t n = 0; n < terms.size(); ++n) cases << (n ? " && " : "") << terms[n];
    cases << ";\n";
  }
  std::ostringstream os;
  if (!any) {
    os << "// mask: none (every visited tile is full)\n";
    os << "__device__ __forceinline__ bool aj_branch_allows(const AjParams&, int, int, aj_i64, aj_i64) { return true; }\n";
    return os.str();
  }
  os << w.tables();
  os << "__device__ __forceinline__ bool aj_branch_allows(const AjParams& p, int branch, int head, aj_i64 qpos, aj_i64 kpos) {\n";
  os << "  (void)p; (void)head;\n  switch (branch) {\n" << cases.str() << "    default: return true;\n  }\n}\n";
  return os.str();
}

}  // namespace attnjit
