// The emulator's execution model and the checks the hardware does not make, each shown by a small
// kernel written in the building-block vocabulary (templates/blocks/).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "compiler/support/sha256.hpp"
#include "compiler/codegen/templates.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/support/error.hpp"
#include "emulator/emu_compiler.hpp"
#include "emulator/bank_profile.hpp"
#include "emulator/emu_module.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;

namespace {

// A kernel `name(aj_u32* a, aj_u32* b, int n)` from `body`, compiled once per text.
std::shared_ptr<const emu::EmuModule> kernel(const std::string& name, const std::string& body) {
  const std::string source = TemplateSet::embedded().blocks() + "\nextern \"C\" __global__ void " + name +
                             "(aj_u32* a, aj_u32* b, int n) {\n" + body + "\n}\n";
  return emu::load_emu_module(emu::compile_for_emulator({name, source, "sm_80", "", {}}, default_kernel_cache(), knobs()));
}

struct Run {
  std::vector<uint32_t> a, b;
  int n = 0;
  unsigned threads = 64, grid = 1;
  size_t shared = 0;
  uint64_t seed = 0;
  double timeout = 60;
  bool a_writable = true;
  size_t b_words = 0;  // 0: all of b is a buffer of the launch

  void operator()(const emu::EmuModule& m) {
    uint32_t *pa = a.data(), *pb = b.data();
    void* args[] = {&pa, &pb, &n};
    emu::LaunchRequest r;
    r.grid[0] = grid;
    r.block_threads = threads;
    r.dynamic_shared = shared;
    r.args = args;
    r.seed = seed;
    r.timeout_s = timeout;
    r.buffers = {{"a", a.data(), a.size() * 4, 4, a_writable}, {"b", b.data(), (b_words ? b_words : b.size()) * 4, 4, true}};
    m.launch(r);
  }
};

std::string fault(const emu::EmuModule& m, Run run) {
  try {
    run(m);
  } catch (const emu::KernelFault& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("threads, blocks, barriers and shuffles behave as on a GPU", "[emu]") {
  auto m = kernel("emu_basic", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* s = (aj_u32*)sm;
  const int t = aj_thread_idx();
  s[t] = a[aj_block_idx_x() * 64 + t];
  aj_syncthreads();
  const float v = (float)s[63 - t];
  b[aj_block_idx_x() * 64 + t] = (aj_u32)(v + aj_shfl_xor(v, 5));)");
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    Run r;
    r.a.resize(128);
    for (size_t i = 0; i < 128; ++i) r.a[i] = uint32_t(i * 3);
    r.b.assign(128, 0);
    r.grid = 2, r.shared = 256, r.seed = seed;
    r(*m);
    for (uint32_t blk = 0; blk < 2; ++blk)
      for (uint32_t t = 0; t < 64; ++t) {
        INFO("seed " << seed << " block " << blk << " thread " << t);
        CHECK(r.b[blk * 64 + t] == r.a[blk * 64 + 63 - t] + r.a[blk * 64 + 63 - (t ^ 5)]);
      }
  }
}

TEST_CASE("a missing barrier is a shared-memory race naming both threads and lines", "[emu][race]") {
  auto m = kernel("emu_race_raw", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* s = (aj_u32*)sm;
  const int t = aj_thread_idx();
  s[t] = 1;
  b[t] = s[(t + 1) % 64];)");
  Run r;
  r.a.assign(1, 0), r.b.assign(64, 0), r.shared = 256;
  const std::string e = fault(*m, r);
  CHECK_THAT(e, Catch::Contains("shared-memory race") && Catch::Contains("thread 0 (warp 0, lane 0)") &&
                    Catch::Contains("emu_race_raw.cu:") && Catch::Contains("__syncthreads() (or a cp.async wait"));
  // Reading a neighbour's word before it is written is a race too (write after read).
  auto war = kernel("emu_race_war", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* s = (aj_u32*)sm;
  const int t = aj_thread_idx();
  b[t] = s[(t + 1) % 64];
  s[t] = 1;)");
  CHECK_THAT(fault(*war, r), Catch::Contains("race (write after read)"));
}

TEST_CASE("global accesses outside the launch's buffers name the buffer and the element", "[emu][bounds]") {
  auto m = kernel("emu_bounds", R"(
  const int t = aj_thread_idx();
  if (t < n) b[t] = a[0];)");
  Run r;
  r.a.assign(4, 7), r.b.assign(64, 0), r.n = 40, r.b_words = 32;  // the launch says b has 32 words
  CHECK_THAT(fault(*m, r), Catch::Contains("global store of 4 bytes") && Catch::Contains("element 32 of 'b', which has 32 elements") &&
                               Catch::Contains("emu_bounds.cu:"));
  r.b_words = 0;
  CHECK(fault(*m, r).empty());
  auto ro = kernel("emu_read_only", "a[aj_thread_idx()] = 1;");
  r.a.assign(64, 0), r.a_writable = false;
  CHECK_THAT(fault(*ro, r), Catch::Contains("writes the read-only buffer 'a' at element 0"));
}

TEST_CASE("shared accesses past the block's shared memory are reported", "[emu][bounds]") {
  auto m = kernel("emu_shared_bounds", R"(
  AJ_DYNAMIC_SHARED(sm);
  ((aj_u32*)sm)[aj_thread_idx()] = 1;)");
  Run r;
  r.a.assign(1, 0), r.b.assign(1, 0), r.shared = 128;  // 32 words for 64 threads
  CHECK_THAT(fault(*m, r), Catch::Contains("shared store of 4 bytes at shared offset 128") &&
                               Catch::Contains("outside the block's shared memory (128 dynamic bytes"));
}

TEST_CASE("a barrier or a warp collective that not every thread reaches is an error, never a hang", "[emu][divergence]") {
  Run r;
  r.a.assign(1, 0), r.b.assign(64, 0);
  auto early_exit = kernel("emu_exit_before_barrier", R"(
  if (aj_thread_idx() >= 40) return;
  aj_syncthreads();)");
  CHECK_THAT(fault(*early_exit, r), Catch::Contains("can never finish") && Catch::Contains("threads 0-39 wait at __syncthreads()") &&
                                        Catch::Contains("threads 40-63 exited"));
  auto two_barriers = kernel("emu_two_barriers", R"(
  const int t = aj_thread_idx();
  if (t % 2) { b[t] = 1; aj_syncthreads(); } else { aj_syncthreads(); b[t] = 2; })");
  CHECK_THAT(fault(*two_barriers, r), Catch::Contains("threads wait at different __syncthreads()"));
  auto half_warp = kernel("emu_half_warp_shfl", R"(
  if (aj_thread_idx() % 32 < 16) b[aj_thread_idx()] = (aj_u32)aj_shfl_xor(1.0f, 1);)");
  CHECK_THAT(fault(*half_warp, r), Catch::Contains("wait for their warp at a warp-collective instruction") &&
                                       Catch::Contains("threads 16-31,48-63 exited"));
  auto two_sites = kernel("emu_two_shfl_sites", R"(
  const int t = aj_thread_idx();
  if (t % 2) { b[t] = 1; b[t] += (aj_u32)aj_shfl_xor(1.0f, 1); } else { b[t] = (aj_u32)aj_shfl_xor(2.0f, 2); b[t] *= 3; })");
  CHECK_THAT(fault(*two_sites, r), Catch::Contains("are at different warp-collective instructions"));
}

TEST_CASE("cp.async: the destination is poisoned until its group completes, src-size 0 zero-fills", "[emu][cp.async]") {
  auto m = kernel("emu_cp_async", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* s = (aj_u32*)sm;
  const int t = aj_thread_idx();
  aj_cp_async16(s + 8 * t, a + 8 * t, true);
  aj_cp_async_commit();
  aj_cp_async16(s + 8 * t + 4, a + 8 * t + 4, n == 0);
  aj_cp_async_commit();
  b[3 * t] = s[8 * t];          // before any wait: poison
  aj_cp_async_wait<1>();        // the first group only
  b[3 * t + 1] = s[8 * t];
  aj_cp_async_wait<0>();
  b[3 * t + 2] = s[8 * t + 4];)");
  Run r;
  r.threads = 32, r.shared = 1024;
  r.a.resize(256);
  for (size_t i = 0; i < 256; ++i) r.a[i] = uint32_t(i + 1);
  r.b.assign(96, 0);
  for (int n : {0, 1}) {
    r.n = n;
    r(*m);
    for (int t = 0; t < 32; ++t) {
      INFO("thread " << t << " n " << n);
      CHECK(r.b[size_t(3 * t)] == 0xffffffffu);
      CHECK(r.b[size_t(3 * t + 1)] == r.a[size_t(8 * t)]);
      CHECK(r.b[size_t(3 * t + 2)] == (n == 0 ? r.a[size_t(8 * t + 4)] : 0u));
    }
  }
  // A missing wait leaves another thread reading the poisoned destination: a race and NaN.
  auto no_wait = kernel("emu_cp_async_no_wait", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* s = (aj_u32*)sm;
  const int t = aj_thread_idx();
  aj_cp_async16(s + 4 * t, a + 4 * t, true);
  aj_cp_async_commit();
  aj_syncthreads();
  b[t] = s[4 * ((t + 1) % 32)];
  aj_cp_async_wait<0>();)");
  r.b.assign(32, 0);
  CHECK_THAT(fault(*no_wait, r), Catch::Contains("shared-memory race"));
}

TEST_CASE("a runaway block is stopped by the watchdog", "[emu][watchdog]") {
  auto m = kernel("emu_runaway", R"(
  while (a[0] == 0) b[aj_thread_idx()] += 1;)");
  Run r;
  r.a.assign(1, 0), r.b.assign(64, 0), r.timeout = 0.3;
  CHECK_THAT(fault(*m, r), Catch::Contains("ran longer than 0.3 s (ATTNJIT_EMU_TIMEOUT): a runaway loop?"));
}

TEST_CASE("fp32 arithmetic follows NVRTC's fast-math options: contraction to fma, subnormals flushed", "[emu][ptx]") {
  auto m = kernel("emu_fp32", R"(
  const float x = aj_uint_as_float(a[0]), y = aj_uint_as_float(a[1]), z = aj_uint_as_float(a[2]);
  b[0] = aj_float_as_uint(x * y + z);
  b[1] = aj_float_as_uint(x * aj_uint_as_float(a[3]));)");
  const float e = std::ldexp(1.0f, -12);
  Run r;
  r.threads = 1;
  auto u = [](float f) { uint32_t x; std::memcpy(&x, &f, 4); return x; };
  r.a = {u(1 + e), u(1 + e), u(-1.0f), u(std::ldexp(1.0f, -140))};
  r.b.assign(2, 0);
  r(*m);
  CHECK(r.b[0] == u(std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24)));  // unfused: 2^-11
  CHECK(r.b[1] == 0u);  // (1 + 2^-12) * 2^-140 is subnormal: flushed to +0
}

TEST_CASE("the emulator's host compiler: clear errors for a broken kernel and a missing compiler", "[emu][compile]") {
  const std::string src = TemplateSet::embedded().blocks() +
                          "\nextern \"C\" __global__ void emu_broken(aj_u32* a) {\n  a[0] = no_such_thing;\n}\n";
  try {
    emu::compile_for_emulator({"emu_broken", src, "sm_80", "", {}}, default_kernel_cache(), knobs());
    FAIL("a broken kernel compiled");
  } catch (const UserError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("the host compiler failed to build emu_broken") && Catch::Contains("-fsanitize=thread") &&
                         Catch::Contains("emu_broken.cu:"));
    // The source is listed with line numbers, the line the log names marked with '>'.
    const size_t line = what.find("|   a[0] = no_such_thing;");
    REQUIRE(line != std::string::npos);
    CHECK(what[what.rfind('\n', line) + 1] == '>');
  }
  Knobs k = knobs();
  k.emu_cxx = "attnjit-no-such-compiler";
  CHECK_THROWS_WITH(emu::host_compiler(k), Catch::Contains("ATTNJIT_EMU_CXX") && Catch::Contains("was not found"));
}

