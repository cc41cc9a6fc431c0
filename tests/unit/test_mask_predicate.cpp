// The generated mask predicate against the mask's definition: both forms (a query row against
// keys, a key row against queries) of random patterns' predicates run in the emulator on pairs
// near block edges, far apart (the 32-bit bounds clamp) and at positions up to 2^62, with the
// 64-bit forms that huge dilations and blocks take. A predicate that drops the clamp fails.
#include <catch2/catch.hpp>

#include <functional>
#include <numeric>
#include <random>
#include <sstream>

#include "compiler/codegen/codegen.hpp"
#include "compiler/codegen/templates.hpp"
#include "compiler/jit/jit.hpp"
#include "emulator/emu_compiler.hpp"
#include "emulator/emu_module.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;

namespace {

// One question: does branch `branch` of pattern `pattern` keep the pair, asked in `form` 0 (the
// row is the query `fixed`, the key is base + cs) or 1 (the row is the key, the query base + cs)?
struct Question {
  int64_t pattern, form, branch, head, fixed, base, cs;
};

bool definition(const Branch& br, int64_t h, int64_t qpos, int64_t kpos) {
  if (br.causal && kpos > qpos) return false;
  if (br.window.left >= 0 && kpos < qpos - br.window.left) return false;
  if (br.window.right >= 0 && kpos > qpos + br.window.right) return false;
  return !br.layout || layout_allows(*br.layout, h, qpos, kpos, nullptr);
}

int64_t lcm_of_dilations(const Pattern& p) {
  int64_t l = 1;
  for (const Branch& b : p.branches) l = std::lcm(l, b.dilation);
  return l;
}

// Questions about pattern `index`: pairs near each other at several magnitudes, and far apart.
std::vector<Question> questions_for(const Pattern& p, int64_t index, int64_t heads, std::mt19937_64& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t magnitudes[] = {0, 0, 0, (int64_t{1} << 31) - 100, (int64_t{1} << 40) + 7, (int64_t{1} << 61) + 3};
  std::vector<Question> out;
  for (size_t b = 0; b < p.branches.size(); ++b) {
    const int64_t strides[] = {1, p.branches[b].dilation, lcm_of_dilations(p)};
    for (int64_t form = 0; form < 2; ++form) {
      for (int n = 0; n < 240; ++n) {
        const int64_t stride = strides[uniform(0, 2)], col = uniform(0, 127);
        int64_t fixed = 0, base = 0;
        if (n % 6 == 5) {  // far apart: one side small, the other large
          const int64_t far = magnitudes[uniform(3, 5)] + uniform(0, 1000);
          fixed = uniform(0, 1) ? far : uniform(0, 300);
          base = fixed >= far ? uniform(0, 300) : far;
        } else {
          const int64_t m = magnitudes[uniform(0, 5)];
          fixed = m + uniform(0, 300), base = m + uniform(0, 300);
        }
        out.push_back({index, form, int64_t(b), uniform(0, heads - 1), fixed, base, col * stride});
      }
    }
  }
  return out;
}

// Every pattern's predicate in a namespace of its own, and a kernel that answers the questions.
std::string unit_source(const std::vector<Pattern>& patterns, const std::string& mask_lib) {
  const TemplateSet& t = TemplateSet::embedded();
  std::ostringstream os;
  // Tiles of 128 (the questions' columns go to 127), so aj_random_pick's two-block form is taken
  // where 128 x the strides fit a key block.
  os << "#define AJ_HEAD_DIM 64\n#define AJ_HEAD_DIM_V 64\n#define AJ_TILE_Q 128\n#define AJ_TILE_K 128\n"
        "#define AJ_STAGES 2\n#define AJ_WARPS 4\n#define AJ_DTYPE 0\n"
     << t.blocks() << t.text("kernel_abi.h") << t.text("common.cuh") << mask_lib;
  for (size_t n = 0; n < patterns.size(); ++n)
    os << "namespace aj_case" << n << " {\n" << generate_mask_predicate(patterns[n]) << "}\n";
  os << "__device__ bool aj_answer(const AjParams& p, const aj_i64* q) {\n  switch (q[0]) {\n";
  for (size_t n = 0; n < patterns.size(); ++n)
    os << "    case " << n << ": return q[1] == 0 ? aj_case" << n << "::aj_keys_allowed(p, (int)q[2], (int)q[3], q[4], q[5], (aj_case" << n
       << "::aj_cs)q[6]) : aj_case" << n << "::aj_queries_allowed(p, (int)q[2], (int)q[3], q[4], q[5], (aj_case" << n
       << "::aj_cs)q[6]);\n";
  os << "  }\n  return false;\n}\n"
        "extern \"C\" __global__ void mask_answers(const aj_i64* questions, int* answers, int n) {\n"
        "  AjParams p = {};\n"
        "  for (int i = aj_thread_idx(); i < n; i += 64) answers[i] = aj_answer(p, questions + 7 * i) ? 1 : 0;\n}\n";
  return os.str();
}

// Runs `kernel`(questions, answers, n) of `source` in the emulator: `flat` holds the questions,
// `out` (one per question) receives the answers.
template <typename A>
void run_questions(const std::string& kernel, const std::string& source, std::vector<int64_t>& flat, std::vector<A>& out) {
  auto m = emu::load_emu_module(emu::compile_for_emulator({kernel, source, "sm_80", "", {}}, default_kernel_cache(), knobs()));
  const int64_t* pq = flat.data();
  A* pa = out.data();
  int n = static_cast<int>(out.size());
  void* args[] = {&pq, &pa, &n};
  emu::LaunchRequest r;
  r.block_threads = 64;
  r.args = args;
  r.timeout_s = 600;
  r.buffers = {{"questions", flat.data(), flat.size() * 8, 8, false}, {"answers", out.data(), out.size() * sizeof(A), alignof(A), true}};
  m->launch(r);
}

std::vector<int> answers(const std::string& source, const std::vector<Question>& qs) {
  std::vector<int64_t> flat;
  for (const Question& q : qs) flat.insert(flat.end(), {q.pattern, q.form, q.branch, q.head, q.fixed, q.base, q.cs});
  std::vector<int> out(qs.size(), -1);
  run_questions("mask_answers", source, flat, out);
  return out;
}

// The first question whose answer differs from the definition, or "".
std::string first_wrong(const std::vector<Pattern>& patterns, const std::vector<Question>& qs, const std::vector<int>& got) {
  for (size_t i = 0; i < qs.size(); ++i) {
    const Question& q = qs[i];
    const int64_t other = q.base + q.cs;
    const int64_t qpos = q.form == 0 ? q.fixed : other, kpos = q.form == 0 ? other : q.fixed;
    const bool want = definition(patterns[size_t(q.pattern)].branches[size_t(q.branch)], q.head, qpos, kpos);
    if (got[i] != int(want)) {
      std::ostringstream os;
      os << "pattern " << q.pattern << " branch " << q.branch << " head " << q.head << " form " << (q.form ? "queries" : "keys")
         << ": qpos " << qpos << " kpos " << kpos << " (base " << q.base << ", cs " << q.cs << "): kernel says " << got[i]
         << ", the definition " << want << "\n"
         << canonical_text(patterns[size_t(q.pattern)]) << generate_mask_predicate(patterns[size_t(q.pattern)]);
      return os.str();
    }
  }
  return "";
}

// Random patterns (without run-time tables) and hand-made ones for the wide forms; `heads`: the
// query heads of each (per-head block lists have that many).
std::vector<Pattern> patterns_under_test(std::vector<int64_t>& heads) {
  std::vector<Pattern> out;
  CaseGenerator gen(2718);
  while (out.size() < 48) {
    const auto c = gen.next();
    if (!c.dynamic && pattern_has_mask(c.pattern)) out.push_back(c.pattern), heads.push_back(c.shape.heads_q);
  }
  heads.insert(heads.end(), 4, 4);
  const int64_t huge = (int64_t{1} << 31) + 5;  // a block past 2^30: its step is 64-bit
  out.push_back(PatternBuilder()
                    .branch(BranchSpec().dilation((int64_t{1} << 23) + 1).causal().window(9, 4).layout(layouts::local(1, 3, 5)))
                    .branch(BranchSpec().layout(layouts::union_of({layouts::strided(3, 1, 2, 7), layouts::offsets({-2, 0, 5}, 2, 7)})))
                    .build());
  out.push_back(PatternBuilder()
                    .branch(BranchSpec().layout(layouts::union_of({layouts::local(0, 7, huge), layouts::strided(2, 1, 7, huge),
                                                                   layouts::global({1, 9}, huge, 7)})))
                    .branch(BranchSpec().causal().layout(layouts::strided(huge, 4, 3, 3)))
                    .build());
  std::vector<int64_t> many = {-40, -17, -9, -5, -3, -1, 0, 2, 3, 8, 21};
  out.push_back(PatternBuilder()
                    .branch(BranchSpec().layout(layouts::offsets(many, 4, 6)))
                    .branch(BranchSpec().window(30, -1).layout(layouts::global({0, 3, 5, 8, 11, 13, 40, 41, 90, 4000}, 5, 3)))
                    .branch(BranchSpec().layout(layouts::random(0.3, 77, 2, 3)))
                    .build());
  // Key blocks of 256 over tiles of 128 with strides up to 2: the random layout's two-block form.
  out.push_back(PatternBuilder()
                    .branch(BranchSpec().segment(700).dilation(2).layout(layouts::random(0.4, 5, 3, 256)))
                    .branch(BranchSpec().causal().layout(layouts::union_of({layouts::random(0.5, 6, 256, 256), layouts::local(0, 256, 256)})))
                    .build());
  return out;
}

}  // namespace

