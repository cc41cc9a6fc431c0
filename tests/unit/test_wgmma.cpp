// The Hopper warpgroup MMA in the emulator: the descriptor and shared-memory layouts of the PTX
// ISA ("Matrix Descriptor Format", "Shared Memory Matrix Layout"), the register fragments, and
// kernels written in the building-block vocabulary that lay operands out as the attention kernels
// do (128-byte swizzle, K-major and N-major), against a plain matrix product; then each misuse
// the hardware leaves undefined, reported.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "compiler/codegen/templates.hpp"
#include "compiler/jit/jit.hpp"
#include "emulator/emu_compiler.hpp"
#include "emulator/emu_module.hpp"
#include "emulator/ptx_semantics.hpp"
#include "runtime/npy.hpp"

using namespace attnjit;
using namespace attnjit::emu;

TEST_CASE("wgmma descriptors decode as the PTX ISA's Matrix Descriptor Format", "[emu][ptx][wgmma]") {
  const uint64_t desc = uint64_t(0x2340 >> 4) | uint64_t(8192 >> 4) << 16 | uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
  const WgmmaDesc d = decode_wgmma_desc(desc);
  CHECK(d.start == 0x2340);
  CHECK(d.lbo == 8192);
  CHECK(d.sbo == 1024);
  CHECK(d.base_offset == 0);
  CHECK(d.swizzle == 128);
  CHECK(decode_wgmma_desc(uint64_t(2) << 62).swizzle == 64);
  CHECK(decode_wgmma_desc(uint64_t(3) << 62).swizzle == 32);
  CHECK(decode_wgmma_desc(0).swizzle == 0);
  CHECK(decode_wgmma_desc(uint64_t(5) << 49).base_offset == 5);
}

// The canonical layouts, element by element, for 16-bit types (T = 8 elements = 16 bytes).
TEST_CASE("wgmma shared-memory layouts: K-major and MN-major, every swizzle", "[emu][ptx][wgmma]") {
  WgmmaDesc d;
  d.start = 4096, d.lbo = 256, d.sbo = 512;
  SECTION("K-major, no swizzle: 8x16-byte core matrices, LBO along K, SBO along M") {
    CHECK(wgmma_element_address(d, false, 0, 0) == 4096);
    CHECK(wgmma_element_address(d, false, 1, 0) == 4096 + 16);
    CHECK(wgmma_element_address(d, false, 0, 7) == 4096 + 14);
    CHECK(wgmma_element_address(d, false, 0, 8) == 4096 + 256);
    CHECK(wgmma_element_address(d, false, 9, 9) == 4096 + 512 + 16 + 256 + 2);
  }
  SECTION("MN-major, no swizzle: LBO along K, SBO along M") {
    CHECK(wgmma_element_address(d, true, 1, 0) == 4096 + 2);
    CHECK(wgmma_element_address(d, true, 0, 1) == 4096 + 16);
    CHECK(wgmma_element_address(d, true, 8, 0) == 4096 + 512);
    CHECK(wgmma_element_address(d, true, 0, 8) == 4096 + 256);
  }
  SECTION("K-major, 128-byte swizzle: rows of 128 bytes, 16-byte chunk XOR row % 8") {
    d.swizzle = 128, d.sbo = 1024;
    CHECK(wgmma_element_address(d, false, 0, 0) == 4096);
    CHECK(wgmma_element_address(d, false, 1, 0) == 4096 + 128 + 16);      // chunk 0 of row 1 -> chunk 1
    CHECK(wgmma_element_address(d, false, 3, 9) == 4096 + 384 + 32 + 2);  // chunk 1 of row 3 -> chunk 2
    CHECK(wgmma_element_address(d, false, 8, 0) == 4096 + 1024);
    d.start = 4096 + 32;  // the next k16 step: 32 bytes into the row, the same rows
    CHECK(wgmma_element_address(d, false, 1, 0) == 4096 + 128 + 48);     // chunk 2 of row 1 -> chunk 3
  }
  SECTION("K-major, 64- and 32-byte swizzles") {
    d.swizzle = 64, d.sbo = 512;
    CHECK(wgmma_element_address(d, false, 1, 0) == 4096 + 64);            // rows 0 and 1: bits 7-8 are 0
    CHECK(wgmma_element_address(d, false, 2, 0) == 4096 + 128 + 16);      // rows 2 and 3: chunk ^ 1
    CHECK(wgmma_element_address(d, false, 2, 8) == 4096 + 128);
    CHECK(wgmma_element_address(d, false, 4, 0) == 4096 + 256 + 32);
    d.swizzle = 32, d.sbo = 256;
    CHECK(wgmma_element_address(d, false, 3, 0) == 4096 + 96);
    CHECK(wgmma_element_address(d, false, 4, 0) == 4096 + 128 + 16);
  }
  SECTION("MN-major, 128-byte swizzle: 64 elements of M/N per row, LBO to the next 64, SBO to the next 8 of K") {
    d.swizzle = 128, d.lbo = 8192, d.sbo = 1024;
    CHECK(wgmma_element_address(d, true, 5, 0) == 4096 + 10);
    CHECK(wgmma_element_address(d, true, 0, 1) == 4096 + 128 + 16);
    CHECK(wgmma_element_address(d, true, 64, 0) == 4096 + 8192);
    CHECK(wgmma_element_address(d, true, 0, 8) == 4096 + 1024);
    CHECK(wgmma_element_address(d, true, 70, 10) == ((4096 + 8192 + 12 + 2 * 128 + 1024) ^ (2 << 4)));
  }
}