TEST_CASE("a host compiler that leaves no loadable object is an error and stores nothing, and a cached non-object is rebuilt",
          "[emu][compile][cache]") {
  attnjit::testing::TempDir tmp;
  KernelCache cache(tmp.path, int64_t{1} << 30);
  const std::string src = TemplateSet::embedded().blocks() +
                          "\nextern \"C\" __global__ void emu_checked(aj_u32* a, aj_u32* b, int n) {\n  a[0] = 7;\n}\n";
  const emu::EmuSource source{"emu_checked", src, "sm_80", "", {}};

  // `true` exits 0 and writes nothing.
  Knobs broken = knobs();
  broken.emu_cxx = "true";
  CHECK_THROWS_WITH(emu::compile_for_emulator(source, cache, broken),
                    Catch::Contains("emu_checked: the host compiler 'true' reported success but left no loadable shared object") &&
                        Catch::Contains("ATTNJIT_EMU_CXX"));
  CHECK(cache.list().empty());

  // An entry under the kernel's key that checks out but holds no object (as such a compiler once
  // left behind) is reported by the check `attnjit cache verify` makes, and rebuilt on use.
  const emu::HostCompiler& cxx = emu::host_compiler(knobs());
  CacheKeyParts parts;
  parts.attnjit_version = ATTNJIT_VERSION;
  parts.source_hash = sha256_hex(emu::emulation_unit(source));
  for (const std::string& f : cxx.compile_flags) parts.options += (parts.options.empty() ? "" : " ") + f;
  parts.nvrtc_version = "host compiler: " + cxx.version;
  parts.arch = "emu-sm_80";
  const CacheKey key = make_cache_key(parts);
  cache.put(key, {}, "emu_checked", "emu-sm_80");
  cache.put(make_cache_key({"0", "", "cubin", "", "13.0", "sm_80"}), {1, 2, 3}, "k", "sm_80");  // not the emulator's to judge
  std::vector<CacheEntryInfo> bad;
  CHECK(cache.verify_all(&bad, emu::emulator_entry_problem) == 1);
  REQUIRE(bad.size() == 1);
  CHECK(bad[0].hex == key.hex);
  CHECK(bad[0].problem == "holds no emulator kernel object: an empty file");
  CHECK(emu::shared_object_problem({0x7f, 'E', 'L', 'F'}) == "4 bytes, fewer than an ELF header");

  const std::shared_ptr<const emu::EmuBinary> rebuilt = emu::compile_for_emulator(source, cache, knobs());
  CHECK(rebuilt->key.hex == key.hex);
  CHECK_FALSE(rebuilt->cache_hit);
  CHECK(emu::shared_object_problem(rebuilt->shared_object).empty());
  CHECK(cache.verify_all(nullptr, emu::emulator_entry_problem) == 0);
}

