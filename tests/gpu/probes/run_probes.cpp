// attnjit_probes: runs the probe kernels (tests/gpu/probes/probes.cu), one per GPU building block,
// on the emulator or on GPU 0, and compares every output word with the golden files, which hold
// the emulator's answers. On the emulator this guards the emulator against regressions; on a GPU
// it settles the emulator's reading of the PTX ISA against the hardware, bit for bit (within a few
// ulps for the .approx instructions, whose special values must still match exactly).
//
//   attnjit_probes --device emu|gpu [--golden DIR] [--write-golden] [--report FILE]
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include "compiler/codegen/templates.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "emulator/emu_module.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/npy.hpp"

using namespace attnjit;

namespace {

enum class Compare { Exact, Approx };

struct Probe {
  const char* name;
  unsigned grid_x, grid_y, threads, shared_bytes;
  size_t out_words;
  Compare compare;
  std::function<std::vector<uint32_t>()> inputs;
  bool sm90a = false;  // built for sm_90a only: a GPU of another arch skips it
  // A TMA probe's tensor map over `in` (loads) or `out` (stores), given their addresses; the
  // kernel's third parameter.
  std::function<emu::TensorMapSpec(uint64_t in_address, uint64_t out_address)> map = nullptr;
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A fixed sequence (splitmix64), so every machine makes the same inputs.
struct Rng {
  uint64_t s;
  uint32_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 8) / 16777216.0f; }
  int small_int(int lo, int hi) { return lo + static_cast<int>(next() % uint32_t(hi - lo + 1)); }
};

std::vector<uint32_t> random_words(size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<uint32_t> w(n);
  for (auto& x : w) x = r.next();
  return w;
}

std::vector<uint32_t> random_floats(size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<uint32_t> w(n);
  for (auto& x : w) x = bits(r.uniform(-100.0f, 100.0f));
  return w;
}

// A, B as pairs of small integers in the 16-bit type, C as small integer floats: exact on any model.
std::vector<uint32_t> mma_inputs(bool bf16, uint64_t seed) {
  Rng r{seed};
  auto h = [&](int v) { return bf16 ? float_to_bfloat16(float(v)) : float_to_half(float(v)); };
  std::vector<uint32_t> w(32 * 10);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 6; ++i) w[lane * 10 + i] = uint32_t(h(r.small_int(-8, 8))) | uint32_t(h(r.small_int(-8, 8))) << 16;
    for (int i = 6; i < 10; ++i) w[lane * 10 + i] = bits(float(r.small_int(-64, 64)));
  }
  return w;
}

// Rounding ties, overflow, subnormal results, infinities, NaNs with and without payloads, zeros.
std::vector<uint32_t> cvt_inputs() {
  const std::vector<uint32_t> special = {
      bits(1.0f + 1.0f / 2048),   bits(1.0f + 3.0f / 2048),    bits(-(1.0f + 1.0f / 2048)), bits(1.0f + 1.0f / 256),
      bits(1.0f + 3.0f / 256),    bits(65504.0f),              bits(65519.0f),              bits(65520.0f),
      bits(1e6f),                 bits(-1e6f),                 bits(std::ldexp(1.0f, -24)), bits(std::ldexp(1.0f, -25)),
      bits(std::ldexp(3.0f, -25)), bits(std::ldexp(1.0f, -14)), bits(std::ldexp(1.5f, -15)), 0x00000000u,
      0x80000000u,                0x00000001u,                 0x807fffffu,                 0x7f800000u,
      0xff800000u,                0x7fc00000u,                 0xffc00000u,                 0x7f800001u,
      0x7fa12345u,                bits(3.3895314e38f),         bits(-0.333333343f),         bits(0.1f),
      0x00003c00u,                0x00007c00u,                 0x00007e01u,                 0x000003ffu,
      // f16 NaNs in the low half of odd words (cvt.f32.f16 reads in[2t+1]): quiet, quiet with a
      // payload and a sign, signalling, all ones.
      bits(2.5f),                 0x00007e00u,                 bits(-2.5f),                 0x0000fe01u,
      bits(0.75f),                0x00007c01u,                 bits(-0.75f),                0x00007fffu};
  std::vector<uint32_t> w = special;
  Rng r{77};
  while (w.size() < 128) w.push_back(bits(r.uniform(-70000.0f, 70000.0f)));
  return w;
}