TEST_CASE("the generated mask predicate keeps exactly the pairs of the mask's definition, in both forms", "[mask][codegen][emu]") {
  std::vector<int64_t> heads;
  const std::vector<Pattern> patterns = patterns_under_test(heads);
  std::mt19937_64 rng(99);
  std::vector<Question> qs;
  for (size_t n = 0; n < patterns.size(); ++n) {
    const std::vector<Question> more = questions_for(patterns[n], int64_t(n), heads[n], rng);
    qs.insert(qs.end(), more.begin(), more.end());
  }
  const std::string mask_lib = TemplateSet::embedded().text("mask_lib.cuh");
  const std::vector<int> got = answers(unit_source(patterns, mask_lib), qs);
  CHECK(first_wrong(patterns, qs, got) == "");
  size_t kept = 0;
  for (int a : got) kept += a == 1;
  INFO(kept << " of " << qs.size() << " pairs kept");
  CHECK(kept > qs.size() / 20);  // both answers occur often: the comparison can fail
  CHECK(kept < qs.size() - qs.size() / 20);

  SECTION("a bound that is not clamped to 32 bits is caught") {
    std::string broken = mask_lib;
    const std::string clamp = "return x < -1 ? -1 : x > AJ_CS_LIMIT ? AJ_CS_LIMIT : (int)x;";
    REQUIRE(broken.find(clamp) != std::string::npos);
    broken.replace(broken.find(clamp), clamp.size(), "return (int)x;");
    CHECK(first_wrong(patterns, qs, answers(unit_source(patterns, broken), qs)) != "");
  }
}

