// The generated mask predicate of partial tiles: one case per branch, each the conjunction of its
// causal, window and layout conditions, with every constant folded in. A new mask kind is a new
// expression here and a helper in templates/mask_lib.cuh, never a new kernel.
//
// Kernels test a tile's pairs element by element: the thread's row is one side of the pair, the
// other moves along the tile's columns as `base + cs` (the tile's first position and the
// element's distance from it, cs = column x stride). Two forms, each a "rule" per branch handed to
// the kernel's loop (aj_keys_rule, aj_queries_rule; aj_keys_allowed and aj_queries_allowed ask one
// pair):
// - keys (a query row against keys; the forward and dQ kernels): each condition becomes a bound on
//   cs, or on the key block's step from the base's block, computed from the row and the base alone
//   (64-bit, once per row: the kernel's loop is compiled per branch and the compiler hoists it),
//   and a 32-bit comparison per element. That is exact: bounds are clamped to [-1, AJ_CS_LIMIT]
//   and the values compared with them lie in [0, AJ_CS_LIMIT), which holds when every stride times
//   the largest tile (128) stays below AJ_CS_LIMIT (2^30). Larger dilations get the same
//   expressions in 64-bit.
// - queries (a key row against queries; the dK/dV kernels): the pair's positions in 64-bit.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

#include "compiler/codegen/codegen.hpp"
#include "compiler/plan/device_plan.hpp"

namespace attnjit {
namespace {

constexpr int64_t kCsLimit = AJ_CS_LIMIT;  // templates/kernel_abi.h
constexpr int64_t kMaxTileRows = 128;           // the largest tile_q and tile_k any path takes

std::string ll(int64_t v) { return std::to_string(v) + "ll"; }

// A random layout keeps a block when its hash's top 53 bits, as u in [0, 1), are below the
// density: u < density  <=>  (x >> 11) < ceil(density * 2^53) (the product is exact in double).
std::string random_threshold(const Layout& l) {
  return std::to_string(static_cast<unsigned long long>(std::ceil(std::ldexp(l.density, 53)))) + "ull";
}

// The head a random layout hashes: the kernel's head index, plus the layout's head_base when the
// call is a slice of the heads (a rank of a head-parallel group).
std::string random_head(const Layout& l) { return l.head_base ? "(head + " + ll(l.head_base) + ")" : "head"; }

// The largest distance between consecutive elements of a tile: key strides are the branches'
// dilations, and query rows of a work item are at most their lcm apart. Capped at
// kCsLimit / kMaxTileRows, where cs = column x stride stops fitting 32 bits.
int64_t stride_bound(const Pattern& p) {
  int64_t lcm = 1;
  for (const Branch& b : p.branches) {
    lcm = std::lcm(lcm, b.dilation);
    if (lcm >= kCsLimit / kMaxTileRows) return kCsLimit / kMaxTileRows;
  }
  return lcm;
}

// A readable statement of a layout for the generated text's comments (the code is below it).
std::string meaning(const Layout& l, const Layout* parent = nullptr) {
  auto list = [](const std::vector<int64_t>& v) {
    std::string s = "{";
    for (size_t n = 0; n < v.size() && n < 8; ++n) s += (n ? ", " : "") + std::to_string(v[n]);
    return s + (v.size() > 8 ? ", ... (" + std::to_string(v.size()) + ")}" : "}");
  };
  std::string s;
  switch (l.kind) {
    case Layout::Kind::Local: s = "|kb - qb| <= " + std::to_string(l.local); break;
    case Layout::Kind::Global: s = "qb or kb in " + list(l.blocks); break;
    case Layout::Kind::Strided: s = "kb % " + std::to_string(l.stride) + " == " + std::to_string(l.phase); break;
    case Layout::Kind::Offsets: s = "kb - qb in " + list(l.blocks); break;
    case Layout::Kind::Random: {
      std::ostringstream os;
      os << "random(density " << l.density << ", seed " << l.seed;
      if (l.head_base) os << ", head_base " << l.head_base;
      os << ")";
      s = os.str();
      break;
    }
    case Layout::Kind::Explicit:
      s = l.per_head.empty() ? std::to_string(l.explicit_blocks.size()) + " listed blocks" : "listed blocks per head";
      break;
    case Layout::Kind::Union:
    case Layout::Kind::Intersect:
      for (size_t n = 0; n < l.children.size(); ++n)
        s += (n ? (l.kind == Layout::Kind::Union ? " or " : " and ") : "") + ("(" + meaning(l.children[n], &l) + ")");
      break;
    case Layout::Kind::Dynamic: s = "the run-time table"; break;
  }
  if (!parent || parent->bq != l.bq || parent->bk != l.bk)
    s += " [blocks " + std::to_string(l.bq) + "x" + std::to_string(l.bk) + "]";
  return s;
}

// Writes one form of the predicate. Keys: a query row (qpos) against keys kbase + cs, every term
// evaluated (no branches, so the forward's loop copy per branch computes each row's bounds once),
// 32-bit per element unless the strides are too large (stride_bound). Pairs: qpos and kpos both
// 64-bit, short-circuit; the key-row kernels ask it one element at a time next to dK and dV,
// where hoisted bounds would take the registers they need.
class PredicateWriter {
public:
  enum class Form { Keys, Pairs };
  PredicateWriter(Form form, int64_t stride_bound, std::map<std::string, std::string>& tables, std::ostringstream& table_text)
      : keys_(form == Form::Keys), narrow_(keys_ && stride_bound < kCsLimit / kMaxTileRows), stride_bound_(stride_bound),
        and_(keys_ ? " & " : " && "), or_(keys_ ? " | " : " || "), tables_(tables), table_text_(table_text) {}