// FP8 e4m3: ties at every scale (subnormal, normal, around the smallest normal 2^-6), the largest
// finite 448 and the saturation edge 464, infinities, NaNs of both signs, zeros, binary32
// subnormals, then random magnitudes from 2^-12 to 2^10 of both signs.
std::vector<uint32_t> e4m3_inputs() {
  std::vector<uint32_t> w = {
      bits(std::ldexp(1.0f, -10)), bits(std::ldexp(3.0f, -11)), bits(std::ldexp(5.0f, -11)), bits(std::ldexp(1.0f, -9)),
      bits(std::ldexp(15.0f, -10)), bits(std::ldexp(1.0f, -6)), bits(std::ldexp(17.0f, -10)), bits(1.0f + 1.0f / 16),
      bits(1.0f + 3.0f / 16),       bits(448.0f),               bits(456.0f),               bits(463.99997f),
      bits(464.0f),                 bits(464.00003f),           bits(480.0f),               bits(1e30f),
      0x7f800000u,                  0xff800000u,                0x7fc00000u,                0xffc00000u,
      0x7f800001u,                  0x00000000u,                0x80000000u,                0x00000001u,
      0x807fffffu,                  bits(-448.0f),              bits(-464.0f),              bits(-1e-3f),
      bits(0.1f),                   bits(-0.333333343f),        bits(240.0f),               bits(248.0f)};
  Rng r{91};
  while (w.size() < 256) {
    const float m = std::ldexp(r.uniform(1.0f, 2.0f), r.small_int(-12, 9));
    w.push_back(bits(r.next() & 1 ? -m : m));
  }
  // Then every byte value 0..255 once, four to a word, as raw FP8 codes for the decode.
  for (uint32_t c = 0; c < 256; c += 4) w.push_back(c | (c + 1) << 8 | (c + 2) << 16 | (c + 3) << 24);
  return w;
}

std::vector<uint32_t> ex2_lg2_inputs() {
  std::vector<uint32_t> w = {0xff800000u, 0x7f800000u, 0x7fc00000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u,
                             bits(1.0f), bits(-1.0f), bits(0.5f), bits(127.0f), bits(128.0f), bits(-126.0f),
                             bits(-127.5f), bits(-150.0f), bits(2.0f), bits(1e-30f), bits(-0.0001f)};
  Rng r{99};
  while (w.size() < 64) w.push_back(bits(r.uniform(-30.0f, 30.0f)));
  return w;
}

// The polynomial exp2's edges (NaN, infinities, the flush below -126, zeros of either sign,
// subnormals, integers, the largest fraction below one) and the softmax's range.
std::vector<uint32_t> ex2_poly_inputs() {
  std::vector<uint32_t> w = {0xff800000u, 0x7f800000u, 0x7fc00000u, 0xffc00000u, 0x00000000u, 0x80000000u, 0x00000001u,
                             0x80000001u, bits(-126.0f), bits(-126.5f), bits(-125.99f), bits(-150.0f), bits(8.0f),
                             bits(1.0f), bits(-1.0f), bits(0.5f), bits(-0.5f), bits(std::nextafter(1.0f, 0.0f)),
                             bits(-std::nextafter(1.0f, 0.0f)), bits(-1e-7f), bits(100.25f), bits(-33.75f)};
  Rng r{21};
  while (w.size() < 128) w.push_back(bits(r.uniform(-40.0f, 8.0f)));
  return w;
}