TEST_CASE("the predicate is 32-bit unless the pattern's dilations reach 2^23", "[mask][codegen]") {
  const Pattern small = PatternBuilder().branch(BranchSpec().dilation(1 << 22).causal()).build();
  const Pattern big = PatternBuilder().branch(BranchSpec().dilation((1 << 22) + 1).causal()).branch(BranchSpec().dilation(2).causal()).build();
  CHECK(generate_mask_predicate(small).find("typedef int aj_cs;") != std::string::npos);
  CHECK(generate_mask_predicate(big).find("typedef aj_i64 aj_cs;") != std::string::npos);
  CHECK(generate_mask_predicate(small).find("cs <= aj_bound32(qpos - kbase)") != std::string::npos);
  CHECK(generate_mask_predicate(big).find("cs <= (qpos - kbase)") != std::string::npos);
  CHECK(pattern_has_mask(small));
  CHECK_FALSE(pattern_has_mask(PatternBuilder().branch(BranchSpec().dilation(2)).build()));
}

namespace {

// One seek question: for branch `branch` of pattern `pattern`, head `head`, queries [q_lo, q_hi]
// and keys [x, k_hi]: the layout's next key from x (aj_layout_next_key) and whether it keeps the
// tile whole (aj_layout_whole).
struct SeekQuestion {
  int64_t pattern, branch, head, q_lo, q_hi, x, k_hi;
};
struct SeekAnswer {
  int64_t next = -1, whole = -1;
};

// Every pattern's seek functions (AJ_KERNEL_SEEK) in a namespace of its own, and a kernel that asks them.
std::string seek_source(const std::vector<Pattern>& patterns, const std::function<std::string(std::string)>& edit) {
  const TemplateSet& t = TemplateSet::embedded();
  std::ostringstream os;
  os << "#define AJ_HEAD_DIM 64\n#define AJ_HEAD_DIM_V 64\n#define AJ_TILE_Q 64\n#define AJ_TILE_K 64\n"
        "#define AJ_STAGES 2\n#define AJ_WARPS 4\n#define AJ_DTYPE 0\n#define AJ_KERNEL_SEEK 1\n"
     << t.blocks() << t.text("kernel_abi.h") << t.text("common.cuh");
  // mask_lib.cuh declares the seek functions each pattern defines: a copy of it per namespace.
  for (size_t n = 0; n < patterns.size(); ++n)
    os << "namespace aj_case" << n << " {\n" << t.text("mask_lib.cuh") << edit(generate_mask_predicate(patterns[n])) << "}\n";
  os << "__device__ void aj_seek_answer(const AjParams& p, const aj_i64* q, aj_i64* a) {\n  switch (q[0]) {\n";
  for (size_t n = 0; n < patterns.size(); ++n)
    os << "    case " << n << ": a[0] = aj_case" << n << "::aj_layout_next_key(p, (int)q[1], (int)q[2], q[3], q[4], q[5]); a[1] = aj_case"
       << n << "::aj_layout_whole(p, (int)q[1], (int)q[2], q[3], q[4], q[5], q[6]); return;\n";
  os << "  }\n}\n"
        "extern \"C\" __global__ void seek_answers(const aj_i64* questions, aj_i64* answers, int n) {\n"
        "  AjParams p = {};\n"
        "  for (int i = aj_thread_idx(); i < n; i += 64) aj_seek_answer(p, questions + 7 * i, answers + 2 * i);\n}\n";
  return os.str();
}

std::vector<SeekAnswer> seek_answers(const std::string& source, const std::vector<SeekQuestion>& qs) {
  std::vector<int64_t> flat;
  for (const SeekQuestion& q : qs) flat.insert(flat.end(), {q.pattern, q.branch, q.head, q.q_lo, q.q_hi, q.x, q.k_hi});
  std::vector<SeekAnswer> out(qs.size());
  run_questions("seek_answers", source, flat, out);
  return out;
}

constexpr int64_t kNever = 0x7fffffffffffffffll;  // AJ_NEVER
constexpr int64_t kHorizon = 300;                 // keys past x asked of the definition

// The first answer that breaks the seek's contract, or "": the next key is >= x and no query of
// the range keeps a key in [x, next) (up to the horizon); a tile taken whole is kept whole.
// `skips` and `wholes` count the answers that skip keys and that take a tile whole.
std::string first_wrong_seek(const std::vector<Pattern>& patterns, const std::vector<SeekQuestion>& qs,
                             const std::vector<SeekAnswer>& got, size_t& skips, size_t& wholes) {
  skips = wholes = 0;
  for (size_t i = 0; i < qs.size(); ++i) {
    const SeekQuestion& q = qs[i];
    const Layout& l = *patterns[size_t(q.pattern)].branches[size_t(q.branch)].layout;
    auto kept = [&](int64_t qpos, int64_t kpos) { return layout_allows(l, q.head, qpos, kpos, nullptr); };
    std::ostringstream why;
    why << "pattern " << q.pattern << " branch " << q.branch << " head " << q.head << " queries [" << q.q_lo << ", " << q.q_hi
        << "] keys [" << q.x << ", " << q.k_hi << "]: next " << got[i].next << ", whole " << got[i].whole << ": ";
    if (got[i].next < q.x) return why.str() + "the next key lies before x\n" + canonical_text(patterns[size_t(q.pattern)]);
    skips += got[i].next > q.x;
    for (int64_t k = q.x; k < std::min(got[i].next, q.x + kHorizon); ++k)
      for (int64_t p = q.q_lo; p <= q.q_hi; ++p)
        if (kept(p, k))
          return why.str() + "skips the kept pair (" + std::to_string(p) + ", " + std::to_string(k) + ")\n" +
                 canonical_text(patterns[size_t(q.pattern)]);
    if (got[i].whole != 0 && got[i].whole != 1) return why.str() + "whole is no boolean";
    if (got[i].whole) {
      ++wholes;
      for (int64_t k = q.x; k <= q.k_hi; ++k)
        for (int64_t p = q.q_lo; p <= q.q_hi; ++p)
          if (!kept(p, k))
            return why.str() + "takes the tile whole, but (" + std::to_string(p) + ", " + std::to_string(k) + ") is not kept\n" +
                   canonical_text(patterns[size_t(q.pattern)]);
    }
  }
  return "";
}

}  // namespace