  const std::string& and_op() const { return and_; }

  // The branch's causal and window terms: causal kpos <= qpos; left qpos - L <= kpos; right
  // kpos <= qpos + R. Keys: as bounds on cs = kpos - kbase.
  std::vector<std::string> token_terms(const Branch& br) {
    std::vector<std::string> t;
    if (keys_) {
      const std::string d = "qpos - kbase";
      if (br.causal) t.push_back("(cs <= " + bound(d) + ")");
      if (br.window.left >= 0) t.push_back("(cs >= " + bound(d + " - " + ll(br.window.left)) + ")");
      if (br.window.right >= 0) t.push_back("(cs <= " + bound(d + " + " + ll(br.window.right)) + ")");
    } else {
      if (br.causal) t.push_back("(kpos <= qpos)");
      if (br.window.left >= 0) t.push_back("(kpos >= qpos - " + ll(br.window.left) + ")");
      if (br.window.right >= 0) t.push_back("(kpos <= qpos + " + ll(br.window.right) + ")");
    }
    return t;
  }

  std::string layout(const Layout& l) {
    // qb = qpos / bq (the row's, once per row); Keys: kb = kbase / bk + step, where step, the
    // element's blocks past the base's, is 32-bit; e = qb - kbase / bk, so kb - qb = step - e.
    const std::string qb = "(qpos / " + ll(l.bq) + ")", Kq = "(kbase / " + ll(l.bk) + ")";
    const bool step32 = narrow_ && l.bk <= kCsLimit;
    const std::string step = "step" + std::to_string(l.bk), e = qb + " - " + Kq;
    if (keys_) {
      steps_.emplace(step, step32 ? "const int " + step + " = aj_step32(kbase % " + ll(l.bk) + ", cs, " + std::to_string(l.bk) + "u);"
                                  : "const aj_i64 " + step + " = (kbase % " + ll(l.bk) + " + cs) / " + ll(l.bk) + ";");
    }
    const std::string kb = keys_ ? "(" + Kq + " + " + step + ")" : "(kpos / " + ll(l.bk) + ")";
    switch (l.kind) {
      case Layout::Kind::Local:  // |kb - qb| <= w  <=>  e - w <= step <= e + w
        if (!keys_) return "(" + kb + " - " + qb + " >= " + ll(-l.local) + " && " + kb + " - " + qb + " <= " + ll(l.local) + ")";
        return "((" + step + " >= " + bound(e + " - " + ll(l.local)) + ")" + and_ + "(" + step + " <= " + bound(e + " + " + ll(l.local)) +
               "))";
      case Layout::Kind::Offsets: {  // kb - qb == v  <=>  step == e + v
        if (l.blocks.size() > 8 || !keys_) return membership(l.blocks, kb + " - " + qb);
        std::string s = "(";
        for (size_t n = 0; n < l.blocks.size(); ++n) s += (n ? or_ : "") + ("(" + step + " == " + bound(e + " + " + ll(l.blocks[n])) + ")");
        return s + ")";
      }
      case Layout::Kind::Global: {  // qb listed (once per row) or kb listed (step == v - kbase / bk)
        if (l.blocks.size() > 8 || !keys_) return "(" + membership(l.blocks, qb) + or_ + membership(l.blocks, kb) + ")";
        std::string s = "(" + membership(l.blocks, qb);
        for (const int64_t v : l.blocks) s += or_ + ("(" + step + " == " + bound(ll(v) + " - " + Kq) + ")");
        return s + ")";
      }
      case Layout::Kind::Strided:  // kb % s == phase
        if (step32 && l.stride <= kCsLimit)
          return "aj_mod32_is(" + Kq + " % " + ll(l.stride) + ", " + step + ", " + std::to_string(l.stride) + "u, " +
                 std::to_string(l.phase) + "u)";
        return "(" + kb + " % " + ll(l.stride) + " == " + ll(l.phase) + ")";
      case Layout::Kind::Random: {
        const std::string threshold = random_threshold(l);
        const std::string row = "aj_random_row(" + std::to_string(l.seed) + "ull, " + random_head(l) + ", " + qb + ")";
        // A tile no wider than a key block (AJ_TILE_K x stride <= bk) sees the base's block and
        // the next only: aj_random_pick hashes both once per row.
        if (keys_ && step32)
          return "aj_random_pick<(AJ_TILE_K * " + std::to_string(stride_bound_) + "ll <= " + ll(l.bk) + ")>(" + row + ", " +
                 threshold + ", " + Kq + ", " + step + ")";
        return "aj_random_col(" + row + ", " + threshold + ", " + kb + ")";
      }
      case Layout::Kind::Explicit:
        return explicit_blocks(l, qb, kb);
      case Layout::Kind::Union:
      case Layout::Kind::Intersect: {
        const std::string& op = l.kind == Layout::Kind::Union ? or_ : and_;
        std::string s = "(";
        for (size_t n = 0; n < l.children.size(); ++n) s += (n ? op : "") + layout(l.children[n]);
        return s + ")";
      }
      case Layout::Kind::Dynamic:
        return "aj_dynamic_allows(p, head, " + qb + ", " + kb + ")";
    }
    return "false";
  }