TEST_CASE("named barriers: bar.sync waits for the count, bar.arrive goes on, mismatches are reported", "[emu][named]") {
  // Warps 0-1 produce into shared memory, arrive at barrier 1 and go on; warps 2-3 sync on it, read.
  auto handoff = kernel("emu_named_handoff", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* w = (aj_u32*)sm;
  const int t = aj_thread_idx();
  if (t < 64) {
    w[t] = a[t] * 3u + 1u;
    aj_named_arrive(1, 128);
  } else {
    aj_named_sync(1, 128);
    b[t - 64] = w[t - 64];
  })");
  Run r;
  r.threads = 128, r.shared = 256;
  for (uint32_t i = 0; i < 64; ++i) r.a.push_back(i * 7u);
  r.b.assign(64, 0);
  for (uint64_t seed : {0, 1, 2}) {
    r.seed = seed;
    r.b.assign(64, 0);
    r(*handoff);
    for (uint32_t i = 0; i < 64; ++i) CHECK(r.b[i] == i * 21u + 1u);
  }
  r.seed = 0;
  auto wrong_count = kernel("emu_named_count", R"(
  if (aj_thread_idx() < 64) aj_named_arrive(1, 128); else aj_named_sync(1, 96);)");
  CHECK_THAT(fault(*wrong_count, r), Catch::Contains("expect 128 threads"));
  auto bad_id = kernel("emu_named_id", R"(
  aj_named_sync(0, 128);)");
  CHECK_THAT(fault(*bad_id, r), Catch::Contains("not in 1..15"));
  auto never = kernel("emu_named_never", R"(
  if (aj_thread_idx() >= 64) aj_named_sync(2, 128);)");
  CHECK_THAT(fault(*never, r), Catch::Contains("can never finish") && Catch::Contains("wait at bar.sync 2 (64 of 128 threads arrived)"));
  auto unmatched = kernel("emu_named_unmatched", R"(
  if (aj_thread_idx() < 64) aj_named_arrive(3, 128);)");
  CHECK_THAT(fault(*unmatched, r), Catch::Contains("64 of 128 threads arrived at named barrier 3"));
}