// The functions a kernel seeks with when the plan leaves a layout to it (random layouts above the
// planning threshold; tables on the device use the same, tested in the emulator's attention
// suite): random patterns' layouts with random nodes, and hand-made ones joining random layouts
// with every other kind, blocks smaller and larger than a tile, and query ranges over more than
// four row blocks (the random seek's "maybe").
TEST_CASE("the generated seek never passes a kept key and takes a tile whole only where the layout keeps it whole",
          "[mask][codegen][emu][random_in_kernel]") {
  std::vector<Pattern> patterns;
  std::vector<int64_t> heads;
  CaseGenerator gen(31415);
  while (patterns.size() < 24) {
    const auto c = gen.next();
    if (!c.dynamic && pattern_may_seek(c.pattern)) patterns.push_back(c.pattern), heads.push_back(c.shape.heads_q);
  }
  patterns.push_back(PatternBuilder()
                         .branch(BranchSpec().layout(layouts::union_of(
                             {layouts::local(1, 16, 16), layouts::global({0, 3}, 16, 16), layouts::random(0.1, 5, 16, 16)}, 16, 16)))
                         .branch(BranchSpec().layout(layouts::intersect_of(
                             {layouts::random(0.6, 9, 4, 6), layouts::offsets({-2, 0, 1}, 4, 6), layouts::strided(2, 1, 4, 6)})))
                         .branch(BranchSpec().layout(layouts::union_of(
                             {layouts::random(0.05, 3, 2, 2), layouts::explicit_blocks({{0, 5}, {3, 1}, {40, 77}}, 8, 8)})))
                         .branch(BranchSpec().layout(layouts::random(0.3, 8, 128, 128)))
                         .build());
  heads.push_back(3);
  std::mt19937_64 rng(27);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<SeekQuestion> qs;
  for (size_t n = 0; n < patterns.size(); ++n)
    for (size_t b = 0; b < patterns[n].branches.size(); ++b) {
      // The branches a kernel may seek through: those whose layouts hold a random node.
      if (!patterns[n].branches[b].layout || !layout_has_kind(*patterns[n].branches[b].layout, Layout::Kind::Random)) continue;
      for (int k = 0; k < 60; ++k) {
        const int64_t q_lo = uniform(0, 400), x = uniform(0, 500);
        qs.push_back({int64_t(n), int64_t(b), uniform(0, heads[n] - 1), q_lo, q_lo + uniform(0, k % 3 == 0 ? 40 : 5), x,
                      x + uniform(0, k % 2 == 0 ? 40 : 3)});
      }
    }
  const auto same = [](std::string s) { return s; };
  size_t skips = 0, wholes = 0;
  CHECK(first_wrong_seek(patterns, qs, seek_answers(seek_source(patterns, same), qs), skips, wholes) == "");
  INFO(skips << " answers skip keys, " << wholes << " take a tile whole, of " << qs.size());
  CHECK(skips > qs.size() / 10);  // the seek does skip: an answer of x everywhere would be right and useless
  CHECK(wholes > qs.size() / 50);

  SECTION("broken seeks are caught") {
    // The random scan starting one block late, and a tile over two query blocks taken whole.
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"for (aj_i64 b = ", "for (aj_i64 b = 1 + "},
                                   {" == q_hi / ", " <= q_hi / "}}) {
      INFO("broken: " << from << " -> " << to);
      const auto edit = [&, from = from, to = to](std::string s) {
        for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
        return s;
      };
      CHECK(first_wrong_seek(patterns, qs, seek_answers(seek_source(patterns, edit), qs), skips, wholes) != "");
    }
  }
}