  // An explicit layout's sorted (qb, kb) pairs as device tables: the pairs' table and count for a
  // query head `head` (per-head layouts index theirs), as expressions.
  std::pair<std::string, std::string> explicit_tables(const Layout& l) {
    if (l.per_head.empty()) return {pair_table(l.explicit_blocks), std::to_string(l.explicit_blocks.size())};
    std::string names, lengths;
    for (size_t n = 0; n < l.per_head.size(); ++n) {
      names += (n ? ", " : "") + pair_table(l.per_head[n]);
      lengths += (n ? ", " : "") + std::to_string(l.per_head[n].size());
    }
    return {table("aj_i64* const", "aj_heads_", names) + "[head]", table("int", "aj_heads_len_", lengths) + "[head]"};
  }

  // The step variables the expressions since the last call used, as declarations.
  std::string take_steps() {
    std::string s;
    for (const auto& [name, decl] : steps_) s += "          " + decl + "\n";
    steps_.clear();
    return s;
  }

private:
  std::string bound(const std::string& x) const { return narrow_ ? "aj_bound32(" + x + ")" : "(" + x + ")"; }

  // A device table, written once per distinct content (both forms share it).
  std::string table(const std::string& type, const std::string& prefix, const std::string& body) {
    const std::string key = type + body;
    auto it = tables_.find(key);
    if (it != tables_.end()) return it->second;
    const std::string name = prefix + std::to_string(tables_.size());
    table_text_ << "__device__ const " << type << " " << name << "[] = {" << body << "};\n";
    tables_.emplace(key, name);
    return name;
  }

  std::string sorted_list(const std::vector<int64_t>& values, const std::string& x) {
    std::string body;
    for (size_t n = 0; n < values.size(); ++n) body += (n ? ", " : "") + ll(values[n]);
    return "aj_sorted_contains(" + table("aj_i64", "aj_list_", body) + ", " + std::to_string(values.size()) + ", " + x + ")";
  }

  // Short lists become comparisons; longer ones a sorted device table and a binary search.
  std::string membership(const std::vector<int64_t>& values, const std::string& x) {
    if (values.empty()) return "false";
    if (values.size() > 8) return sorted_list(values, x);
    std::string s = "(";
    for (size_t n = 0; n < values.size(); ++n) s += (n ? or_ : "") + ("(" + x + " == " + ll(values[n]) + ")");
    return s + ")";
  }