// a * b + c where fusing changes the result, and products that fall into the subnormal range.
std::vector<uint32_t> arith_inputs() {
  const float e = std::ldexp(1.0f, -12);
  std::vector<uint32_t> w = {bits(1 + e), bits(1 + e), bits(-1.0f),                    // fused: 2^-11 + 2^-24
                             bits(1 - e), bits(1 + e), bits(-1.0f),                    // fused: -2^-24
                             bits(std::ldexp(1.0f, -70)), bits(std::ldexp(1.0f, -70)), bits(std::ldexp(1.0f, -130)),
                             bits(std::ldexp(1.5f, -63)), bits(std::ldexp(1.0f, -64)), bits(0.0f),
                             0x00000010u, bits(1.0f), bits(1.0f)};  // a subnormal input reads as zero
  Rng r{5};
  while (w.size() < 3 * 64) w.push_back(bits(r.uniform(-4.0f, 4.0f)));
  return w;
}

// wgmma probes: A [64][64] then B [64][n], small integers in the 16-bit type (every sum exact).
std::vector<uint32_t> wgmma_inputs(int n, bool bf16, uint64_t seed) {
  Rng r{seed};
  std::vector<uint16_t> h(size_t(64 * 64 + 64 * n));
  for (auto& x : h) x = bf16 ? float_to_bfloat16(float(r.small_int(-4, 4))) : float_to_half(float(r.small_int(-4, 4)));
  std::vector<uint32_t> w(h.size() / 2);
  std::memcpy(w.data(), h.data(), h.size() * 2);
  return w;
}

// FP8 e4m3 codes of A [64][128] then B [64][128] (K-major): small integers (-4..4: every product and
// sum exact), or (`full_range`) any finite code, both signs, 2^-9 to 448.
std::vector<uint32_t> wgmma_e4m3_inputs(bool full_range, uint64_t seed) {
  Rng r{seed};
  std::vector<uint8_t> c(size_t(2 * 64 * 128));
  for (auto& x : c) {
    if (!full_range) {
      x = float_to_e4m3(float(r.small_int(-4, 4)));
    } else {
      do x = uint8_t(r.next());
      while ((x & 0x7f) == 0x7f);  // not NaN
    }
  }
  std::vector<uint32_t> w(c.size() / 4);
  std::memcpy(w.data(), c.data(), c.size());
  return w;
}

// mma.m16n8k32 e4m3's registers as mma_inputs lays them out: codes of small integers (-4..4:
// every product and sum exact), C small integers too.
std::vector<uint32_t> mma_e4m3_inputs(uint64_t seed) {
  Rng r{seed};
  std::vector<uint32_t> w(32 * 10);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 6; ++i)
      for (int byte = 0; byte < 4; ++byte) w[lane * 10 + i] |= uint32_t(float_to_e4m3(float(r.small_int(-4, 4)))) << (8 * byte);
    for (int i = 6; i < 10; ++i) w[lane * 10 + i] = bits(float(r.small_int(-64, 64)));
  }
  return w;
}

std::vector<uint32_t> small_integer_floats() {
  Rng r{11};
  std::vector<uint32_t> w(64);
  for (auto& x : w) x = bits(float(r.small_int(-100, 100)));
  return w;
}

// The TMA probes' tensors (16-bit words, `in` as written) and maps.
emu::TensorMapSpec tma_2d_map(uint64_t in, uint64_t) {
  emu::TensorMapSpec m;
  m.type = emu::TensorMapType::U16, m.rank = 2, m.address = in;
  m.dims = {64, 100}, m.strides = {0, 128}, m.box = {64, 64}, m.swizzle = 128;
  return m;
}
emu::TensorMapSpec tma_3d_strided_map(uint64_t in, uint64_t) {
  emu::TensorMapSpec m;
  m.type = emu::TensorMapType::U16, m.rank = 3, m.address = in;
  m.dims = {32, 3, 40}, m.strides = {0, 64, 192}, m.box = {32, 1, 48}, m.element_strides = {1, 1, 3}, m.swizzle = 64;
  return m;
}