TEST_CASE("wgmma register fragments: warp w owns rows 16w.., the mma.m16n8k16 layout within", "[emu][ptx][wgmma]") {
  // D: thread 37 (warp 1, lane 5: group 1, thread-in-group 1), register 6: 8-column block 1,
  // element 2 -> row 16 + 1 + 8, column 8 + 2.
  CHECK(wgmma_d_element(37, 6).row == 25);
  CHECK(wgmma_d_element(37, 6).col == 10);
  CHECK(wgmma_d_element(127, 63).row == 63);
  CHECK(wgmma_d_element(127, 63).col == 127);
  CHECK(wgmma_a_element(96, 3, 1).row == 48 + 8);
  CHECK(wgmma_a_element(96, 3, 1).col == 9);
}

namespace {

std::shared_ptr<const EmuModule> kernel(const std::string& name, const std::string& body) {
  const std::string source = TemplateSet::embedded().blocks() + "\nextern \"C\" __global__ void " + name +
                             "(aj_u32* a, aj_u32* b, int n) {\n" + body + "\n}\n";
  return load_emu_module(compile_for_emulator({name, source, "sm_90a", "", {}}, default_kernel_cache(), knobs()));
}

std::string run(const EmuModule& m, std::vector<uint32_t>& a, std::vector<uint32_t>& b, size_t shared, uint64_t seed = 0,
                unsigned threads = 128) {
  uint32_t *pa = a.data(), *pb = b.data();
  int n = 0;
  void* args[] = {&pa, &pb, &n};
  LaunchRequest r;
  r.block_threads = threads;
  r.dynamic_shared = shared;
  r.args = args;
  r.seed = seed;
  r.timeout_s = 60;
  r.buffers = {{"a", a.data(), a.size() * 4, 4, false}, {"b", b.data(), b.size() * 4, 4, true}};
  try {
    m.launch(r);
  } catch (const KernelFault& e) {
    return e.what();
  }
  return "";
}

// Small integers as fp16: every product and sum below is exact.
std::vector<uint16_t> small_halves(size_t n, int salt) {
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = float_to_half(static_cast<float>(int((i * 7 + size_t(salt) * 13) % 7) - 3));
  return h;
}

std::vector<uint32_t> words(const std::vector<uint16_t>& h) {
  std::vector<uint32_t> w((h.size() + 1) / 2);
  std::memcpy(w.data(), h.data(), h.size() * 2);
  return w;
}

// The kernels' output: thread t writes its accumulators d[i] at their (row, column) of a 64 x NN tile.
const char* kStoreD = R"(
  {
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int i = 0; i < NN / 2; ++i) {
      const int row = 16 * w + g + 8 * ((i % 4) >> 1), col = 8 * (i / 4) + 2 * q + (i & 1);
      b[row * NN + col] = aj_float_as_uint(d[i]);
    }
  })";

