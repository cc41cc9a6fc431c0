// TMA and mbarriers in the emulator: the tensor-map rules of cuTensorMapEncodeTiled, then a
// producer / consumer pipeline as the Hopper kernels run it (a producer thread loads tiles through
// TMA into two stages, a warpgroup of consumers waits for each and releases it), correct and with
// each synchronisation mistake it can make, and a wgmma reading a TMA tile. The layouts themselves
// (swizzle, element strides, out-of-bounds fill) are the probes' (tests/gpu/probes).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "compiler/codegen/templates.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/support/error.hpp"
#include "emulator/emu_compiler.hpp"
#include "emulator/emu_module.hpp"
#include "emulator/tensor_map.hpp"
#include "compiler/pattern/pattern.hpp"
#include "compiler/plan/plan.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/cuda/tma_maps.hpp"
#include "runtime/npy.hpp"

using namespace attnjit;
using namespace attnjit::emu;

namespace {

TensorMapSpec matrix_map(uint64_t address, uint64_t rows, uint32_t box_rows, int swizzle = 0) {
  TensorMapSpec m;
  m.type = TensorMapType::U16, m.rank = 2, m.address = address;
  m.dims = {64, rows}, m.strides = {0, 128}, m.box = {64, box_rows}, m.swizzle = swizzle;
  return m;
}

}  // namespace

TEST_CASE("tensor maps: the driver's rules, each named", "[emu][tma]") {
  const TensorMapSpec good = matrix_map(0x10000, 100, 32, 128);
  CHECK(tensor_map_problem(good).empty());
  auto problem = [&](auto&& change) {
    TensorMapSpec s = good;
    change(s);
    return tensor_map_problem(s);
  };
  CHECK_THAT(problem([](TensorMapSpec& s) { s.rank = 6; }), Catch::Contains("rank 6"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.address += 8; }), Catch::Contains("16-byte aligned"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.dims[1] = 0; }), Catch::Contains("dimension 1 has size 0"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.strides[1] = 120; }), Catch::Contains("multiples of 16"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.box[1] = 257; }), Catch::Contains("1..256"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.element_strides[1] = 9; }), Catch::Contains("element strides must be in 1..8"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.box[0] = 4, s.swizzle = 0; }), Catch::Contains("multiple of 16"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.swizzle = 64; }), Catch::Contains("more than the 64-byte swizzle"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.swizzle = 48; }), Catch::Contains("use 0, 32, 64 or 128"));
  CHECK_THAT(problem([](TensorMapSpec& s) { s.oob_nan = true; }), Catch::Contains("floating-point"));
  CHECK_THROWS_WITH(encode_emulated_tensor_map(TensorMapSpec{}), Catch::Contains("dimension 0 has size 0"));
  // The GPU's encoder checks the same rules before it asks the driver (so this runs anywhere).
  CHECK_THROWS_AS(encode_tensor_map(TensorMapSpec{}), UserError);

  const TensorMapBytes bytes = encode_emulated_tensor_map(good);
  const std::optional<TensorMapSpec> back = decode_emulated_tensor_map(bytes.bytes);
  REQUIRE(back);
  CHECK(back->dims == good.dims);
  CHECK(back->strides[1] == 128);
  CHECK(back->box == good.box);
  CHECK(back->swizzle == 128);
  const TensorMapBytes zeros{};
  CHECK_FALSE(decode_emulated_tensor_map(zeros.bytes));
  CHECK(box_bytes(good) == 64 * 32 * 2);
  TensorMapSpec strided = good;
  strided.box[1] = 48, strided.element_strides[1] = 3;
  CHECK(box_elements(strided, 1) == 16);
  CHECK(box_alignment(good) == 1024);
}

namespace {

constexpr int kTiles = 6;

// The pipeline (160 threads: warpgroup 0 consumes, thread 128 produces). Tile j (rows 32j..32j+31
// of a [192][64] 16-bit matrix) goes to stage j % 2; consumer t adds column t % 64 of rows
// 16 (t / 64)..+15 of every tile.
const char* kPipeline = R"(
extern "C" __global__ void pipeline(const aj_u32* in, aj_u32* out, const __grid_constant__ aj_tensor_map map) {
  AJ_DYNAMIC_SHARED(smem);
  aj_u16* stage[2] = {(aj_u16*)smem, (aj_u16*)(smem + STAGE1)};
  aj_u64* full = (aj_u64*)(smem + 8192);
  aj_u64* empty = full + 2;
  aj_u64* extra = full + 4;
  const int t = aj_thread_idx();
  if (t == 0) {
    for (int s = 0; s < 2; ++s) {
      aj_mbarrier_init(&full[s], 1);
      aj_mbarrier_init(&empty[s], 128);
    }
    aj_mbarrier_init(extra, 1);
  }
#ifndef BUG_NO_SYNC_AFTER_INIT
  aj_syncthreads();
#endif
  if (t >= 128) {
    if (t == 128) {
      for (int j = 0; j < TILES; ++j) {
        const int s = j % 2, use = j / 2;
#ifndef BUG_NO_EMPTY_WAIT
        if (use > 0) aj_mbarrier_wait(&empty[s], (aj_u32)((use - 1) % 2));
#endif
        aj_mbarrier_arrive_expect_tx(&full[s], TX);
        aj_tma_load_2d(stage[s], map, &full[s], 0, 32 * j);
      }
#ifdef BUG_EXIT_IN_FLIGHT
      aj_mbarrier_arrive_expect_tx(extra, 4096);
      aj_tma_load_2d(smem + 12288, map, extra, 0, 0);
#endif
    }
    return;
  }
  aj_u32 sum = 0;
  for (int j = 0; j < TILES; ++j) {
    const int s = j % 2, use = j / 2;
#ifndef BUG_NO_FULL_WAIT
    aj_mbarrier_wait(&full[s], (aj_u32)((use + PARITY_SHIFT) % 2));
#endif
#ifdef BUG_EARLY_RELEASE
    aj_mbarrier_arrive(&empty[s]);
#endif
    for (int r = 0; r < 16; ++r) sum += stage[s][(16 * (t / 64) + r) * 64 + t % 64];
#ifndef BUG_EARLY_RELEASE
    aj_mbarrier_arrive(&empty[s]);
#endif
  }
  out[t] = sum;
}
)";