// The store probe's map over `out`: the forward's O maps' shape (head dim, head, row, batch; the
// row traversed with the element stride).
emu::TensorMapSpec tma_store_map(uint64_t, uint64_t out) {
  emu::TensorMapSpec m;
  m.type = emu::TensorMapType::BF16, m.rank = 4, m.address = out;
  m.dims = {64, 3, 40, 2}, m.strides = {0, 128, 384, 40 * 384}, m.box = {64, 1, 32, 1}, m.element_strides = {1, 1, 2, 1};
  m.swizzle = 128;
  return m;
}

const std::vector<Probe>& probes() {
  static const std::vector<Probe> p = {
      {"probe_index", 3, 2, 64, 0, 6 * 64, Compare::Exact, [] { return std::vector<uint32_t>(1, 0); }},
      {"probe_shfl_xor", 1, 1, 64, 0, 5 * 64, Compare::Exact, [] { return random_floats(64, 1); }},
      {"probe_warp_uniform", 1, 1, 64, 0, 64, Compare::Exact, [] { return random_floats(64, 2); }},
      {"probe_syncthreads", 1, 1, 128, 0, 128, Compare::Exact, [] { return random_words(128, 2); }},
      {"probe_cp_async", 1, 1, 32, 1024, 256, Compare::Exact, [] { return random_words(256, 3); }},
      {"probe_ldmatrix_x1", 1, 1, 32, 2560, 128, Compare::Exact, [] { return random_words(640, 4); }},
      {"probe_ldmatrix_x2", 1, 1, 32, 2560, 128, Compare::Exact, [] { return random_words(640, 4); }},
      {"probe_ldmatrix_x4", 1, 1, 32, 2560, 128, Compare::Exact, [] { return random_words(640, 4); }},
      {"probe_ldmatrix_x1_trans", 1, 1, 32, 2560, 128, Compare::Exact, [] { return random_words(640, 4); }},
      {"probe_ldmatrix_x2_trans", 1, 1, 32, 2560, 128, Compare::Exact, [] { return random_words(640, 4); }},
      {"probe_ldmatrix_x4_trans", 1, 1, 32, 2560, 128, Compare::Exact, [] { return random_words(640, 4); }},
      {"probe_mma_f16", 1, 1, 32, 0, 128, Compare::Exact, [] { return mma_inputs(false, 5); }},
      {"probe_mma_bf16", 1, 1, 32, 0, 128, Compare::Exact, [] { return mma_inputs(true, 6); }},
      {"probe_cvt", 1, 1, 64, 0, 256, Compare::Exact, cvt_inputs},
      {"probe_ex2_lg2", 1, 1, 64, 0, 128, Compare::Approx, ex2_lg2_inputs},
      {"probe_fp32_arith", 1, 1, 64, 0, 128, Compare::Exact, arith_inputs},
      {"probe_ex2_poly", 1, 1, 64, 0, 128, Compare::Exact, ex2_poly_inputs},
      {"probe_prmt", 1, 1, 64, 0, 5 * 64, Compare::Exact, [] { return random_words(3 * 64, 26); }},
      {"probe_red_add", 2, 1, 64, 0, 8, Compare::Exact, small_integer_floats},
      {"probe_red_add_u32", 2, 1, 64, 0, 8, Compare::Exact, [] { return random_words(64, 18); }},
      {"probe_red_add_f32x2", 2, 1, 64, 0, 8, Compare::Exact, small_integer_floats},
      {"probe_wgmma_ss_sw128", 1, 1, 128, 1024 + 32768, 64 * 128, Compare::Exact, [] { return wgmma_inputs(128, false, 12); }, true},
      {"probe_wgmma_ss_sw128_n176", 1, 1, 128, 1024 + 16384 + 176 * 128, 64 * 176, Compare::Exact,
       [] { return wgmma_inputs(176, true, 28); }, true},
      {"probe_wgmma_rs_mn_sw128", 1, 1, 128, 1024 + 32768, 64 * 128, Compare::Exact, [] { return wgmma_inputs(128, true, 13); }, true},
      {"probe_wgmma_ss_sw32_interleave", 1, 1, 128, 1024 + 32768, 64 * 64, Compare::Exact, [] { return wgmma_inputs(64, false, 14); }, true},
      {"probe_wgmma_ss_mn_sw128", 1, 1, 128, 1024 + 32768, 64 * 64, Compare::Exact, [] { return wgmma_inputs(64, true, 19); }, true},
      {"probe_cvt_e4m3x2", 1, 1, 64, 0, 64 + 128, Compare::Exact, e4m3_inputs, true},
      {"probe_stmatrix_x4_trans", 1, 1, 32, 2560, 640, Compare::Exact, [] { return random_words(128, 27); }, true},
      {"probe_mma_e4m3", 1, 1, 32, 0, 128, Compare::Exact, [] { return mma_e4m3_inputs(24); }, true},
      {"probe_wgmma_e4m3_ss_sw128", 1, 1, 128, 1024 + 16384, 64 * 64, Compare::Exact, [] { return wgmma_e4m3_inputs(false, 21); }, true},
      {"probe_wgmma_e4m3_rs_sw128", 1, 1, 128, 1024 + 16384, 64 * 64, Compare::Exact, [] { return wgmma_e4m3_inputs(false, 22); }, true},
      {"probe_wgmma_e4m3_rounding", 1, 1, 128, 1024 + 16384, 64 * 64, Compare::Exact, [] { return wgmma_e4m3_inputs(true, 23); }, true},
      {"probe_red_add_bulk_f32", 1, 1, 64, 1024, 272, Compare::Exact, [] { return random_floats(256, 20); }, true},
      {"probe_mbarrier", 1, 1, 128, 16 + 1024, 4 * 128, Compare::Exact, [] { return random_words(128, 15); }, true},
      {"probe_tma_2d_sw128", 1, 1, 128, 1024 + 2 * 8192 + 8, 2 * 8192 / 4, Compare::Exact, [] { return random_words(100 * 64 / 2, 16); },
       true, tma_2d_map},
      {"probe_tma_3d_strided_sw64", 1, 1, 128, 1024 + 2 * 1024 + 8, 2 * 1024 / 4, Compare::Exact,
       [] { return random_words(40 * 3 * 32 / 2, 17); }, true, tma_3d_strided_map},
      {"probe_tma_store_strided_sw128", 1, 1, 128, 1024 + 2 * 2048, 2 * 40 * 3 * 64 / 2, Compare::Exact,
       [] { return random_words(2 * 2048 / 4, 29); }, true, tma_store_map},
  };
  return p;
}