// A [64][64] and B [NN][64] (K-major: B's rows are its columns), 128-byte swizzle: row r's 16-byte
// chunk c at r * 128 + (c ^ r % 8) * 16. Four k16 steps move the descriptors' start 32 bytes each
// and accumulate without waiting in between.
std::string ss_body(bool fence, bool proxy_fence, bool overwrite, bool read_early, bool wait) {
  std::string s = R"(
  AJ_DYNAMIC_SHARED(sm);
  const int t = aj_thread_idx();
  unsigned char* tiles = sm + (1024 - aj_smem_addr(sm) % 1024) % 1024;
  const aj_u16* g = (const aj_u16*)a;
  for (int x = t; x < (64 + NN) * 8; x += 128) {
    const int r = x / 8, c = x % 8;
    aj_u16* dst = (aj_u16*)(tiles + r * 128 + (c ^ (r % 8)) * 16);
    for (int e = 0; e < 8; ++e) dst[e] = g[r * 64 + c * 8 + e];
  }
  )";
  if (proxy_fence) s += "aj_fence_proxy_async();\n";
  s += R"(
  aj_syncthreads();
  float d[NN / 2];
  for (int i = 0; i < NN / 2; ++i) d[i] = 0.0f;
  )";
  if (fence) s += "aj_wgmma_fence();\n";
  s += R"(
  const aj_u32 sa = aj_smem_addr(tiles), sb = sa + 64 * 128;
  for (int ks = 0; ks < 4; ++ks)
    aj_wgmma_ss<NN, AJ_WGMMA_F16, 0>(d, aj_wgmma_desc<128>(sa + ks * 32, 16, 1024), aj_wgmma_desc<128>(sb + ks * 32, 16, 1024), ks > 0);
  aj_wgmma_commit();
  )";
  if (read_early) s += "b[t] = aj_float_as_uint(d[0]);\n";
  if (overwrite) s += "aj_syncthreads();\nif (t == 0) ((aj_u16*)tiles)[5] = 0;\n";
  if (wait) s += "aj_wgmma_wait<0>();\n";
  if (!read_early) s += kStoreD;
  return s;
}

std::string with_n(std::string body, int n) { return "#define NN " + std::to_string(n) + "\n" + body + "\n#undef NN"; }

}  // namespace

TEST_CASE("wgmma with both operands in shared memory (128-byte swizzle, K-major) is A * B", "[emu][wgmma]") {
  for (int nn : {64, 128, 256}) {
    auto m = kernel("wgmma_ss_" + std::to_string(nn), with_n(ss_body(true, true, false, false, true), nn));
    const std::vector<uint16_t> ha = small_halves(64 * 64, 1), hb = small_halves(size_t(nn) * 64, 2);
    std::vector<uint16_t> all = ha;
    all.insert(all.end(), hb.begin(), hb.end());
    std::vector<uint32_t> a = words(all), b(size_t(64 * nn), 0);
    for (uint64_t seed : {0ull, 7ull}) {
      REQUIRE(run(*m, a, b, 1024 + size_t(64 + nn) * 128, seed).empty());
      for (int r = 0; r < 64; ++r)
        for (int c = 0; c < nn; ++c) {
          float want = 0;
          for (int k = 0; k < 64; ++k) want += half_to_float(ha[size_t(r * 64 + k)]) * half_to_float(hb[size_t(c * 64 + k)]);
          INFO("N " << nn << " row " << r << " col " << c);
          REQUIRE(std::bit_cast<float>(b[size_t(r * nn + c)]) == want);
        }
    }
  }
}