TEST_CASE("__syncwarp: a warp's lanes meet, and a buffer private to the warp needs nothing more", "[emu][warp]") {
  // Each warp's lanes write their slot of the warp's buffer, meet, then read a neighbour's slot.
  auto swap = kernel("emu_syncwarp", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* w = (aj_u32*)sm;
  const int t = aj_thread_idx();
  w[t] = a[t] + 1u;
  aj_syncwarp();
  b[t] = w[(t & ~31) | ((t + 1) & 31)];)");
  Run r;
  r.threads = 128, r.shared = 512;
  for (uint32_t i = 0; i < 128; ++i) r.a.push_back(i * 5u);
  for (uint64_t seed : {0, 1, 2}) {
    r.seed = seed;
    r.b.assign(128, 0);
    r(*swap);
    for (uint32_t i = 0; i < 128; ++i) CHECK(r.b[i] == r.a[(i & ~31u) | ((i + 1) & 31u)] + 1u);
  }
  r.seed = 0;
  // Without it, the read races the neighbour's write.
  auto racy = kernel("emu_syncwarp_missing", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* w = (aj_u32*)sm;
  const int t = aj_thread_idx();
  w[t] = a[t] + 1u;
  b[t] = w[(t & ~31) | ((t + 1) & 31)];)");
  CHECK_THAT(fault(*racy, r), Catch::Contains("shared-memory race"));
  // A lane that skips it leaves the other 31 waiting: an error, not a hang.
  auto skipped = kernel("emu_syncwarp_divergent", R"(
  if (aj_thread_idx() % 32 != 7) aj_syncwarp();)");
  CHECK_THAT(fault(*skipped, r), Catch::Contains("can never finish"));
}

