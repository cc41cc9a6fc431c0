// The forward's kernel options against the float64 reference (docs/testing.md; the device under
// test and the knobs as in test_attention_gpu.cpp): FlashAttention-4's softmax methods (the lazy
// rescale, exponentials on the FMA pipe) and the Hopper TMA kernel's persistent blocks, each on
// every example, a random sweep and every tile the autotuner can choose.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "tests/gpu/attention_cases.hpp"

using namespace attnjit;
using namespace attnjit::gputest;

namespace {

// The softmax options' cases: every tensor-core path (the SIMT paths have no rescale or polynomial
// of their own), every example with random scores, and `examples` with each further kind of
// `data` ("extreme": scores past the old maximum plus 8 in every dtype); `set` turns the option
// on for a case of that kind.
std::vector<Case> softmax_option_cases(const std::string& option, uint64_t seed, const std::vector<std::string>& data_kinds,
                                       const std::vector<std::string>& examples,
                                       const std::function<void(Case&, const std::string&)>& set) {
  std::vector<Case> cases;
  for (const Path& path : forward_paths()) {
    if (path.arch < 80 || path.dtype == DType::F32) continue;
    for (const auto& [pname, pattern] : example_patterns())
      for (const std::string& data : data_kinds) {
        if (data != "random" && std::find(examples.begin(), examples.end(), pname) == examples.end()) continue;
        Case c;
        c.name = pname + "/" + option + "-" + data + "-" + path.name;
        c.pattern = pattern, c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma;
        c.seed = seed++;
        c.shape = make_shape(1, 300, 300, 4, 2, 64);
        if (data == "extreme") c.input_scale = path.dtype == DType::F16 ? 3e4f : 1e11f;
        set(c, data);
        cases.push_back(std::move(c));
      }
  }
  return cases;
}

}  // namespace

// FlashAttention-4's lazy rescale (RuntimeOptions::lazy_rescale): a row's running maximum moves only
// once a tile's passes it by more than 2^8, and O is rescaled only then. Every tensor-core path,
// on every example: random scores (the maximum rarely moves far enough: the skip), scores rising
// along the keys by about 7 (log2 units) a 64-key tile and 14 a 128-key one (some rows move at
// every tile, some every other: the rescale after skips), and extreme scores (the old maximum plus
// 8 rounds to itself: every growth moves it).
TEST_CASE("the lazy rescale gives the reference's softmax on every tensor-core path", "[gpu][emu][attention][lazy]") {
  SKIP_WITHOUT_GPU();
  check_cases("lazy-rescale", softmax_option_cases("lazy", 4700, {"random", "rising", "extreme"}, {"longnet", "causal_local"},
                                                   [](Case& c, const std::string& data) {
                                                     c.lazy_rescale = true;
                                                     // k[j][0] grows by 0.5 a key and q[i][0] >= 1 (about 1.8):
                                                     // with the scale 1/8, about 7 in log2 units a 64-key tile.
                                                     if (data == "rising") c.key_ramp = 0.5f;
                                                   }));
}

// Part of the exponentials on the FMA pipe (RuntimeOptions::poly_exp2: every fourth n-tile's by
// aj_ex2_poly), alone and with the lazy rescale (exponents up to 8): every tensor-core path, every
// example with random scores, two with extreme ones.
TEST_CASE("exponentials on the FMA pipe give the reference's softmax on every tensor-core path", "[gpu][emu][attention][poly]") {
  SKIP_WITHOUT_GPU();
  check_cases("poly-exp2", softmax_option_cases("poly", 4800, {"random", "lazy", "extreme"}, {"longnet", "sliding_window"},
                                                [](Case& c, const std::string& data) {
                                                  c.poly_exp2 = true;
                                                  c.lazy_rescale = data == "lazy";
                                                }));
}

// Both softmax options at once (the lazy rescale and the FMA-pipe exponentials) over a random sweep
// and every tile configuration the autotuner can choose, on the sm_80 and the Hopper TMA paths:
// every tile width the rescale skip and the polynomial's n-tiles meet (fp32 cases become bf16; the
// SIMT path takes neither option).
TEST_CASE("the softmax options give the reference on a random sweep and every tile", "[emu][attention][lazy][poly]") {
  if (target() != Target::Emu) { WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu)"); return; }
  std::vector<Case> cases;
  for (const bool sm90a : {false, true}) {
    int n = 0;
    for (Case& c : random_cases(sm90a ? 4990 : 4900, sweep_count("ATTNJIT_GPU_TESTS_RANDOM_SOFTMAX", 4, 8), true)) {
      if (c.dtype == DType::F32) c.dtype = DType::BF16;
      if (sm90a) c.shape.head_dim = c.shape.head_dim_v = int64_t{64} << (n % 3);  // the Hopper kernels' head dims
      c.arch = sm90a ? 90 : 80, c.sm90a = sm90a, c.tma = true;
      c.lazy_rescale = c.poly_exp2 = true;
      c.input_scale = n++ % 2 ? 3.0f : 1.0f;  // larger scores: the maximum moves past the skip's threshold more often
      c.name += sm90a ? "/sm90a/lazy-poly" : "/lazy-poly";
      cases.push_back(std::move(c));
    }
    for (Case& c : config_cases(203, sm90a ? 90 : 80, sm90a)) {
      if (c.dtype == DType::F32 || c.arch < 80) continue;
      c.lazy_rescale = c.poly_exp2 = true;
      c.name += "/lazy-poly";
      cases.push_back(std::move(c));
    }
  }
  check_cases("softmax-options", cases);
}