// Outputs start poisoned, so a word a probe forgets shows; the accumulating probes start at 0.
uint32_t initial_word(const Probe& p) { return std::string(p.name).rfind("probe_red_add", 0) == 0 ? 0u : 0xDEADBEEFu; }

std::string probe_source() {
  std::ifstream in(ATTNJIT_PROBES_CU);
  if (!in) throw UserError(ATTNJIT_PROBES_CU, "cannot read the probe kernels");
  std::stringstream ss;
  ss << in.rdbuf();
  return TemplateSet::embedded().blocks() + "\n" + ss.str();
}

// ---- where probes run ------------------------------------------------------------------------

struct Runner {
  virtual ~Runner() = default;
  virtual std::vector<uint32_t> run(const Probe& p, const std::vector<uint32_t>& in) = 0;
};

struct EmuRunner : Runner {
  std::string source = probe_source();
  std::vector<uint32_t> run(const Probe& p, const std::vector<uint32_t>& in) override {
    std::vector<std::string> names;
    for (const Probe& q : probes()) names.push_back(q.name);
    auto module = emu::load_emu_module(emu::compile_for_emulator({"probes", source, "sm_80", "", names}, default_kernel_cache(), knobs()));
    std::vector<uint32_t> out(p.out_words, initial_word(p));
    const uint32_t* pin = in.data();
    uint32_t* pout = out.data();
    emu::TensorMapBytes map{};
    if (p.map) map = emu::encode_emulated_tensor_map(p.map(reinterpret_cast<uintptr_t>(in.data()), reinterpret_cast<uintptr_t>(out.data())));
    void* args[] = {&pin, &pout, &map};
    emu::LaunchRequest r;
    r.kernel = p.name;
    r.grid[0] = p.grid_x, r.grid[1] = p.grid_y;
    r.block_threads = p.threads;
    r.dynamic_shared = p.shared_bytes;
    r.args = args;
    r.buffers = {{"in", in.data(), in.size() * 4, 4, false}, {"out", out.data(), out.size() * 4, 4, true}};
    module->launch(r);
    return out;
  }
};