// aj_ex2_poly, the softmax's FMA-pipe exponential: 2^x within 1e-4 relative (the cubic's 8.6e-5 plus
// fp32 rounding) over the softmax's range and beyond, 2^n exactly at integers n, +0 below -126 and
// at -inf, +inf at +inf, NaN kept; monotone, as a softmax's weights must be in their scores.
TEST_CASE("the FMA-pipe exponential: within 1e-4 of 2^x and exact at integers", "[emulator][ptx]") {
  const auto m = kernel("ex2_poly", "const int t = aj_block_idx_x() * 64 + aj_thread_idx(); if (t < n) b[t] = "
                                    "aj_float_as_uint(aj_ex2_poly(aj_uint_as_float(a[t])));");
  std::vector<float> xs;
  for (int i = 0; i <= 13600; ++i) xs.push_back(-126.0f + 0.01f * float(i));  // -126 .. 10
  for (int n = -126; n <= 127; ++n) xs.push_back(float(n));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {-126.5f, -150.0f, -inf, inf, nan, -0.0f, 0.0f}) xs.push_back(x);
  Run r;
  r.n = int(xs.size());
  r.grid = unsigned((xs.size() + 63) / 64);
  r.a.resize(xs.size());
  std::memcpy(r.a.data(), xs.data(), xs.size() * 4);
  r.b.assign(xs.size(), 0);
  r(*m);
  auto got = [&](size_t i) {
    float y;
    std::memcpy(&y, &r.b[i], 4);
    return y;
  };
  double worst = 0;
  for (size_t i = 0; i <= 13600; ++i) {
    const double want = std::exp2(double(xs[i]));
    worst = std::max(worst, std::abs(double(got(i)) - want) / want);
    if (i > 0) REQUIRE(got(i) >= got(i - 1));  // monotone over the grid
  }
  CHECK(worst < 1e-4);
  CHECK(worst > 1e-6);  // a cubic, not the SFU's approximation: the test can tell them apart
  for (size_t i = 13601; i < 13601 + 254; ++i) {
    INFO("2^" << xs[i]);
    CHECK(got(i) == std::ldexp(1.0f, int(xs[i])));
  }
  const size_t s = 13601 + 254;
  CHECK(got(s) == 0.0f);      // -126.5: flushed, as ex2.approx.ftz flushes subnormal results
  CHECK(got(s + 1) == 0.0f);  // -150
  CHECK(got(s + 2) == 0.0f);  // -inf
  CHECK(std::isinf(got(s + 3)));
  CHECK(std::isnan(got(s + 4)));
  CHECK(got(s + 5) == 1.0f);
  CHECK(got(s + 6) == 1.0f);
}