TEST_CASE("wgmma with A in registers and B N-major in shared memory (P V) is A * B", "[emu][wgmma]") {
  // A [64][64] row-major in registers (the mma A fragment of each warp's rows, per k16 step);
  // B [64 k][128 n] with n contiguous: two 64-column blocks (LBO apart), rows of 128 bytes swizzled.
  const std::string body = R"(
  AJ_DYNAMIC_SHARED(sm);
  const int t = aj_thread_idx();
  unsigned char* tiles = sm + (1024 - aj_smem_addr(sm) % 1024) % 1024;
  const aj_u16* ga = (const aj_u16*)a;
  const aj_u16* gb = ga + 64 * 64;
  for (int x = t; x < 64 * 16; x += 128) {
    const int r = x / 16, cb = (x % 16) / 8, c = x % 8;
    aj_u16* dst = (aj_u16*)(tiles + cb * 64 * 128 + r * 128 + (c ^ (r % 8)) * 16);
    for (int e = 0; e < 8; ++e) dst[e] = gb[r * 128 + cb * 64 + c * 8 + e];
  }
  aj_fence_proxy_async();
  aj_syncthreads();
  float d[NN / 2];
  const int w = t / 32, grp = (t % 32) / 4, q = t % 4;
  aj_u32 af[4][4];
  for (int ks = 0; ks < 4; ++ks)
    for (int reg = 0; reg < 4; ++reg) {
      const int row = 16 * w + grp + 8 * (reg & 1), col = 16 * ks + 2 * q + 8 * (reg >> 1);
      af[ks][reg] = (aj_u32)ga[row * 64 + col] | (aj_u32)ga[row * 64 + col + 1] << 16;
    }
  aj_wgmma_fence();
  const aj_u32 sb = aj_smem_addr(tiles);
  for (int ks = 0; ks < 4; ++ks)
    aj_wgmma_rs<NN, AJ_WGMMA_F16, 1>(d, af[ks], aj_wgmma_desc<128>(sb + ks * 16 * 128, 64 * 128, 1024), ks > 0);
  aj_wgmma_commit();
  aj_wgmma_wait<0>();
  )";
  auto m = kernel("wgmma_rs_128", with_n(body + kStoreD, 128));
  const std::vector<uint16_t> ha = small_halves(64 * 64, 3), hb = small_halves(64 * 128, 4);
  std::vector<uint16_t> all = ha;
  all.insert(all.end(), hb.begin(), hb.end());
  std::vector<uint32_t> a = words(all), b(64 * 128, 0);
  REQUIRE(run(*m, a, b, 1024 + 64 * 256).empty());
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 128; ++c) {
      float want = 0;
      for (int k = 0; k < 64; ++k) want += half_to_float(ha[size_t(r * 64 + k)]) * half_to_float(hb[size_t(k * 128 + c)]);
      INFO("row " << r << " col " << c);
      REQUIRE(std::bit_cast<float>(b[size_t(r * 128 + c)]) == want);
    }
}

TEST_CASE("wgmma misuse the hardware leaves undefined is reported", "[emu][wgmma]") {
  const std::vector<uint16_t> h = small_halves(128 * 64, 5);
  std::vector<uint32_t> a = words(h), b(64 * 64, 0);
  const size_t shared = 1024 + 128 * 128;
  SECTION("no wgmma.fence before the first wgmma") {
    auto m = kernel("wgmma_no_fence", with_n(ss_body(false, true, false, false, true), 64));
    CHECK_THAT(run(*m, a, b, shared), Catch::Contains("without a wgmma.fence"));
  }
  SECTION("shared memory written by threads and read by a wgmma with no fence.proxy.async") {
    auto m = kernel("wgmma_no_proxy_fence", with_n(ss_body(true, false, false, false, true), 64));
    CHECK_THAT(run(*m, a, b, shared), Catch::Contains("no fence.proxy.async"));
  }
  SECTION("an operand overwritten before the wait") {
    auto m = kernel("wgmma_overwrite", with_n(ss_body(true, true, true, false, true), 64));
    CHECK_THAT(run(*m, a, b, shared), Catch::Contains("changed before") && Catch::Contains("wgmma.wait_group"));
  }
  SECTION("an operand overwritten by another warpgroup before the wait (a wgmma completes as late as it may)") {
    // Warpgroup 0 issues, then lets warpgroup 1 past a named barrier, which overwrites an operand;
    // in index order warpgroup 0 would have waited before warpgroup 1 ran, but the wgmma completes
    // only once nothing else can go on, as on the hardware it may.
    std::string body = ss_body(true, true, false, false, false);
    body.replace(body.find("x += 128"), 8, "x += 256");  // 256 threads copy the tiles
    body.replace(body.find("  const aj_u32 sa"), 0, "  if (t >= 128) {\n    aj_named_sync(1, 256);\n    if (t == 128) ((aj_u16*)tiles)[5] = 0;\n    return;\n  }\n");
    body += "aj_named_arrive(1, 256);\naj_wgmma_wait<0>();\n";
    body += kStoreD;
    auto m = kernel("wgmma_overwrite_other_wg", with_n(body, 64));
    CHECK_THAT(run(*m, a, b, shared, 0, 256), Catch::Contains("changed before") && Catch::Contains("wgmma.wait_group"));
  }
  SECTION("accumulators read before the wait are NaN") {
    auto m = kernel("wgmma_read_early", with_n(ss_body(true, true, false, true, true), 64));
    REQUIRE(run(*m, a, b, shared).empty());
    for (int t = 0; t < 128; ++t) CHECK(std::isnan(std::bit_cast<float>(b[size_t(t)])));
  }
  SECTION("a thread that exits with a wgmma in flight") {
    auto m = kernel("wgmma_no_wait", with_n(ss_body(true, true, false, true, false), 64));
    CHECK_THAT(run(*m, a, b, shared), Catch::Contains("exits with wgmma.mma_async in flight"));
  }
  SECTION("a block that is not whole warpgroups") {
    auto m = kernel("wgmma_ok", with_n(ss_body(true, true, false, false, true), 64));
    CHECK_THAT(run(*m, a, b, shared, 0, 96), Catch::Contains("multiple of 128"));
  }
}