struct GpuRunner : Runner {
  std::string source = probe_source();
  std::string arch;
  GpuRunner() {
    shared_context(0).make_current();
    const DeviceInfo d = device_info(0);
    arch = "sm_" + std::to_string(d.cc_major * 10 + d.cc_minor) + (d.cc_major == 9 ? "a" : "");
    std::cout << "probes on " << d.name << " (" << arch << ")\n";
  }
  std::vector<uint32_t> run(const Probe& p, const std::vector<uint32_t>& in) override {
    CompileRequest req;
    req.name = p.name;
    req.source = source;
    req.arch = arch;
    req.options = kernel_compile_options();
    const CompileResult c = compile_cubin(req);
    Module m(c.cubin, p.name);
    DeviceBuffer din(in.size() * 4), dout(p.out_words * 4);
    copy_to_device(din.get(), in.data(), in.size() * 4);
    std::vector<uint32_t> out(p.out_words, initial_word(p));
    copy_to_device(dout.get(), out.data(), out.size() * 4);
    CUdeviceptr pin = din.get(), pout = dout.get();
    emu::TensorMapBytes map{};
    if (p.map) map = encode_tensor_map(p.map(pin, pout));
    void* args[] = {&pin, &pout, &map};
    launch(m.function(p.name), p.grid_x, p.grid_y, 1, p.threads, p.shared_bytes, nullptr, args, p.name);
    synchronize(nullptr, p.name);
    copy_to_host(out.data(), dout.get(), out.size() * 4);
    return out;
  }
};

// ---- golden files ------------------------------------------------------------------------------

std::string golden_path(const std::string& dir, const Probe& p) { return dir + "/" + p.name + ".txt"; }

void write_golden(const std::string& dir, const Probe& p, const std::vector<uint32_t>& w) {
  std::ofstream f(golden_path(dir, p));
  f << "# " << p.name << ": the emulator's output words (tests/gpu/probes/run_probes.cpp --write-golden); compare "
    << (p.compare == Compare::Exact ? "exact" : "approx (4 ulp; special values exact)") << "\n";
  for (size_t i = 0; i < w.size(); ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", w[i]);
    f << buf << ((i % 8 == 7 || i + 1 == w.size()) ? "\n" : " ");
  }
}

std::vector<uint32_t> read_golden(const std::string& dir, const Probe& p) {
  std::ifstream f(golden_path(dir, p));
  if (!f) throw UserError(golden_path(dir, p), "no golden file; make them with attnjit_probes --device emu --write-golden");
  std::vector<uint32_t> w;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string tok;
    while (ss >> tok) w.push_back(static_cast<uint32_t>(std::stoul(tok, nullptr, 16)));
  }
  return w;
}

bool special(uint32_t u) {
  const uint32_t e = (u >> 23) & 0xff;
  return e == 0 || e == 0xff;  // zero, subnormal, inf, NaN
}