// stmatrix (sm_90) run through the block executor: each of two warps stores four 8x8 matrices
// transposed at rows its lanes 8j..8j+7 give (row r of matrix j at 16 * (8 * j + r) bytes of the
// warp's 512), then, after a barrier, reads the other warp's. Without the barrier the read races
// the stores; a row address off 16 bytes is an error naming stmatrix.
TEST_CASE("stmatrix: the transposed rows land where the lanes say, race-checked and alignment-checked", "[emu][warp]") {
  const std::string store = R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u16* s = (aj_u16*)sm;
  const int t = aj_thread_idx(), w = t / 32, l = t % 32;
  const aj_u32 r[4] = {a[t * 4], a[t * 4 + 1], a[t * 4 + 2], a[t * 4 + 3]};
  aj_stmatrix_x4_trans(r, s + w * 256 + (8 * (l / 8) + l % 8) * 8 + SKEW);
  BARRIER
  for (int i = l; i < 256; i += 32) b[w * 256 + i] = s[(1 - w) * 256 + i];)";
  auto with = [&](const char* skew, const char* barrier) {
    std::string body = store;
    body.replace(body.find("SKEW"), 4, skew);
    body.replace(body.find("BARRIER"), 7, barrier);
    return body;
  };
  Run r;
  r.threads = 64, r.shared = 1024;
  for (uint32_t i = 0; i < 256; ++i) r.a.push_back((i * 2 + 1) << 16 | (i * 2));
  r.b.assign(512, 0xffffffffu);
  r(*kernel("emu_stmatrix", with("0", "aj_syncthreads();")));
  for (int w = 0; w < 2; ++w)
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < 4; ++j) {
        const int row = lane / 4, col = 2 * (lane % 4);
        const uint32_t reg = r.a[(w * 32 + lane) * 4 + j];
        // .trans: element (row, col) of matrix j goes to stored row col, column row; warp w's
        // matrices are read back by the other warp into b's other half.
        INFO("warp " << w << " lane " << lane << " matrix " << j);
        CHECK(r.b[(1 - w) * 256 + (8 * j + col) * 8 + row] == (reg & 0xffffu));
        CHECK(r.b[(1 - w) * 256 + (8 * j + col + 1) * 8 + row] == reg >> 16);
      }
  CHECK_THAT(fault(*kernel("emu_stmatrix_race", with("0", "")), r), Catch::Contains("shared-memory race"));
  CHECK_THAT(fault(*kernel("emu_stmatrix_misaligned", with("4", "aj_syncthreads();")), r),
             Catch::Contains("stmatrix") && Catch::Contains("not 16-byte aligned"));
}