// Persistent blocks (RuntimeOptions::persistent_blocks): the Hopper TMA forward launched with fewer
// blocks than work units (items x batch entries), each block taking units in turn, its K/V rings
// running on from one item into the next. Every example at head dims 64 (192-row tiles, three
// consumer warpgroups) and 128; one block (every unit in it), two and three (rounds that leave
// blocks idle at the end), one per SM (the emu device's 4); a batch of 3 (units interleave the batch
// entries); GQA and a last tile cut short; head dim 256 in one block (one Q buffer, reused by
// every item); rows with work only (items without tiles between others); in the emulator also a
// random sweep and every tile the autotuner offers the Hopper path. On a GPU without the Hopper
// kernels the option must change nothing, which the same cases check.
TEST_CASE("persistent blocks give the reference on every example", "[gpu][emu][attention][persistent]") {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases;
  uint64_t seed = 9100;
  int n = 0;
  const std::vector<Path> paths = target() == Target::Emu ? std::vector<Path>{{"sm90a-tma-bf16", DType::BF16, 90, true, true}}
                                                          : std::vector<Path>{{"bf16", DType::BF16, 80, false, true}};
  for (const Path& path : paths)
    for (const auto& [pname, pattern] : example_patterns())
      for (const int64_t d : {int64_t(64), int64_t(128)}) {
        const int blocks = std::vector<int>{1, 2, 3, -1}[size_t(n++ % 4)];
        Case c;
        c.name = pname + "/persistent" + std::to_string(blocks) + "-" + path.name + "/d" + std::to_string(d);
        c.pattern = pattern, c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma;
        c.seed = seed++;
        c.shape = make_shape(d == 64 ? 3 : 1, 300, 300, 4, 2, d);
        c.persistent_blocks = blocks;
        cases.push_back(std::move(c));
      }
  // A random sweep (head dims 64, 128, 256; 1, 2 and 3 blocks) and every tile configuration the
  // autotuner offers the Hopper path, in two blocks: the Q buffers, O's staging and stores (where
  // shared memory has room for them) at every tile.
  if (target() == Target::Emu) {
    std::mt19937_64 rng(9190);
    int r = 0;
    for (Case& c : random_cases(9190, sweep_count("ATTNJIT_GPU_TESTS_RANDOM_PERSISTENT", 6, 12), true)) {
      const int64_t dims[] = {64, 128, 256};
      c.shape.head_dim = c.shape.head_dim_v = dims[rng() % 3];
      if (c.dtype == DType::F32) c.dtype = DType::BF16;
      c.arch = 90, c.sm90a = true, c.tma = true;
      c.persistent_blocks = 1 + r++ % 3;
      c.name += "/sm90a/persistent" + std::to_string(c.persistent_blocks);
      cases.push_back(std::move(c));
    }
    for (Case& c : config_cases(203, 90, true)) {
      c.persistent_blocks = 2;
      c.name += "/persistent2";
      cases.push_back(std::move(c));
    }
  }
  for (const Path& path : paths) {  // head dim 256: one Q buffer, which each item's Q waits for
    const auto [pname, pattern] = example_patterns().front();
    Case c;
    c.name = pname + "/persistent1-" + path.name + "/d256";
    c.pattern = pattern, c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma;
    c.seed = seed++;
    c.shape = make_shape(2, 300, 300, 4, 2, 256);
    c.persistent_blocks = 1;
    cases.push_back(std::move(c));
  }
  for (const Path& path : paths) {  // O stored by TMA through a map of row stride 2 (items of 128 rows)
    Case c;
    c.name = "dilated2-rows-with-work/persistent2-" + std::string(path.name);
    c.pattern = PatternBuilder().branch(BranchSpec().segment(512).dilation(2).offset(OffsetRule::HeadMod)).build();
    c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma;
    c.seed = seed++;
    c.shape = make_shape(1, 600, 600, 2, 1, 128);
    c.rows_with_work_only = true;  // the rows between a head's keep their poison: a store that strays there is caught
    c.persistent_blocks = 2;
    cases.push_back(std::move(c));
  }
  for (const Path& path : paths) {  // rows with work only: causal keys after most queries
    Case c;
    c.name = "causal-keys-later/persistent2-" + std::string(path.name);
    c.pattern = PatternBuilder().branch(BranchSpec().full().causal()).build();
    c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma;
    c.seed = seed++;
    c.shape = make_shape(2, 300, 300, 4, 2, 64, 0, 200);
    c.rows_with_work_only = true;
    c.persistent_blocks = 2;
    cases.push_back(std::move(c));
  }
  check_cases("persistent", cases);
}