bool agree(uint32_t got, uint32_t want, Compare c) {
  if (got == want) return true;
  if (c == Compare::Exact || special(got) || special(want) || (got >> 31) != (want >> 31)) return false;
  const int64_t d = int64_t(got & 0x7fffffff) - int64_t(want & 0x7fffffff);
  return std::abs(d) <= 4;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attnjit probes: the building blocks of the kernels, emulator against golden files or hardware"};
  std::string device = "emu", golden = ATTNJIT_PROBES_GOLDEN, report;
  bool write = false;
  app.add_option("--device", device, "emu or gpu")->check(CLI::IsMember({"emu", "gpu"}))->capture_default_str();
  app.add_option("--golden", golden, "directory of the golden files")->capture_default_str();
  app.add_flag("--write-golden", write, "write the emulator's outputs as the golden files (device emu only)");
  app.add_option("--report", report, "append one line per probe (name, words, mismatches) to this file");
  std::vector<std::string> compile_archs;
  app.add_option("--compile", compile_archs,
                 "only compile the probe kernels with NVRTC for these architectures (no GPU needed) and report")
      ->excludes("--write-golden");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!compile_archs.empty()) {  // the hardware forms of the building blocks assemble for each GPU
      CompileRequest req;
      req.name = "probes";
      req.source = probe_source();
      req.options = kernel_compile_options();
      for (const std::string& arch : compile_archs) {
        req.arch = arch;
        const CompileResult c = compile_cubin(req);
        std::printf("probes compile for %s: %zu bytes of cubin\n", arch.c_str(), c.cubin.size());
      }
      return 0;
    }
    if (write && device != "emu") throw UserError("--write-golden", "golden files come from the emulator; use --device emu");
    if (device == "gpu") {
      std::string why;
      if (!CudaDriver::available(&why) || device_count() == 0) {
        std::printf("SKIPPED: probes on a GPU need a CUDA GPU%s%s\n", why.empty() ? "" : ": ", why.c_str());
        return 77;
      }
    }
    std::unique_ptr<Runner> runner;
    if (device == "gpu") {
      runner = std::make_unique<GpuRunner>();
      std::printf("arch: %s\n", static_cast<GpuRunner&>(*runner).arch.c_str());
    } else {
      runner = std::make_unique<EmuRunner>();
    }
    size_t failed = 0, passed = 0;
    std::ofstream rep;
    if (!report.empty()) rep.open(report, std::ios::app);
    for (const Probe& p : probes()) {
      if (p.sm90a && device == "gpu" && static_cast<GpuRunner&>(*runner).arch != "sm_90a") {
        std::printf("%-26s skipped: an sm_90a probe, this GPU is %s\n", p.name, static_cast<GpuRunner&>(*runner).arch.c_str());
        continue;
      }
      const std::vector<uint32_t> in = p.inputs();
      std::vector<uint32_t> got;
      std::string error;
      try {
        got = runner->run(p, in);
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (write && error.empty()) {
        write_golden(golden, p, got);
        std::printf("wrote %s\n", golden_path(golden, p).c_str());
        ++passed;
        continue;
      }
      size_t bad = 0;
      std::ostringstream detail;
      if (error.empty()) {
        const std::vector<uint32_t> want = read_golden(golden, p);
        if (want.size() != got.size()) {
          error = "golden file has " + std::to_string(want.size()) + " words, the probe wrote " + std::to_string(got.size());
        }
        for (size_t i = 0; error.empty() && i < got.size(); ++i)
          if (!agree(got[i], want[i], p.compare) && bad++ < 8) {
            char buf[96];
            std::snprintf(buf, sizeof buf, "\n    word %zu: got %08x, golden %08x", i, got[i], want[i]);
            detail << buf;
          }
      }
      const bool ok = error.empty() && bad == 0;
      ok ? ++passed : ++failed;
      std::printf("%-26s %s%s%s\n", p.name, ok ? "ok" : "MISMATCH", error.empty() ? "" : (": " + error).c_str(),
                  bad ? (" (" + std::to_string(bad) + " words)" + detail.str()).c_str() : "");
      if (rep) rep << p.name << " " << (ok ? "ok" : "mismatch") << " words=" << got.size() << " mismatches=" << bad << "\n";
      // Every word the device wrote, beside the report, for fitting the emulator to it afterwards
      // (the inputs are seeded: the emulator makes them again).
      if (rep && bad) {
        const std::filesystem::path dir = std::filesystem::path(report).parent_path() / "probes_got";
        std::filesystem::create_directories(dir);
        write_golden(dir.string(), p, got);
      }
    }
    std::printf("%zu passed, %zu failed\n", passed, failed);
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnjit_probes: error: %s\n", e.what());
    return 2;
  }
}