TEST_CASE("the bank model: phases by access width, distinct words per bank, broadcasts free", "[emu][banks]") {
  auto lanes = [](int count, uint32_t bytes, auto off) {
    std::vector<emu::LaneAccess> out;
    for (int l = 0; l < count; ++l) out.push_back({uint32_t(off(l)), bytes, uint8_t(l)});
    return out;
  };
  auto wf = [](const std::vector<emu::LaneAccess>& l) {
    const emu::Wavefronts w = emu::thread_access_wavefronts(l);
    CHECK(w.instructions == 1);
    return std::make_pair(w.wavefronts, w.ideal);
  };
  using P = std::pair<uint64_t, uint64_t>;
  CHECK(wf(lanes(32, 4, [](int l) { return 4 * l; })) == P{1, 1});          // a word per bank
  CHECK(wf(lanes(32, 4, [](int l) { return 128 * l; })) == P{32, 1});       // one bank, 32 words
  CHECK(wf(lanes(32, 4, [](int l) { return 132 * l; })) == P{1, 1});        // a row of 33 words
  CHECK(wf(lanes(32, 4, [](int) { return 64; })) == P{1, 1});               // a broadcast
  CHECK(wf(lanes(32, 4, [](int l) { return 128 * (l % 4); })) == P{4, 1});  // four words, one bank
  CHECK(wf(lanes(32, 2, [](int l) { return 2 * l; })) == P{1, 1});          // two lanes a word
  CHECK(wf(lanes(32, 8, [](int l) { return 8 * l; })) == P{2, 2});          // half warps
  CHECK(wf(lanes(32, 16, [](int l) { return 16 * l; })) == P{4, 4});        // quarter warps
  CHECK(wf(lanes(32, 16, [](int l) { return 128 * l; })) == P{32, 4});      // 8 rows of 128 bytes, a quarter
  CHECK(wf(lanes(32, 16, [](int l) { return 144 * l; })) == P{4, 4});       // rows padded by 16 bytes
  CHECK(wf(lanes(8, 4, [](int l) { return 4 * l; })) == P{1, 1});           // a partial warp
  CHECK(wf(lanes(16, 8, [](int l) { return 256 * l; })) == P{16, 1});       // one half warp, one bank pair
  // Each half warp in its own bank pair: two phases of 16, where one phase would have been 16.
  CHECK(wf(lanes(32, 8, [](int l) { return 256 * (l % 16) + 8 * (l / 16); })) == P{32, 2});

  uint32_t rows[4][8];
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r) rows[j][r] = uint32_t(16 * (8 * j + r));  // contiguous rows
  emu::Wavefronts w = emu::matrix_wavefronts(rows, 4);
  CHECK((w.wavefronts == 4 && w.ideal == 4));
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r) rows[j][r] = uint32_t(128 * r + 16 * j);  // rows 128 bytes apart
  w = emu::matrix_wavefronts(rows, 4);
  CHECK((w.wavefronts == 32 && w.ideal == 4));
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r) rows[j][r] = uint32_t(128 * r + 16 * (j ^ r));  // the 128-byte swizzle
  w = emu::matrix_wavefronts(rows, 2);
  CHECK((w.wavefronts == 2 && w.ideal == 2));
}