  std::string pair_table(const std::vector<Layout::BlockPair>& pairs) {
    std::string body = pairs.empty() ? "0" : "";
    for (size_t n = 0; n < pairs.size(); ++n) body += (n ? ", " : "") + ll(pairs[n].first) + ", " + ll(pairs[n].second);
    return table("aj_i64", "aj_pairs_", body);
  }

  std::string explicit_blocks(const Layout& l, const std::string& qb, const std::string& kb) {
    const auto [pairs, count] = explicit_tables(l);
    return "aj_pair_contains(" + pairs + ", " + count + ", " + qb + ", " + kb + ")";
  }

  bool keys_, narrow_;
  int64_t stride_bound_;
  std::string and_, or_;
  std::map<std::string, std::string> steps_;  // name -> declaration
  std::map<std::string, std::string>& tables_;
  std::ostringstream& table_text_;
};

}  // namespace

namespace {

// Layouts the kernels may decide (Plan::kernel_seeks): with a table or a random node.
bool kernel_may_seek(const Layout& l) {
  return layout_has_kind(l, Layout::Kind::Dynamic) || layout_has_kind(l, Layout::Kind::Random);
}

// The next key a layout may keep, for a layout the kernel decides: code that sets a variable to the
// smallest key position >= x such that the layout keeps (q, that key) for some query position q
// in [q_lo, q_hi], or AJ_NEVER. It may answer lower than that (never higher): the kernels then
// visit a tile with nothing to do, and the per-element mask keeps it right. Every layout answers
// in positions, so children with blocks of their own combine. Random layouts scan at most 64 key
// blocks ahead; random and explicit ones answer x over more than 4 query blocks.
class NextKeyWriter {
public:
  explicit NextKeyWriter(PredicateWriter& tables) : tables_(tables) {}