namespace {

// FP8 e4m3 codes of small integers (-3..3, a few zeros), so every product and sum is exact.
std::vector<uint8_t> small_e4m3(size_t n, int salt) {
  std::vector<uint8_t> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = float_to_e4m3(static_cast<float>(int((i * 5 + size_t(salt) * 11) % 7) - 3));
  return c;
}

// A [64][128] and B [NN][128] e4m3 codes, K-major with the 128-byte swizzle (a row of 128 bytes is
// 128 codes: the forward's Q K^T at head dim 128); four k32 steps move the descriptors' start 32
// bytes each. A from shared memory, or (A_REGS) from registers in the 8-bit fragment layout. TB:
// the imm-trans of B the emulator must refuse for 8-bit types.
std::string e4m3_body(bool a_regs, int trans_b = 0) {
  std::string s = R"(
  AJ_DYNAMIC_SHARED(sm);
  const int t = aj_thread_idx();
  unsigned char* tiles = sm + (1024 - aj_smem_addr(sm) % 1024) % 1024;
  const unsigned char* g = (const unsigned char*)a;
  for (int x = t; x < (64 + NN) * 8; x += 128) {
    const int r = x / 8, c = x % 8;
    unsigned char* dst = tiles + r * 128 + (c ^ (r % 8)) * 16;
    for (int e = 0; e < 16; ++e) dst[e] = g[r * 128 + c * 16 + e];
  }
  aj_fence_proxy_async();
  aj_syncthreads();
  const int w = t / 32, grp = (t % 32) / 4, q = t % 4;
  aj_u32 af[4][4];
  for (int ks = 0; ks < 4; ++ks)
    for (int reg = 0; reg < 4; ++reg) {
      const int row = 16 * w + grp + 8 * (reg & 1), col = 32 * ks + 4 * q + 16 * (reg >> 1);
      af[ks][reg] = 0;
      for (int byte = 0; byte < 4; ++byte) af[ks][reg] |= (aj_u32)g[row * 128 + col + byte] << (8 * byte);
    }
  float d[NN / 2];
  aj_wgmma_fence();
  const aj_u32 sa = aj_smem_addr(tiles), sb = sa + 64 * 128;
  for (int ks = 0; ks < 4; ++ks) {
    const aj_u64 db = aj_wgmma_desc<128>(sb + ks * 32, 16, 1024);
)";
  s += a_regs ? "    aj_wgmma_rs<NN, AJ_WGMMA_E4M3, TB>(d, af[ks], db, ks > 0);\n"
              : "    aj_wgmma_ss<NN, AJ_WGMMA_E4M3, TB>(d, aj_wgmma_desc<128>(sa + ks * 32, 16, 1024), db, ks > 0);\n";
  s += "  }\n  aj_wgmma_commit();\n  aj_wgmma_wait<0>();\n";
  s += kStoreD;
  return "#define TB " + std::to_string(trans_b) + "\n" + s + "\n#undef TB";
}

}  // namespace