// A kernel whose shared accesses conflict or not by its stride argument: the profile counts each
// warp instruction's wavefronts at its source line, and nothing while it is off.
TEST_CASE("the bank profile counts each shared access's wavefronts at its line", "[emu][banks]") {
  auto m = kernel("emu_banks", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* s = (aj_u32*)sm;
  const int t = aj_thread_idx();
  s[t * n] = a[t];
  aj_syncthreads();
  b[t] = s[(t % 4) * n];
  aj_syncthreads();
  aj_cp_async16(s + 4 * t * (n / 8), a + 4 * t, true);
  aj_cp_async_commit();
  aj_cp_async_wait<0>();
  aj_syncthreads();
  aj_u32 r[4];
  aj_ldmatrix_x4(r, s + 4 * t * (n / 8));
  b[t] += r[0];)");
  Run run;
  run.threads = 64, run.grid = 3, run.shared = 64 * 64 * 4 + 64;
  run.a.assign(64 * 4, 1);
  run.b.assign(64, 0);
  auto profile = [&](int n) {
    run.n = n;
    {
      emu::BankProfileScope on;
      run(*m);
    }
    std::map<emu::SharedOp, emu::Wavefronts> by_op;
    for (const emu::BankSite& s : emu::bank_profile()) {
      INFO(s.where);
      CHECK_THAT(s.where, Catch::Contains("emu_banks.cu:"));
      by_op[s.op] += s.count;
    }
    return by_op;
  };
  // 3 blocks of 2 warps: 6 warp instructions a site. n = 8: the stores' lanes 8 words apart (4
  // banks, 8 words each), the loads' 4 words in 4 banks, the cp.async and ldmatrix rows 16 bytes
  // apart (no conflict).
  auto ok = profile(8);
  CHECK(ok[emu::SharedOp::Store].instructions == 6);
  CHECK(ok[emu::SharedOp::Store].wavefronts == 6 * 8);
  CHECK(ok[emu::SharedOp::Store].ideal == 6);
  CHECK(ok[emu::SharedOp::Load].wavefronts == 6);
  CHECK(ok[emu::SharedOp::CpAsync].wavefronts == 6 * 4);
  CHECK(ok[emu::SharedOp::CpAsync].ideal == 6 * 4);
  CHECK(ok[emu::SharedOp::Ldmatrix].wavefronts == 6 * 4);
  CHECK(ok[emu::SharedOp::Ldmatrix].ideal == 6 * 4);
  // n = 64: every store in one bank, the loads' four words in it, the cp.async and ldmatrix rows
  // 128 bytes apart (8-way).
  auto bad = profile(64);
  CHECK(bad[emu::SharedOp::Store].wavefronts == 6 * 32);
  CHECK(bad[emu::SharedOp::Store].ideal == 6);
  CHECK(bad[emu::SharedOp::Load].wavefronts == 6 * 4);
  CHECK(bad[emu::SharedOp::CpAsync].wavefronts == 6 * 32);
  CHECK(bad[emu::SharedOp::Ldmatrix].wavefronts == 6 * 32);
  CHECK(bad[emu::SharedOp::Ldmatrix].ideal == 6 * 4);
  // The report puts the worst site first.
  const std::string report = emu::bank_report(emu::bank_profile());
  INFO(report);
  CHECK_THAT(report, Catch::Contains("wavefronts") && Catch::Contains("emu_banks.cu:"));
  const bool worst_first = report.find("32.00x") < report.find("8.00x") && report.find("8.00x") < report.find("4.00x");
  CHECK(worst_first);
  // Off: nothing counted.
  emu::clear_bank_profile();
  run.n = 32;
  run(*m);
  CHECK(emu::bank_profile().empty());
  CHECK(emu::bank_report({}).empty());
}

TEST_CASE("8- and 16-byte loads and stores are one access each, and must be aligned", "[emu][vector]") {
  auto m = kernel("emu_vector", R"(
  AJ_DYNAMIC_SHARED(sm);
  aj_u32* s = (aj_u32*)sm;
  const int t = aj_thread_idx();
  aj_st_u32x4(s + 4 * t + n, aj_ld_u32x4(a + 4 * t));
  aj_syncthreads();
  const aj_f32x2 f = aj_ld_f32x2(s + 2 * t);
  aj_st_f32x2(b + 2 * t, aj_f32x2{f.y, f.x});)");
  Run r;
  r.threads = 32, r.shared = 1024;
  for (uint32_t i = 0; i < 128; ++i) r.a.push_back(i * 7 + 1);
  r.b.assign(64, 0);
  r(*m);
  for (int i = 0; i < 32; ++i) {
    INFO("thread " << i);
    CHECK(r.b[size_t(2 * i)] == r.a[size_t(2 * i + 1)]);
    CHECK(r.b[size_t(2 * i + 1)] == r.a[size_t(2 * i)]);
  }
  // One word off: a 16-byte store at an address only 4-byte aligned (a misaligned address on a GPU).
  r.n = 1;
  CHECK_THAT(fault(*m, r), Catch::Contains("a 16-byte store by thread") && Catch::Contains("is not 16-byte aligned") &&
                               Catch::Contains("emu_vector.cu:"));
  // The bank profile sees the 16-byte store as one access: a quarter warp's 128 bytes a wavefront.
  r.n = 0;
  {
    emu::BankProfileScope on;
    r(*m);
  }
  uint64_t stores = 0, wavefronts = 0;
  for (const emu::BankSite& s : emu::bank_profile())
    if (s.op == emu::SharedOp::Store) stores += s.count.instructions, wavefronts += s.count.wavefronts;
  CHECK(stores == 1);
  CHECK(wavefronts == 4);
}