  // Statements (indented by `pad`) that declare and set the returned variable from input `x`.
  // `bound` (an expression, or empty: none): an answer no earlier than it is as good as any, since
  // a union around this layout already has it; a random layout's scan stops there.
  std::string write(const Layout& l, const std::string& x, std::string& out, const std::string& pad,
                    const std::string& bound = "") {
    std::ostringstream os;
    out = fresh("n");
    if (l.kind == Layout::Kind::Union || l.kind == Layout::Kind::Intersect) {
      os << pad << "aj_i64 " << out << ";\n";
      if (l.kind == Layout::Kind::Union) {
        // The children that hash (random layouts) last, each bounded by the earliest answer so far:
        // within a band or next to a global block the scan does not run at all.
        os << pad << out << " = AJ_NEVER;\n" << pad << "{\n";
        std::vector<const Layout*> order;
        for (const Layout& c : l.children)
          if (!hashes(c)) order.push_back(&c);
        for (const Layout& c : l.children)
          if (hashes(c)) order.push_back(&c);
        for (const Layout* c : order) {
          std::string v;
          const std::string b = bound.empty() ? out : "(" + bound + " < " + out + " ? " + bound + " : " + out + ")";
          os << write(*c, x, v, pad + "  ", hashes(*c) ? b : "");
          os << pad << "  if (" << v << " < " << out << ") " << out << " = " << v << ";\n";
        }
        os << pad << "}\n";
        return os.str();
      }
      // Intersect: each child's answer is no later than the intersection's next key, so the
      // largest is too; from there again, until the children agree (or eight rounds).
      const std::string cur = fresh("cur");
      os << pad << "{\n" << pad << "  aj_i64 " << cur << " = " << x << ";\n" << pad << "  for (int round = 0;; ++round) {\n";
      std::vector<std::string> parts;
      for (const Layout& c : l.children) {
        std::string v;
        os << write(c, cur, v, pad + "    ");
        parts.push_back(v);
      }
      const std::string y = fresh("y");
      os << pad << "    aj_i64 " << y << " = " << parts[0] << ";\n";
      for (size_t n = 1; n < parts.size(); ++n)
        os << pad << "    if (" << parts[n] << " > " << y << ") " << y << " = " << parts[n] << ";\n";
      os << pad << "    if (" << y << " == " << cur << " || " << y << " == AJ_NEVER || round == 7) {\n"
         << pad << "      " << out << " = " << y << ";\n" << pad << "      break;\n" << pad << "    }\n"
         << pad << "    " << cur << " = " << y << ";\n" << pad << "  }\n" << pad << "}\n";
      return os.str();
    }
    // A generator on blocks (bq, bk): the rows' blocks [qbl, qbh], x's block kb, and c, the next
    // kept key block (AJ_NEVER: none); the answer is x itself when c is x's block.
    const std::string qbl = fresh("qbl"), qbh = fresh("qbh"), kb = fresh("kb"), c = fresh("c");
    os << pad << "aj_i64 " << out << ";\n" << pad << "{\n";
    os << pad << "  const aj_i64 " << qbl << " = q_lo / " << ll(l.bq) << ", " << qbh << " = q_hi / " << ll(l.bq) << ", " << kb
       << " = " << x << " / " << ll(l.bk) << ";\n";
    os << pad << "  (void)" << qbl << "; (void)" << qbh << ";\n";
    os << pad << "  aj_i64 " << c << " = AJ_NEVER;\n";
    const std::string in = pad + "  ";
    // The smallest kept block of [lo, hi] from kb on, as a statement.
    auto band = [&](const std::string& lo, const std::string& hi) {
      return in + "{\n" + in + "  const aj_i64 a = " + kb + " > " + lo + " ? " + kb + " : " + lo + ";\n" + in + "  if (a <= " + hi +
             " && a < " + c + ") " + c + " = a;\n" + in + "}\n";
    };
    switch (l.kind) {
      case Layout::Kind::Local:  // kb' within w of some row block
        os << band("(" + qbl + " - " + ll(l.local) + ")", "(" + qbh + " + " + ll(l.local) + ")");
        break;
      case Layout::Kind::Offsets:  // kb' - qb == v
        for (const int64_t v : l.blocks) os << band("(" + qbl + " + " + ll(v) + ")", "(" + qbh + " + " + ll(v) + ")");
        break;
      case Layout::Kind::Global: {  // a listed row keeps every key block, else the next listed column
        std::string rows = "false";
        for (const int64_t v : l.blocks) rows += " || (" + qbl + " <= " + ll(v) + " && " + ll(v) + " <= " + qbh + ")";
        os << in << "if (" << rows << ") " << c << " = " << kb << ";\n";
        for (const int64_t v : l.blocks) os << band(ll(v), ll(v));
        break;
      }
      case Layout::Kind::Strided:  // the next kb' with kb' % stride == phase
        os << in << c << " = " << kb << " + ((" << ll(l.phase) << " - " << kb << " % " << ll(l.stride) << ") % " << ll(l.stride)
           << " + " << ll(l.stride) << ") % " << ll(l.stride) << ";\n";
        break;
      case Layout::Kind::Random: {  // hashed block by block, up to 64 ahead; many row blocks: maybe
        // With a bound, only the blocks that start before it: nothing kept there answers
        // lim * bk, no earlier than the bound, and the union keeps what it has.
        const std::string threshold = random_threshold(l), lim = fresh("lim");
        os << in << "aj_i64 " << lim << " = " << kb << " + 64;\n";
        if (!bound.empty()) {
          const std::string bv = fresh("bound");
          os << in << "const aj_i64 " << bv << " = " << bound << ";\n"
             << in << "if (" << bv << " != AJ_NEVER && (" << bv << " + " << ll(l.bk - 1) << ") / " << ll(l.bk) << " < " << lim << ") "
             << lim << " = (" << bv << " + " << ll(l.bk - 1) << ") / " << ll(l.bk) << ";\n";
        }
        os << in << "if (" << qbh << " - " << qbl << " > 3) " << c << " = " << kb << ";\n"
           << in << "for (aj_i64 b = " << kb << "; b < " << lim << " && " << c << " == AJ_NEVER; ++b)\n"
           << in << "  for (aj_i64 qb = " << qbl << "; qb <= " << qbh << "; ++qb)\n"
           << in << "    if (aj_random_col(aj_random_row(" << l.seed << "ull, " << random_head(l) << ", qb), " << threshold << ", b)) {\n"
           << in << "      " << c << " = b;\n" << in << "      break;\n" << in << "    }\n"
           << in << "if (" << c << " == AJ_NEVER) " << c << " = " << lim << ";  // none before lim: look again from there\n";
        break;
      }
      case Layout::Kind::Dynamic:
        os << in << "const aj_i64 t = aj_dynamic_next(p, head, " << qbl << ", " << qbh << ", " << kb << ");\n"
           << in << "if (t >= 0) " << c << " = t;\n";
        break;
      case Layout::Kind::Explicit: {  // the sorted pairs of each row block, searched from kb
        const auto [pairs, count] = tables_.explicit_tables(l);
        os << in << "const aj_i64 t = aj_pair_next(" << pairs << ", " << count << ", " << qbl << ", " << qbh << ", " << kb << ");\n"
           << in << "if (t >= 0) " << c << " = t;\n";
        break;
      }
      case Layout::Kind::Union:
      case Layout::Kind::Intersect:
        os << in << c << " = " << kb << ";\n";
        break;
    }
    os << in << out << " = " << c << " == AJ_NEVER ? AJ_NEVER : " << c << " == " << kb << " ? " << x << " : " << c << " * "
       << ll(l.bk) << ";\n";
    os << pad << "}\n";
    return os.str();
  }

private:
  // Whether the layout's next key hashes block by block (a random layout somewhere in it).
  static bool hashes(const Layout& l) {
    if (l.kind == Layout::Kind::Random) return true;
    for (const Layout& c : l.children)
      if (hashes(c)) return true;
    return false;
  }
  std::string fresh(const std::string& stem) { return stem + std::to_string(count_++); }
  PredicateWriter& tables_;
  int count_ = 0;
};

// Whether a layout keeps every pair of a tile: code that sets the returned variable to true only if
// the layout keeps every (q, k) with q in [q_lo, q_hi] and k in [k_lo, k_hi] (false when unsure:
// the tile is then masked per element, which is right either way). Bands (local, global, strided)
// answer over many blocks; the others for a tile inside one block pair.
class WholeWriter {
public:
  explicit WholeWriter(PredicateWriter& tables) : tables_(tables) {}