TEST_CASE("wgmma register fragments of 8-bit A: four bytes a register, columns 4(l % 4) + byte + 16(r / 2)", "[emu][ptx][wgmma]") {
  // Thread 37 (warp 1, lane 5: group 1, thread-in-group 1), register 3, byte 2: row 16 + 1 + 8,
  // column 4 + 2 + 16.
  CHECK(wgmma_a_element_8bit(37, 3, 2).row == 25);
  CHECK(wgmma_a_element_8bit(37, 3, 2).col == 22);
  CHECK(wgmma_a_element_8bit(0, 0, 0).row == 0);
  CHECK(wgmma_a_element_8bit(127, 3, 3).row == 63);
  CHECK(wgmma_a_element_8bit(127, 3, 3).col == 31);
  // Every (row, column) of the 64 x 32 operand held exactly once.
  std::vector<int> seen(64 * 32, 0);
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < 4; ++r)
      for (int b = 0; b < 4; ++b) ++seen[size_t(wgmma_a_element_8bit(t, r, b).row * 32 + wgmma_a_element_8bit(t, r, b).col)];
  CHECK(std::count(seen.begin(), seen.end(), 1) == 64 * 32);
  // 8-bit K-major elements are bytes: element k of a swizzled row is its k-th byte.
  WgmmaDesc d;
  d.start = 4096, d.lbo = 16, d.sbo = 1024, d.swizzle = 128;
  CHECK(wgmma_element_address(d, false, 0, 17, 1) == 4096 + 17);
  CHECK(wgmma_element_address(d, false, 1, 0, 1) == 4096 + 128 + 16);  // row 1's chunk 0 -> chunk 1
  CHECK(wgmma_element_address(d, false, 8, 127, 1) == ((4096 + 1024 + 127) ^ 0));
}

TEST_CASE("wgmma on e4m3 operands (k32, shared memory or registers, 128-byte swizzle) is A * B", "[emu][wgmma][fp8]") {
  for (bool a_regs : {false, true})
    for (int nn : {64, 128}) {
      auto m = kernel(std::string("wgmma_e4m3_") + (a_regs ? "rs_" : "ss_") + std::to_string(nn), with_n(e4m3_body(a_regs), nn));
      const std::vector<uint8_t> ca = small_e4m3(64 * 128, 1), cb = small_e4m3(size_t(nn) * 128, 2);
      std::vector<uint8_t> all = ca;
      all.insert(all.end(), cb.begin(), cb.end());
      std::vector<uint32_t> a((all.size() + 3) / 4), b(size_t(64 * nn), 0);
      std::memcpy(a.data(), all.data(), all.size());
      REQUIRE(run(*m, a, b, 1024 + size_t(64 + nn) * 128).empty());
      for (int r = 0; r < 64; ++r)
        for (int c = 0; c < nn; ++c) {
          float want = 0;
          for (int k = 0; k < 128; ++k) want += e4m3_to_float(ca[size_t(r * 128 + k)]) * e4m3_to_float(cb[size_t(c * 128 + k)]);
          INFO((a_regs ? "A in registers" : "A in shared memory") << ", N " << nn << " row " << r << " col " << c);
          REQUIRE(std::bit_cast<float>(b[size_t(r * nn + c)]) == want);
        }
    }
}

TEST_CASE("an e4m3 wgmma with a transposed operand is refused", "[emu][wgmma][fp8]") {
  auto m = kernel("wgmma_e4m3_trans", with_n(e4m3_body(false, 1), 64));
  std::vector<uint32_t> a(128 * 128 / 4, 0), b(64 * 64, 0);
  CHECK_THAT(run(*m, a, b, 1024 + 128 * 128), Catch::Contains("e4m3 operands are K-major only"));
}