std::shared_ptr<const EmuModule> pipeline(const std::string& defines) {
  const std::string source = TemplateSet::embedded().blocks() + "\n#define TILES " + std::to_string(kTiles) + "\n" +
                             defines + kPipeline;
  return load_emu_module(compile_for_emulator({"pipeline", source, "sm_90a", "", {}}, default_kernel_cache(), knobs()));
}

struct PipelineRun {
  std::vector<uint16_t> in = std::vector<uint16_t>(size_t(kTiles) * 32 * 64);
  std::vector<uint32_t> out = std::vector<uint32_t>(128, 0xDEADBEEF);
  PipelineRun() {
    for (size_t i = 0; i < in.size(); ++i) in[i] = uint16_t((i * 2654435761u) >> 20);
  }
  std::string run(const EmuModule& m, uint64_t seed = 0) {
    const TensorMapBytes map = encode_emulated_tensor_map(matrix_map(uintptr_t(in.data()), kTiles * 32, 32));
    const uint16_t* pin = in.data();
    uint32_t* pout = out.data();
    void* args[] = {&pin, &pout, const_cast<TensorMapBytes*>(&map)};
    LaunchRequest r;
    r.block_threads = 160;
    r.dynamic_shared = 16384;
    r.args = args;
    r.seed = seed;
    r.timeout_s = 60;
    r.buffers = {{"in", in.data(), in.size() * 2, 2, false}, {"out", out.data(), out.size() * 4, 4, true}};
    try {
      m.launch(r);
    } catch (const KernelFault& e) {
      return e.what();
    }
    return "";
  }
  uint32_t expected(int t) const {
    uint32_t sum = 0;
    for (int j = 0; j < kTiles; ++j)
      for (int r = 0; r < 16; ++r) sum += in[size_t((32 * j + 16 * (t / 64) + r) * 64 + t % 64)];
    return sum;
  }
};

const std::string kCorrect = "#define STAGE1 4096\n#define TX 4096\n#define PARITY_SHIFT 0\n";

}  // namespace

TEST_CASE("TMA pipeline: a producer and a warpgroup of consumers over two stages", "[emu][tma]") {
  auto m = pipeline(kCorrect);
  for (uint64_t seed : {0, 1, 2, 3}) {
    PipelineRun p;
    INFO("seed " << seed);
    REQUIRE(p.run(*m, seed).empty());
    for (int t = 0; t < 128; ++t) REQUIRE(p.out[size_t(t)] == p.expected(t));
  }
}

TEST_CASE("TMA pipeline: every synchronisation mistake is reported", "[emu][tma]") {
  struct Case {
    const char* name;
    std::string defines;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"consumers read without waiting", kCorrect + "#define BUG_NO_FULL_WAIT\n", {"has not written yet", "wait on the mbarrier"}},
      // The consumers run ahead of every load; the first impossible event is the producer
      // announcing a stage's next load while the phase of its first has not completed.
      {"consumers wait on the wrong parity", "#define STAGE1 4096\n#define TX 4096\n#define PARITY_SHIFT 1\n",
       {"more arrivals than the count"}},
      {"the producer refills a stage without waiting for its release", kCorrect + "#define BUG_NO_EMPTY_WAIT\n",
       {"more arrivals than the count"}},
      {"consumers release a stage before reading it", kCorrect + "#define BUG_EARLY_RELEASE\n", {"has not written yet"}},
      {"expect_tx announces too few bytes", "#define STAGE1 4096\n#define TX 2048\n#define PARITY_SHIFT 0\n",
       {"can never finish", "more bytes landed than expect_tx announced"}},
      {"expect_tx announces too many bytes", "#define STAGE1 4096\n#define TX 8192\n#define PARITY_SHIFT 0\n",
       {"can never finish", "expect_tx announced bytes no load brings", "for the phase of parity 0"}},
      {"mbarriers used before a barrier after their init", kCorrect + "#define BUG_NO_SYNC_AFTER_INIT\n",
       {"same barrier interval as its mbarrier.init"}},
      {"a load nobody waits for", kCorrect + "#define BUG_EXIT_IN_FLIGHT\n", {"ends with the TMA load", "in flight"}},
      {"a stage laid over the mbarriers", "#define STAGE1 6144\n#define TX 4096\n#define PARITY_SHIFT 0\n", {"part of an mbarrier"}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    PipelineRun p;
    const std::string error = p.run(*pipeline(c.defines));
    INFO(error);
    REQUIRE_FALSE(error.empty());
    for (const std::string& s : c.says) CHECK_THAT(error, Catch::Contains(s));
    CHECK_THAT(error, Catch::Contains("pipeline.cu:"));  // located in the kernel's source
  }
}