  std::string write(const Layout& l, std::string& out, const std::string& pad) {
    std::ostringstream os;
    out = "w" + std::to_string(count_++);
    if (l.kind == Layout::Kind::Union || l.kind == Layout::Kind::Intersect) {
      // A union keeps the tile whole if one child does (sufficient, not necessary); an
      // intersection if all do. Later children are asked only while the answer is open.
      const bool any = l.kind == Layout::Kind::Union;
      os << pad << "bool " << out << " = " << (any ? "false" : "true") << ";\n";
      for (const Layout& c : l.children) {
        std::string v;
        os << pad << "if (" << (any ? "!" : "") << out << ") {\n" << write(c, v, pad + "  ") << pad << "  " << out << " = " << v
           << ";\n" << pad << "}\n";
      }
      return os.str();
    }
    const std::string qbl = "q_lo / " + ll(l.bq), qbh = "q_hi / " + ll(l.bq), kbl = "k_lo / " + ll(l.bk),
                      kbh = "k_hi / " + ll(l.bk);
    const std::string one = "(" + qbl + " == " + qbh + " && " + kbl + " == " + kbh + ")";  // one block pair
    std::string e;
    switch (l.kind) {
      case Layout::Kind::Local:  // every |kb - qb| <= w
        e = "(" + kbh + " - " + qbl + " <= " + ll(l.local) + " && " + qbh + " - " + kbl + " <= " + ll(l.local) + ")";
        break;
      case Layout::Kind::Global: {  // one listed row block, or one listed column block
        std::string rows = "false", cols = "false";
        for (const int64_t v : l.blocks) rows += " || " + qbl + " == " + ll(v), cols += " || " + kbl + " == " + ll(v);
        e = "((" + qbl + " == " + qbh + " && (" + rows + ")) || (" + kbl + " == " + kbh + " && (" + cols + ")))";
        break;
      }
      case Layout::Kind::Strided:
        e = l.stride == 1 ? std::string("true")
                          : "(" + kbl + " == " + kbh + " && " + kbl + " % " + ll(l.stride) + " == " + ll(l.phase) + ")";
        break;
      case Layout::Kind::Offsets: {
        std::string in = "false";
        for (const int64_t v : l.blocks) in += " || " + kbl + " - " + qbl + " == " + ll(v);
        e = "(" + one + " && (" + in + "))";
        break;
      }
      case Layout::Kind::Random:
        e = "(" + one + " && aj_random_col(aj_random_row(" + std::to_string(l.seed) + "ull, " + random_head(l) + ", " + qbl + "), " +
            random_threshold(l) + ", " + kbl + "))";
        break;
      case Layout::Kind::Explicit: {
        const auto [pairs, count] = tables_.explicit_tables(l);
        e = "(" + one + " && aj_pair_next(" + pairs + ", " + count + ", " + qbl + ", " + qbl + ", " + kbl + ") == " + kbl + ")";
        break;
      }
      case Layout::Kind::Dynamic:
        e = "(" + one + " && aj_dynamic_next(p, head, " + qbl + ", " + qbl + ", " + kbl + ") == " + kbl + ")";
        break;
      case Layout::Kind::Union:
      case Layout::Kind::Intersect:
        break;
    }
    os << pad << "const bool " << out << " = " << e << ";\n";
    return os.str();
  }

private:
  PredicateWriter& tables_;
  int count_ = 0;
};

// The functions templates/mask_lib.cuh declares for layouts the kernel decides, by branch:
// aj_layout_next_key (NextKeyWriter; x itself for a branch the kernel never seeks through, whose
// plan is exact) and aj_layout_whole (WholeWriter).
std::string seek_functions(const Pattern& p, PredicateWriter& tables, bool every_layout) {
  std::ostringstream next, whole;
  NextKeyWriter next_writer(tables);
  WholeWriter whole_writer(tables);
  for (size_t b = 0; b < p.branches.size(); ++b) {
    const Branch& br = p.branches[b];
    if (!br.layout || !(every_layout || kernel_may_seek(*br.layout))) continue;
    std::string v;
    next << "    case " << b << ": {\n" << next_writer.write(*br.layout, "x", v, "      ") << "      return " << v << ";\n    }\n";
    whole << "    case " << b << ": {\n" << whole_writer.write(*br.layout, v, "      ") << "      return " << v << ";\n    }\n";
  }
  std::ostringstream os;
  os << "// Layouts the kernel decides (templates/mask_lib.cuh): by branch, the next key position >= x the\n"
        "// layout may keep for a query in [q_lo, q_hi] (AJ_NEVER: none), and whether it keeps a tile whole.\n";
  os << "__device__ aj_i64 aj_layout_next_key(const AjParams& p, int branch, int head, aj_i64 q_lo, aj_i64 q_hi, aj_i64 x) {\n"
        "  (void)p; (void)head; (void)q_lo; (void)q_hi;\n  switch (branch) {\n"
     << next.str() << "  }\n  return x;\n}\n";
  os << "__device__ bool aj_layout_whole(const AjParams& p, int branch, int head, aj_i64 q_lo, aj_i64 q_hi, aj_i64 k_lo, aj_i64 k_hi) {\n"
        "  (void)p; (void)head; (void)q_lo; (void)q_hi; (void)k_lo; (void)k_hi;\n  switch (branch) {\n"
     << whole.str() << "  }\n  return false;\n}\n";
  return os.str();
}

}  // namespace

bool pattern_may_seek(const Pattern& p) {
  return std::any_of(p.branches.begin(), p.branches.end(), [](const Branch& b) { return b.layout && kernel_may_seek(*b.layout); });
}

bool pattern_has_layout(const Pattern& p) {
  return std::any_of(p.branches.begin(), p.branches.end(), [](const Branch& b) { return b.layout.has_value(); });
}

bool pattern_has_mask(const Pattern& p) {
  for (const Branch& br : p.branches)
    if (br.causal || br.window.left >= 0 || br.window.right >= 0 || br.layout) return true;
  return false;
}

std::string generate_mask_predicate(const Pattern& p, bool seek_every_layout) {
  std::ostringstream os;
  const int64_t strides = stride_bound(p);
  const bool narrow = strides < kCsLimit / kMaxTileRows;
  os << "typedef " << (narrow ? "int" : "aj_i64") << " aj_cs;  // an element's distance from its tile's first position: "
     << (narrow ? "32-bit (every stride x 128 < 2^30)" : "64-bit (this pattern's dilations reach 2^23)") << "\n";
  const char* rule_names[2] = {"aj_keys_rule", "aj_queries_rule"};
  const char* rule_args[2] = {"aj_i64 qpos, aj_i64 kbase, aj_cs cs", "aj_i64 kpos, aj_i64 qbase, aj_cs cs"};
  std::string seek;  // the seek functions (seek_functions), after the rules
  if (!pattern_has_mask(p)) {
    os << "// mask: none (every visited tile is full)\n";
    for (const char* name : rule_names)
      os << "template <class F> __device__ __forceinline__ void " << name << "(const AjParams&, int, int, bool, F&& f) { f(AjAllowAll()); }\n";
  } else {
    std::map<std::string, std::string> tables;
    std::ostringstream table_text, cases[2];
    for (int form = 0; form < 2; ++form) {
      PredicateWriter w(form == 0 ? PredicateWriter::Form::Keys : PredicateWriter::Form::Pairs, strides, tables, table_text);
      for (size_t b = 0; b < p.branches.size(); ++b) {
        const Branch& br = p.branches[b];
        std::vector<std::string> terms = w.token_terms(br);
        if (br.layout) terms.push_back(w.layout(*br.layout));
        if (terms.empty()) continue;  // this branch's tiles are always full
        cases[form] << "      case " << b << ":\n        f([&](" << rule_args[form] << ") {\n"
                    << (form == 0 ? w.take_steps() : "          const aj_i64 qpos = qbase + cs;\n") << "          return ";
        for (size_t n = 0; n < terms.size(); ++n) cases[form] << (n ? w.and_op() : "") << terms[n];
        cases[form] << ";\n        });\n        return;\n";
      }
    }
    // Layouts the kernel may decide: the seek's functions, whose tables join the predicate's.
    if (pattern_may_seek(p) || (seek_every_layout && pattern_has_layout(p))) {
      PredicateWriter w(PredicateWriter::Form::Pairs, strides, tables, table_text);
      seek = seek_functions(p, w, seek_every_layout);
    }
    os << "// mask, by branch (qb = qpos / bq, kb = kpos / bk):\n";
    for (size_t b = 0; b < p.branches.size(); ++b) {
      const Branch& br = p.branches[b];
      std::vector<std::string> said;
      if (br.causal) said.push_back("kpos <= qpos");
      if (br.window.left >= 0) said.push_back("kpos >= qpos - " + std::to_string(br.window.left));
      if (br.window.right >= 0) said.push_back("kpos <= qpos + " + std::to_string(br.window.right));
      if (br.layout) said.push_back(meaning(*br.layout));
      std::string line;
      for (size_t n = 0; n < said.size(); ++n) line += (n ? " and " : "") + said[n];
      os << "//   " << b << ": " << (said.empty() ? "every pair (its tiles are always full)" : line) << "\n";
    }
    os << table_text.str();
    const char* what[2] = {"// f(rule) with the branch's rule for a query row (a full tile's: every pair): rule(qpos, kbase, cs)\n"
                           "// says whether the query at qpos attends the key at kbase + cs. Each case is its own call, so f's\n"
                           "// loop over a tile's elements is compiled per branch, with what depends on the row alone computed\n"
                           "// once per row.\n",
                           "// f(rule) with the branch's rule for a key row: rule(kpos, qbase, cs) says whether the query at\n"
                           "// qbase + cs attends the key at kpos (in 64-bit positions).\n"};
    for (int form = 0; form < 2; ++form) {
      os << what[form] << "template <class F> __device__ __forceinline__ void " << rule_names[form]
         << "(const AjParams& p, int branch, int head, bool full, F&& f) {\n  (void)p; (void)head;\n";
      os << "  if (!full) {\n    switch (branch) {\n" << cases[form].str() << "    }\n  }\n  f(AjAllowAll());\n}\n";
    }
  }
  if (!seek.empty()) os << "#ifdef AJ_KERNEL_SEEK\n" << seek << "#endif\n";
  os << "// One pair at a time (the SIMT kernels' loops).\n";
  os << "__device__ __forceinline__ bool aj_keys_allowed(const AjParams& p, int branch, int head, " << rule_args[0] << ") {\n"
     << "  bool r = true;\n  aj_keys_rule(p, branch, head, false, [&](auto rule) { r = rule(qpos, kbase, cs); });\n  return r;\n}\n";
  os << "__device__ __forceinline__ bool aj_queries_allowed(const AjParams& p, int branch, int head, " << rule_args[1] << ") {\n"
     << "  bool r = true;\n  aj_queries_rule(p, branch, head, false, [&](auto rule) { r = rule(kpos, qbase, cs); });\n  return r;\n}\n";
  return os.str();
}

}  // namespace attnjit