namespace {

// A 64 x 64 fp16 tile loaded by TMA with the 128-byte swizzle is a K-major wgmma operand as it
// lands: D = A[:, 0:16] * A[:, 0:16]^T. WAIT selects who waits on the mbarrier.
const char* kTmaWgmma = R"(
extern "C" __global__ void tma_wgmma(const aj_u32* in, aj_u32* out, const __grid_constant__ aj_tensor_map map) {
  AJ_DYNAMIC_SHARED(smem);
  aj_u64* bar = (aj_u64*)(smem + 8192);
  const int t = aj_thread_idx();
  if (t == 0) aj_mbarrier_init(bar, 1);
  aj_syncthreads();
  if (t == 0) {
    aj_mbarrier_arrive_expect_tx(bar, 8192);
    aj_tma_load_2d(smem, map, bar, 0, 0);
  }
#if WAIT == 0
  aj_mbarrier_wait(bar, 0);
#else
  if (t == 0) aj_mbarrier_wait(bar, 0);
#if WAIT == 1
  aj_syncthreads();
#endif
#endif
  const aj_u64 desc = aj_wgmma_desc<128>(aj_smem_addr(smem), 16, 1024);
  float d[32];
  aj_wgmma_fence();
  aj_wgmma_ss<64, AJ_WGMMA_F16, 0>(d, desc, desc, false);
  aj_wgmma_commit();
  aj_wgmma_wait<0>();
  const int w = t / 32, grp = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < 32; ++i)
    out[(16 * w + grp + 8 * ((i % 4) >> 1)) * 64 + 8 * (i / 4) + 2 * q + (i & 1)] = aj_float_as_uint(d[i]);
}
)";

}  // namespace

TEST_CASE("TMA feeds wgmma: a swizzled box is a K-major operand, which every thread must have observed", "[emu][tma][wgmma]") {
  std::vector<uint16_t> a(64 * 64);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float_to_half(float(int((i * 7919) % 9) - 4));
  for (const auto& [wait, ok] : std::vector<std::pair<int, bool>>{{0, true}, {1, true}, {2, false}}) {
    INFO("WAIT " << wait);
    const std::string source =
        TemplateSet::embedded().blocks() + "\n#define WAIT " + std::to_string(wait) + "\n" + kTmaWgmma;
    auto m = load_emu_module(compile_for_emulator({"tma_wgmma", source, "sm_90a", "", {}}, default_kernel_cache(), knobs()));
    const TensorMapBytes map = encode_emulated_tensor_map(matrix_map(uintptr_t(a.data()), 64, 64, 128));
    std::vector<uint32_t> out(64 * 64, 0xDEADBEEF);
    const uint16_t* pin = a.data();
    uint32_t* pout = out.data();
    void* args[] = {&pin, &pout, const_cast<TensorMapBytes*>(&map)};
    LaunchRequest r;
    r.block_threads = 128;
    r.dynamic_shared = 8192 + 8;
    r.args = args;
    r.timeout_s = 60;
    r.buffers = {{"a", a.data(), a.size() * 2, 2, false}, {"out", out.data(), out.size() * 4, 4, true}};
    std::string error;
    try {
      m->launch(r);
    } catch (const KernelFault& e) {
      error = e.what();
    }
    if (!ok) {
      CHECK_THAT(error, Catch::Contains("a completion the thread has not observed") && Catch::Contains("every thread of the warpgroup"));
      continue;
    }
    REQUIRE(error.empty());
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        float want = 0;
        for (int k = 0; k < 16; ++k) want += half_to_float(a[size_t(i * 64 + k)]) * half_to_float(a[size_t(j * 64 + k)]);
        float got;
        std::memcpy(&got, &out[size_t(i * 64 + j)], 4);
        REQUIRE(got == want);
      }
  }
}

TEST_CASE("TMA: a map the emulator cannot read, a wrong rank and a misaligned box are reported", "[emu][tma]") {
  const char* body = R"(
extern "C" __global__ void bad_tma(const aj_u32* in, aj_u32* out, const __grid_constant__ aj_tensor_map map) {
  AJ_DYNAMIC_SHARED(smem);
  aj_u64* bar = (aj_u64*)(smem + 16384);
  if (aj_thread_idx() == 0) {
    aj_mbarrier_init(bar, 1);
    aj_mbarrier_arrive_expect_tx(bar, 8192);
    LOAD;
    aj_mbarrier_wait(bar, 0);
  }
}
)";
  std::vector<uint16_t> a(64 * 64, 0);
  auto run = [&](const std::string& load, const TensorMapBytes& map) {
    const std::string source = TemplateSet::embedded().blocks() + "\n#define LOAD " + load + "\n" + body;
    auto m = load_emu_module(compile_for_emulator({"bad_tma", source, "sm_90a", "", {}}, default_kernel_cache(), knobs()));
    const uint16_t* pin = a.data();
    uint32_t* pout = nullptr;
    void* args[] = {&pin, &pout, const_cast<TensorMapBytes*>(&map)};
    LaunchRequest r;
    r.block_threads = 32;
    r.dynamic_shared = 16384 + 8;
    r.args = args;
    r.timeout_s = 60;
    r.buffers = {{"a", a.data(), a.size() * 2, 2, false}};
    try {
      m->launch(r);
    } catch (const KernelFault& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const TensorMapBytes good = encode_emulated_tensor_map(matrix_map(uintptr_t(a.data()), 64, 64, 128));
  CHECK(run("aj_tma_load_2d(smem, map, bar, 0, 0)", good).empty());
  CHECK_THAT(run("aj_tma_load_2d(smem, map, bar, 0, 0)", TensorMapBytes{}), Catch::Contains("not one the emulator can read"));
  CHECK_THAT(run("aj_tma_load_3d(smem, map, bar, 0, 0, 0)", good), Catch::Contains("rank 2") && Catch::Contains("3 coordinates"));
  CHECK_THAT(run("aj_tma_load_2d(smem + 512, map, bar, 0, 0)", good), Catch::Contains("not 1024-byte aligned"));
  // A map reaching past its buffer: the rows beyond the 64 the buffer holds are read.
  const TensorMapBytes too_long = encode_emulated_tensor_map(matrix_map(uintptr_t(a.data()), 128, 64, 128));
  CHECK_THAT(run("aj_tma_load_2d(smem, map, bar, 0, 32)", too_long), Catch::Contains("tensor map reaches past its buffer"));
}

namespace {

std::optional<TmaMapSpecs> specs_for(const std::vector<int>& rates, int64_t seq, void* k_data, std::string* why, int64_t d = 128,
                                     int tile_k = 128) {
  PatternBuilder b;
  for (int r : rates) b.branch(BranchSpec().segment(64 * r).dilation(r));
  const Pattern p = b.build();
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = seq, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = d;
  const Plan plan = lower_to_plan(p, s, TileConfig{128, tile_k});
  const Problem pb{2, seq, seq, 4, 2, d, d, DType::BF16, {}};
  static std::vector<uint16_t> v(size_t(2 * 1024 * 2 * 128));
  const TensorView k = TensorView::contiguous(k_data, DType::BF16, {2, seq, 2, d});
  const TensorView vv = TensorView::contiguous(v.data(), DType::BF16, {2, seq, 2, d});
  return tma_map_specs(plan, pb, k, vv, tile_k, why);
}

}  // namespace

TEST_CASE("the TMA forward's tensor maps: one per key stride, element strides up to 8, folded rows beyond", "[tma]") {
  alignas(64) static uint16_t k[2 * 1024 * 2 * 128];
  std::string why;
  SECTION("strides 1, 2 and 6: plain rows traversed with element strides") {
    const auto s = specs_for({1, 2, 6}, 768, k, &why);
    REQUIRE(s);
    REQUIRE(s->used == 3);
    CHECK(s->strides[0] == 1);
    CHECK(s->rows[0] == 128);
    CHECK(s->rows[1] == 128);  // 2 x 128 = 256
    CHECK(s->rows[2] == 32);   // 6 x 32 = 192 <= 256 < 6 x 64
    CHECK(s->fold[2] == 0);
    const emu::TensorMapSpec& m = s->k[2];
    CHECK(m.rank == 4);
    CHECK(m.dims == std::array<uint64_t, 5>{128, 2, 768, 2, 0});
    CHECK(m.strides[1] == 256);          // the kv head
    CHECK(m.strides[2] == 2 * 128 * 2);  // a row
    CHECK(m.box == std::array<uint32_t, 5>{64, 1, 192, 1, 0});
    CHECK(m.element_strides[2] == 6);
    CHECK(m.swizzle == 128);
  }
  SECTION("stride 16 dividing the length: folded by 2, every 8th folded row") {
    const auto s = specs_for({1, 16}, 1024, k, &why);
    REQUIRE(s);
    CHECK(s->fold[1] == 2);
    CHECK(s->rows[1] == 32);  // 8 x 32 = 256
    const emu::TensorMapSpec& m = s->v[1];
    CHECK(m.rank == 5);
    CHECK(m.dims == std::array<uint64_t, 5>{128, 2, 2, 512, 2});
    CHECK(m.strides[2] == 512);      // a row
    CHECK(m.strides[3] == 2 * 512);  // a folded row: two rows
    CHECK(m.box == std::array<uint32_t, 5>{64, 1, 1, 256, 1});
    CHECK(m.element_strides == std::array<uint32_t, 5>{1, 1, 1, 8, 1});
  }
  SECTION("LongNet's rates 1, 2, 4, 6, 12 at a length 12 does not divide: five maps, 12 folded by 2") {
    const auto s = specs_for({1, 2, 4, 6, 12}, 1000, k, &why);
    REQUIRE(s);
    REQUIRE(s->used == 5);
    CHECK(s->fold[4] == 2);
    CHECK(s->rows[4] == 32);  // 6 x 32 = 192
    CHECK(s->k[4].dims == std::array<uint64_t, 5>{128, 2, 2, 500, 2});
    CHECK(s->k[4].element_strides[3] == 6);
    // Odd lengths fold by 3 (12 / 3 = 4), or not at all.
    const auto odd = specs_for({1, 12}, 999, k, &why);
    REQUIRE(odd);
    CHECK(odd->fold[1] == 3);
    CHECK(odd->rows[1] == 64);  // 4 x 64 = 256
  }
  SECTION("176-key tiles: boxes of rows that divide the tile and are a multiple of 8 (1024-byte boundaries)") {
    const auto s = specs_for({1, 2, 4, 6, 12}, 1056, k, &why, 128, 176);
    REQUIRE(s);
    REQUIRE(s->used == 5);
    CHECK(s->rows[0] == 176);
    CHECK(s->rows[1] == 88);  // 2 x 88 = 176; 2 x 176 > 256
    CHECK(s->rows[2] == 16);  // 4 x 88 > 256: the next divisor that is a multiple of 8
    CHECK(s->rows[3] == 16);
    CHECK(s->fold[4] == 2);
    CHECK(s->rows[4] == 16);  // 12 folded by 2: element stride 6, 6 x 16 = 96
    for (int i = 0; i < s->used; ++i) {
      INFO("map " << i);
      CHECK(176 % s->rows[i] == 0);
      CHECK(s->rows[i] % 8 == 0);
    }
  }
  SECTION("what tensor maps cannot describe: the cp.async kernel runs instead") {
    CHECK_FALSE(specs_for({1, 16}, 1001, k, &why));  // 7 x 11 x 13: no even fold
    CHECK_THAT(why, Catch::Contains("key stride 16 (above 8) has no divisor f of seq_k 1001 with stride / f <= 8"));
    CHECK_FALSE(specs_for({1, 12}, 1001, k, &why));
    CHECK_FALSE(specs_for({1, 2, 3, 4, 5, 6, 7, 8, 16}, 1024, k, &why));
    CHECK_THAT(why, Catch::Contains("more than 8 key strides"));
    CHECK_FALSE(specs_for({1, 2}, 512, k + 1, &why));
    CHECK_THAT(why, Catch::Contains("16-byte aligned"));
  }
}

// The backward TMA kernel's maps (templates/bwd_sm90_tma.cuh): Q's and dO's, one pair per query
// stride of the key-major plan, 64-row query tiles, the query heads; the forward's rules.
TEST_CASE("the TMA backward's tensor maps: Q and dO per query stride of the key-major plan", "[tma][grad]") {
  alignas(64) static uint16_t q[2 * 2520 * 4 * 128 + 8], dout[2 * 2520 * 4 * 128];
  // One branch of dilation `rate` (segments of 64 x rate) beside a dense one of 64-row segments.
  auto specs = [&](const std::vector<int>& rates, int64_t seq, std::string* why, uint16_t* q_data) {
    PatternBuilder b;
    for (int r : rates) b.branch(BranchSpec().segment(64 * r).dilation(r));
    const Pattern p = b.build();
    Shape s;
    s.batch = 2, s.seq_q = s.seq_k = seq, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 128;
    const BackwardPlan kp = lower_to_backward_plan(lower_to_plan(p, s, TileConfig{64, 128}));
    const Problem pb{2, seq, seq, 4, 2, 128, 128, DType::BF16, {}};
    const TensorView qv = TensorView::contiguous(q_data, DType::BF16, {2, seq, 4, 128});
    const TensorView dv = TensorView::contiguous(dout, DType::BF16, {2, seq, 4, 128});
    // The plan keeps its entries' distinct strides (of more than one row), each once.
    std::vector<int64_t> distinct;
    for (const QueryEntry& e : kp.entries)
      if (e.rows.count > 1 && std::find(distinct.begin(), distinct.end(), e.rows.stride) == distinct.end())
        distinct.push_back(e.rows.stride);
    CHECK(kp.entry_row_strides == distinct);
    auto out = backward_tma_map_specs(kp, pb, qv, dv, 64, why);
    if (out)  // every entry of more than one row has its stride's maps
      for (const QueryEntry& e : kp.entries)
        if (e.rows.count > 1) CHECK(std::count(out->strides, out->strides + out->used, e.rows.stride) == 1);
    return out;
  };
  std::string why;
  const auto dense = specs({1}, 1000, &why, q);
  REQUIRE(dense);
  REQUIRE(dense->used == 1);
  CHECK(dense->rows[0] == 64);  // a 64-row query tile in one box
  const emu::TensorMapSpec& m = dense->k[0];  // Q
  CHECK(m.rank == 4);
  CHECK(m.dims == std::array<uint64_t, 5>{128, 4, 1000, 2, 0});  // the query heads
  CHECK(m.strides[1] == 256);
  CHECK(m.strides[2] == 4 * 128 * 2);
  CHECK(m.box == std::array<uint32_t, 5>{64, 1, 64, 1, 0});
  CHECK(m.address == reinterpret_cast<uintptr_t>(q));
  CHECK(dense->v[0].address == reinterpret_cast<uintptr_t>(dout));  // dO's maps in the second array
  const auto dilated = specs({12}, 1000, &why, q);  // stride 12, folded by 2: 6 x 32 = 192 rows a box
  REQUIRE(dilated);
  REQUIRE(dilated->used == 1);
  CHECK(dilated->strides[0] == 12);
  CHECK(dilated->fold[0] == 2);
  CHECK(dilated->rows[0] == 32);
  CHECK(dilated->k[0].dims == std::array<uint64_t, 5>{128, 4, 2, 500, 2});
  CHECK(specs({1, 2, 12}, 1000, &why, q));
  // What they cannot describe: the backward's fallback kernels run (the sm_80 ones at these tiles).
  CHECK_FALSE(specs({16}, 1001, &why, q));
  CHECK_THAT(why, Catch::Contains("query stride 16 (above 8) has no divisor f of seq_q 1001 with stride / f <= 8"));
  CHECK_FALSE(specs({1, 2, 3, 4, 5, 6, 7, 8, 9}, 2520, &why, q));  // 12 strides, each folding into 2520 rows
  CHECK_THAT(why, Catch::Contains("more than 8 query strides"));
  CHECK_FALSE(specs({1, 2}, 512, &why, q + 1));
  CHECK_THAT(why, Catch::Contains("16-byte aligned"));
}

// The forward's Q maps (templates/fwd_sm90_tma.cuh loads Q by TMA too): one per query-row stride of
// the plan's items of more than one row, tile_q-row boxes, the query heads; the keys' rules.
TEST_CASE("the TMA forward's Q maps: one per query-row stride of the plan's items", "[tma]") {
  alignas(64) static uint16_t q[2 * 2520 * 4 * 128 + 8], k[2 * 2520 * 2 * 128], v[2 * 2520 * 2 * 128];
  auto specs = [&](const std::vector<int>& rates, int64_t seq, int tile_q, std::string* why, uint16_t* q_data) {
    PatternBuilder b;
    for (int r : rates) b.branch(BranchSpec().segment(64 * r).dilation(r));
    Shape s;
    s.batch = 2, s.seq_q = s.seq_k = seq, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 128;
    const Plan plan = lower_to_plan(b.build(), s, TileConfig{tile_q, 128});
    const Problem pb{2, seq, seq, 4, 2, 128, 128, DType::BF16, {}};
    const TensorView qv = TensorView::contiguous(q_data, DType::BF16, {2, seq, 4, 128});
    auto out = query_tma_map_specs(plan, pb, qv, tile_q, why);
    if (out) {  // every item of more than one row has its stride's map; a one-row item's takes none
      std::vector<int64_t> distinct;
      for (const WorkItem& it : plan.items)
        if (it.rows.count > 1 && std::find(distinct.begin(), distinct.end(), it.rows.stride) == distinct.end())
          distinct.push_back(it.rows.stride);
      CHECK(std::vector<int64_t>(out->strides, out->strides + out->used) == (distinct.empty() ? std::vector<int64_t>{1} : distinct));
    }
    return out;
  };
  std::string why;
  const auto dense = specs({1}, 1000, 128, &why, q);
  REQUIRE(dense);
  REQUIRE(dense->used == 1);
  CHECK(dense->rows[0] == 128);  // a 128-row query tile in one box
  const emu::TensorMapSpec& m = dense->k[0];
  CHECK(m.rank == 4);
  CHECK(m.dims == std::array<uint64_t, 5>{128, 4, 1000, 2, 0});  // the query heads
  CHECK(m.strides[2] == 4 * 128 * 2);
  CHECK(m.box == std::array<uint32_t, 5>{64, 1, 128, 1, 0});
  CHECK(m.address == reinterpret_cast<uintptr_t>(q));
  CHECK(dense->v[0].address == 0);  // no second tensor
  CHECK(specs({1}, 1000, 192, &why, q)->rows[0] == 192);  // three warpgroups' rows in one box
  // The items of a LongNet-like plan split the rows by the branches that attend them: strides 12,
  // 4 and 2 here.
  auto map_of = [](const TmaMapSpecs& t, int64_t stride) {
    const int i = int(std::find(t.strides, t.strides + t.used, stride) - t.strides);
    REQUIRE(i < t.used);
    return i;
  };
  const auto dilated = specs({1, 2, 12}, 1000, 128, &why, q);
  REQUIRE(dilated);
  const int m12 = map_of(*dilated, 12), m4 = map_of(*dilated, 4);
  CHECK(dilated->fold[m12] == 2);  // 12 folded by 2: 6 x 32 = 192 rows a box
  CHECK(dilated->rows[m12] == 32);
  CHECK(dilated->k[m12].dims == std::array<uint64_t, 5>{128, 4, 2, 500, 2});
  CHECK(dilated->fold[m4] == 0);
  CHECK(dilated->rows[m4] == 64);  // 4 x 64 = 256
  // What they cannot describe: the forward's cp.async kernel runs, as for the keys' maps.
  CHECK_FALSE(specs({1, 16}, 1001, 128, &why, q));
  CHECK_THAT(why, Catch::Contains("query stride 16 (above 8) has no divisor f of seq_q 1001 with stride / f <= 8"));
  CHECK_FALSE(specs({1, 2}, 512, 128, &why, q + 1));
  CHECK_THAT(why, Catch::Contains("16-byte aligned"));
  // Both sets together: the keys' refusal or the queries' refuses the call.
  PatternBuilder b;
  b.branch(BranchSpec().segment(64).dilation(1)).branch(BranchSpec().segment(1024).dilation(16));
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = 1024, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 128;
  const Plan plan = lower_to_plan(b.build(), s, TileConfig{128, 128});
  const Problem pb{2, 1024, 1024, 4, 2, 128, 128, DType::BF16, {}};
  const auto both = forward_tma_map_specs(plan, pb, TensorView::contiguous(q, DType::BF16, {2, 1024, 4, 128}),
                                          TensorView::contiguous(k, DType::BF16, {2, 1024, 2, 128}),
                                          TensorView::contiguous(v, DType::BF16, {2, 1024, 2, 128}), nullptr, 128, 128, &why);
  REQUIRE(both);
  CHECK_FALSE(both->o);  // a kernel that does not stage O takes no O maps
  CHECK(both->kv.used == 2);
  CHECK(both->kv.strides[1] == 16);
  const int m16 = map_of(both->q, 16);
  CHECK(both->q.fold[m16] == 2);  // 16 folded by 2
  CHECK_FALSE(forward_tma_map_specs(plan, pb, TensorView::contiguous(q + 1, DType::BF16, {2, 1024, 4, 128}),
                                    TensorView::contiguous(k, DType::BF16, {2, 1024, 2, 128}),
                                    TensorView::contiguous(v, DType::BF16, {2, 1024, 2, 128}), nullptr, 128, 128, &why));
  CHECK_THAT(why, Catch::Contains("16-byte aligned"));
  // O's maps (a kernel that stages O and stores it by TMA): the same strides, boxes of a
  // warpgroup's 64 rows at most, the query heads and head_dim_v.
  alignas(64) static uint16_t o[2 * 1024 * 4 * 64 + 8];
  const TensorView ov = TensorView::contiguous(o, DType::BF16, {2, 1024, 4, 64});
  const Problem pbv{2, 1024, 1024, 4, 2, 128, 64, DType::BF16, {}};
  const auto with_o = forward_tma_map_specs(plan, pbv, TensorView::contiguous(q, DType::BF16, {2, 1024, 4, 128}),
                                            TensorView::contiguous(k, DType::BF16, {2, 1024, 2, 128}),
                                            TensorView::contiguous(v, DType::BF16, {2, 1024, 2, 64}), &ov, 128, 128, &why);
  REQUIRE(with_o);
  REQUIRE(with_o->o);
  CHECK(std::vector<int64_t>(with_o->o->strides, with_o->o->strides + with_o->o->used) ==
        std::vector<int64_t>(with_o->q.strides, with_o->q.strides + with_o->q.used));
  for (int i = 0; i < with_o->o->used; ++i) {
    INFO("map " << i);
    CHECK(with_o->o->rows[i] <= 64);
    CHECK(64 % with_o->o->rows[i] == 0);
    CHECK(with_o->o->k[i].address == reinterpret_cast<uintptr_t>(o));
    CHECK(with_o->o->k[i].dims[0] == 64);  // head_dim_v
  }
  CHECK(with_o->o->rows[map_of(*with_o->o, 2)] == 64);  // 2 x 64 = 128 <= 256
  const TmaForwardMaps fmaps = encode_forward_tma_maps(*with_o, true);
  CHECK(fmaps.orows.stride[0] == with_o->o->strides[0]);
  CHECK(fmaps.in.qr.stride[0] == with_o->q.strides[0]);
  const TensorView o_misaligned = TensorView::contiguous(o + 1, DType::BF16, {2, 1024, 4, 64});
  CHECK_FALSE(forward_tma_map_specs(plan, pbv, TensorView::contiguous(q, DType::BF16, {2, 1024, 4, 128}),
                                    TensorView::contiguous(k, DType::BF16, {2, 1024, 2, 128}),
                                    TensorView::contiguous(v, DType::BF16, {2, 1024, 2, 64}), &o_misaligned, 128, 128, &why));
  CHECK_THAT(why, Catch::Contains("16-byte aligned"));
  // Encoded, the Q maps and their rows sit after the keys' (AjTmaMaps::q and qr).
  const TmaMaps maps = encode_tma_maps(both->kv, true, &both->q);
  CHECK(maps.kv.stride[1] == 16);
  for (int i = 0; i < both->q.used; ++i) CHECK(maps.qr.stride[i] == both->q.strides[i]);
  CHECK(maps.qr.fold[m16] == 2);
  CHECK(maps.qr.stride[both->q.used] == 0);  // unused
  CHECK(encode_tma_maps(both->kv, true).qr.stride[0] == 0);  // the backward's: no Q maps
}

namespace {

// One block of `threads` running a kernel of the emulator module, its fault's text ("" if none).
std::string launch_block(const EmuModule& m, unsigned threads, size_t shared, void** args, std::vector<GlobalBuffer> buffers) {
  LaunchRequest r;
  r.block_threads = threads;
  r.dynamic_shared = shared;
  r.args = args;
  r.timeout_s = 60;
  r.buffers = std::move(buffers);
  try {
    m.launch(r);
  } catch (const KernelFault& e) {
    return std::string(e.what());
  }
  return std::string();
}

}  // namespace

// cp.reduce.async.bulk ... .add.f32 in the emulator: the adds land at the issuing thread's full
// wait, or after a .read wait by the kernel's end (the thread reading them back after only .read
// sees the old values, as it may on the GPU); a wrong size, a misaligned end, a source written
// without fence.proxy.async, a source changed before the wait and a thread that exits with its
// group pending are each reported by name.
TEST_CASE("bulk reduce: the adds land at the wait and its misuses are reported", "[emu][tma]") {
  const char* body = R"(
extern "C" __global__ void bulk(const float* in, float* out, float* seen) {
  AJ_DYNAMIC_SHARED(smem);
  float* buf = (float*)smem;
  const int t = aj_thread_idx();
  buf[t] = in[t];
  FENCE;
  aj_syncthreads();
  if (t == 0) {
    aj_bulk_reduce_add_f32(out + DST, buf + SRC, BYTES);
    aj_bulk_commit();
    CHANGE;
    WAIT;
    seen[0] = out[DST];  // what this thread reads back after the wait
  }
}
)";
  std::vector<float> in(32), out(48), seen(1);
  for (int i = 0; i < 32; ++i) in[size_t(i)] = 0.25f * float(i) - 3.0f;
  auto run = [&](const std::string& defines) {
    const std::string source = TemplateSet::embedded().blocks() + "\n" + defines + "\n" + body;
    auto m = load_emu_module(compile_for_emulator({"bulk", source, "sm_90a", "", {}}, default_kernel_cache(), knobs()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = float(i);
    const float* pin = in.data();
    float *pout = out.data(), *pseen = seen.data();
    void* args[] = {&pin, &pout, &pseen};
    return launch_block(*m, 32, 128, args,
                        {{"in", in.data(), in.size() * 4, 4, false}, {"out", out.data(), out.size() * 4, 4, true},
                         {"seen", seen.data(), 4, 4, true}});
  };
  const std::string ok = "#define FENCE aj_fence_proxy_async()\n#define CHANGE\n#define WAIT aj_bulk_wait_read<0>()\n";
  REQUIRE(run(ok + "#define DST 4\n#define SRC 8\n#define BYTES 64\n") == "");
  for (int i = 0; i < 48; ++i) {
    INFO("out[" << i << "]");
    CHECK(out[size_t(i)] == (i >= 4 && i < 20 ? float(i) + in[size_t(i + 4)] : float(i)));  // 16 floats from buf[8 ..] into out[4 ..]
  }
  CHECK(seen[0] == 4.0f);  // after .read the adds need not have landed: the old value
  REQUIRE(run("#define FENCE aj_fence_proxy_async()\n#define CHANGE\n#define WAIT aj_bulk_wait<0>()\n#define DST 4\n#define SRC 8\n"
              "#define BYTES 64\n") == "");
  CHECK(seen[0] == 4.0f + in[8]);  // after a full wait they have
  CHECK(out[4] == 4.0f + in[8]);
  CHECK_THAT(run(ok + "#define DST 4\n#define SRC 8\n#define BYTES 24\n"), Catch::Contains("a non-zero multiple of 16 bytes, got 24"));
  CHECK_THAT(run(ok + "#define DST 2\n#define SRC 8\n#define BYTES 16\n"), Catch::Contains("the global destination is not 16-byte aligned"));
  CHECK_THAT(run(ok + "#define DST 4\n#define SRC 2\n#define BYTES 16\n"), Catch::Contains("is not 16-byte aligned"));
  CHECK_THAT(run(ok + "#define DST 40\n#define SRC 0\n#define BYTES 64\n"), Catch::Contains("outside every buffer"));
  CHECK_THAT(run("#define FENCE\n#define CHANGE\n#define WAIT aj_bulk_wait_read<0>()\n#define DST 4\n#define SRC 8\n#define BYTES 64\n"),
             Catch::Contains("with no fence.proxy.async after it"));
  CHECK_THAT(run("#define FENCE aj_fence_proxy_async()\n#define CHANGE buf[9] = 1.0f\n#define WAIT aj_bulk_wait_read<0>()\n"
                 "#define DST 4\n#define SRC 8\n#define BYTES 64\n"),
             Catch::Contains("changed before thread 0") && Catch::Contains("the copy may still read it"));
  CHECK_THAT(run("#define FENCE aj_fence_proxy_async()\n#define CHANGE\n#define WAIT\n#define DST 4\n#define SRC 8\n#define BYTES 64\n"),
             Catch::Contains("exits with a bulk copy (cp.reduce.async.bulk or a TMA store) not waited for"));
}

// A TMA store in the emulator (cp.async.bulk.tensor ... global.shared::cta ... bulk_group): a box
// of 32 rows written by 128 threads in the 128-byte swizzle's layout goes to rows ROW0.. of a
// [40][64] matrix, rows past its end dropped; it lands at the issuing thread's wait, and a source
// written without fence.proxy.async, changed before the wait or never waited for is reported. Read
// back after a .read wait it is not there yet (it lands by the kernel's end); after a full wait it is.
// A box starting at a negative row is refused.
TEST_CASE("TMA store: a swizzled box lands at the wait, rows outside dropped, and its misuses are reported", "[emu][tma]") {
  const char* body = R"(
extern "C" __global__ void store(const aj_tensor_map* maps, unsigned short* out, unsigned short* seen) {
  AJ_DYNAMIC_SHARED(smem);
  unsigned char* tile = smem + ((1024 - aj_smem_addr(smem) % 1024) % 1024);
  const int t = aj_thread_idx();
  for (int e = t; e < 32 * 64; e += 128) {  // element (r, c) = 1000 r + c, where a load would put it
    const int r = e / 64, c = e % 64;
    *(unsigned short*)(tile + r * 128 + (((c / 8) ^ (r % 8)) << 4) + (c % 8) * 2) = (unsigned short)(1000 * r + c);
  }
  FENCE;
  aj_syncthreads();
  if (t == 0) {
    aj_tma_store_2d(maps[0], tile, 0, ROW0);
    aj_bulk_commit();
    CHANGE;
    WAIT;
    seen[0] = out[ROW0 * 64 + 5];
  }
}
)";
  std::vector<uint16_t> out(40 * 64), seen(1);
  auto run = [&](const std::string& defines) {
    const std::string source = TemplateSet::embedded().blocks() + "\n" + defines + "\n" +
                               "__device__ __forceinline__ void aj_tma_store_2d(const aj_tensor_map& map, const void* src, int c0, int c1) {\n"
                               "  const int c[2] = {c0, c1};\n  aj_emu_tma_store(&map, c, 2, src);\n}\n" + body;
    auto m = load_emu_module(compile_for_emulator({"store", source, "sm_90a", "", {}}, default_kernel_cache(), knobs()));
    std::fill(out.begin(), out.end(), uint16_t(7));
    alignas(64) static TensorMapBytes map;
    map = encode_emulated_tensor_map(matrix_map(uintptr_t(out.data()), 40, 32, 128));
    const TensorMapBytes* pmap = &map;
    uint16_t *pout = out.data(), *pseen = seen.data();
    void* args[] = {&pmap, &pout, &pseen};
    return launch_block(*m, 128, 2 * 4096, args,
                        {{"maps", &map, sizeof(map), 64, false}, {"out", out.data(), out.size() * 2, 2, true},
                         {"seen", seen.data(), 2, 2, true}});
  };
  const std::string ok = "#define FENCE aj_fence_proxy_async()\n#define CHANGE\n#define WAIT aj_bulk_wait_read<0>()\n";
  REQUIRE(run(ok + "#define ROW0 20\n") == "");
  for (int r = 0; r < 40; ++r)
    for (int c = 0; c < 64; ++c) {
      INFO("row " << r << ", column " << c);
      CHECK(out[size_t(r * 64 + c)] == (r >= 20 ? uint16_t(1000 * (r - 20) + c) : uint16_t(7)));  // box rows 20..39 land, 40..51 dropped
    }
  REQUIRE(run(ok + "#define ROW0 0\n") == "");
  CHECK(out[size_t(31 * 64 + 5)] == 31005);
  CHECK(out[size_t(32 * 64 + 5)] == 7);
  CHECK(seen[0] == 7);  // read back after .read: not landed yet
  REQUIRE(run("#define FENCE aj_fence_proxy_async()\n#define CHANGE\n#define WAIT aj_bulk_wait<0>()\n#define ROW0 0\n") == "");
  CHECK(seen[0] == 5);  // after a full wait: row 0, column 5
  CHECK_THAT(run("#define FENCE\n#define CHANGE\n#define WAIT aj_bulk_wait_read<0>()\n#define ROW0 0\n"),
             Catch::Contains("with no fence.proxy.async after it (the store reads through the async proxy)"));
  CHECK_THAT(run("#define FENCE aj_fence_proxy_async()\n#define CHANGE tile[0] = 1\n#define WAIT aj_bulk_wait_read<0>()\n#define ROW0 0\n"),
             Catch::Contains("the source of the TMA store") && Catch::Contains("changed before thread 0"));
  CHECK_THAT(run("#define FENCE aj_fence_proxy_async()\n#define CHANGE\n#define WAIT\n#define ROW0 0\n"),
             Catch::Contains("exits with a bulk copy"));
  // A store's box may leave the tensor at its far end only (the PTX ISA; an H200 raises an
  // illegal instruction for a box from row -4).
  CHECK_THAT(run(ok + "#define ROW0 -4\n"), Catch::Contains("must start at non-negative coordinates"));
}
