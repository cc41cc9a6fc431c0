// The CUDA driver layer on a real GPU: device info, memory round trips (plain and stream-ordered),
// a CUBIN compiled by NVRTC at test time loaded, launched and checked, event timing, pointer
// checks, the errors a bad launch gives, and that attnjit restores the caller's current context. Without a driver every test says SKIPPED and passes.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/cuda/cuda_probe.hpp"
#include "attnjit/reference.hpp"

using namespace attnjit;

#define SKIP_WITHOUT_GPU()                                 \
  do {                                                     \
    std::string why_;                                      \
    if (!CudaDriver::available(&why_)) {                   \
      WARN("SKIPPED: no CUDA driver/GPU: " + why_);        \
      return;                                              \
    }                                                      \
    if (device_count() == 0) {                             \
      WARN("SKIPPED: no CUDA driver/GPU: the driver reports no GPUs"); \
      return;                                              \
    }                                                      \
  } while (0)

namespace {

const char* kPatternSource = R"(
extern "C" __global__ void fill_pattern(unsigned* out, unsigned n, unsigned seed) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 2654435761u + seed;
}

// Goes through dynamic shared memory, so a launch with more than 48 KiB needs the opt-in.
extern "C" __global__ void through_shared(unsigned* out, unsigned words) {
  extern __shared__ unsigned smem[];
  for (unsigned i = threadIdx.x; i < words; i += blockDim.x) smem[i] = i ^ 0x5a5a5a5au;
  __syncthreads();
  for (unsigned i = threadIdx.x; i < words; i += blockDim.x) out[i] = smem[words - 1 - i];
}
)";

unsigned expected_pattern(unsigned i, unsigned seed) { return i * 2654435761u + seed; }

std::string arch_of(const DeviceInfo& d) { return "sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor); }

Module load_pattern_module(const DeviceInfo& d) {
  const CompileResult c = compile_cubin(CompileRequest{"driver_gpu_test", kPatternSource, arch_of(d), {}, 0});
  return Module(c.cubin, "driver_gpu_test");
}

}  // namespace

TEST_CASE("device info is sane", "[gpu]") {
  SKIP_WITHOUT_GPU();
  CHECK(driver_version() >= 11020);
  const int n = device_count();
  REQUIRE(n >= 1);
  for (int i = 0; i < n; ++i) {
    const DeviceInfo d = device_info(i);
    INFO(d.name << " " << arch_of(d));
    CHECK(d.ordinal == i);
    CHECK_FALSE(d.name.empty());
    CHECK(d.cc_major >= 3);
    CHECK(d.cc_minor >= 0);
    CHECK(d.sm_count > 0);
    CHECK(d.max_threads_per_block >= 512);
    CHECK(d.max_shared_per_block_optin >= 48 * 1024);
    CHECK(d.total_memory > (size_t(1) << 30));
    CHECK(d.uuid_or_empty.rfind("GPU-", 0) == 0);
    CHECK(d.uuid_or_empty.size() == 40);
  }
  CHECK_THROWS_AS(device_info(n), UserError);
  CHECK_THROWS_AS(device_info(-1), UserError);
  const DriverProbe p = probe_cuda_driver();
  CHECK(p.loaded);
  CHECK(static_cast<int>(p.gpus.size()) == n);
  CHECK(p.driver_version == driver_version());
}

TEST_CASE("memory round trips: plain, stream-ordered, memset", "[gpu]") {
  SKIP_WITHOUT_GPU();
  Context& ctx = shared_context(0);
  ctx.make_current();
  std::vector<uint8_t> host(1 << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);

  DeviceBuffer buf(host.size(), "round trip");
  REQUIRE(buf.get() != 0);
  CHECK(buf.size() == host.size());
  copy_to_device(buf.get(), host.data(), host.size());
  std::vector<uint8_t> back(host.size());
  copy_to_host(back.data(), buf.get(), back.size());
  CHECK(back == host);

  DeviceBuffer moved = std::move(buf);
  CHECK(buf.get() == 0);
  CHECK(moved.size() == host.size());

  CUstream s = create_stream();
  keep_pool_memory(0);
  CUdeviceptr p = alloc_async(host.size(), s, "workspace");
  REQUIRE(p != 0);
  copy_to_device_async(p, host.data(), host.size(), s);
  memset_d8_async(p + 100, 0xab, 50, s);
  std::vector<uint8_t> back2(host.size());
  copy_to_host_async(back2.data(), p, back2.size(), s);
  free_async(p, s);
  synchronize(s);
  std::vector<uint8_t> want = host;
  std::memset(want.data() + 100, 0xab, 50);
  CHECK(back2 == want);
  destroy_stream(s);
}

TEST_CASE("a CUBIN compiled by NVRTC loads, launches and writes its pattern", "[gpu]") {
  SKIP_WITHOUT_GPU();
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found (`attnjit info` says where it looked)");
    return;
  }
  const DeviceInfo d = device_info(0);
  Context ctx(0);
  ctx.make_current();
  Module m = load_pattern_module(d);
  CUfunction f = m.function("fill_pattern");
  REQUIRE(f != nullptr);

  const unsigned n = 100003, seed = 12345, block = 256;
  DeviceBuffer out(n * sizeof(unsigned));
  CUstream s = create_stream();
  memset_d8_async(out.get(), 0, out.size(), s);
  CUdeviceptr out_ptr = out.get();
  unsigned n_arg = n, seed_arg = seed;
  void* params[] = {&out_ptr, &n_arg, &seed_arg};
  EventTimer timer;
  timer.record_start(s);
  launch(f, (n + block - 1) / block, 1, 1, block, 0, s, params, "fill_pattern");
  timer.record_stop(s);
  std::vector<unsigned> host(n);
  copy_to_host_async(host.data(), out.get(), out.size(), s);
  synchronize(s, "fill_pattern");
  const float ms = timer.elapsed_ms();
  CHECK(ms > 0.0f);
  size_t wrong = 0;
  for (unsigned i = 0; i < n; ++i) wrong += host[i] != expected_pattern(i, seed);
  CHECK(wrong == 0);

  // More than 48 KiB of dynamic shared memory, after the opt-in.
  const int smem = std::min(d.max_shared_per_block_optin, 96 * 1024);
  const unsigned words = static_cast<unsigned>(smem) / 4;
  CUfunction g = m.function("through_shared");
  m.set_max_dynamic_shared(g, smem);
  DeviceBuffer out2(words * sizeof(unsigned));
  CUdeviceptr out2_ptr = out2.get();
  unsigned words_arg = words;
  void* params2[] = {&out2_ptr, &words_arg};
  launch(g, 1, 1, 1, 256, static_cast<unsigned>(smem), s, params2, "through_shared");
  synchronize(s, "through_shared");
  std::vector<unsigned> host2(words);
  copy_to_host(host2.data(), out2.get(), out2.size());
  size_t wrong2 = 0;
  for (unsigned i = 0; i < words; ++i) wrong2 += host2[i] != ((words - 1 - i) ^ 0x5a5a5a5au);
  CHECK(wrong2 == 0);

  // Errors name the call, the driver's error and what we were doing.
  try {
    m.function("no_such_kernel");
    FAIL("no error");
  } catch (const CudaError& e) {
    CHECK(e.call() == "cuModuleGetFunction");
    CHECK(e.result() == cu::CUDA_ERROR_NOT_FOUND);
    CHECK_THAT(std::string(e.what()), Catch::Contains("CUDA_ERROR_NOT_FOUND") && Catch::Contains("no_such_kernel"));
  }
  try {
    // Far more dynamic shared memory than any GPU has: the driver refuses the launch.
    launch(f, 1, 1, 1, block, 16u << 20, s, params, "fill_pattern_too_much_smem");
    synchronize(s);
    FAIL("no error");
  } catch (const CudaError& e) {
    CHECK(e.call() == "cuLaunchKernel");
    CHECK_THAT(std::string(e.what()), Catch::Contains("fill_pattern_too_much_smem") &&
                                          Catch::Contains("grid (1, 1, 1)") && Catch::Contains("CUDA_ERROR_"));
  }
  CHECK_THROWS_AS(launch(f, 1, 70000, 1, block, 0, s, params, "fill_pattern"), UserError);
  destroy_stream(s);
  // Not a CUBIN; NUL-terminated, since the driver reads an image without an ELF header as PTX text.
  std::vector<uint8_t> garbage(64, 'x');
  garbage.back() = 0;
  CHECK_THROWS_AS(Module(garbage, "garbage"), CudaError);
}

TEST_CASE("pointer_info tells device memory from host memory", "[gpu]") {
  SKIP_WITHOUT_GPU();
  shared_context(0).make_current();
  DeviceBuffer buf(4096);
  const PointerInfo dev = pointer_info(reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.get())));
  CHECK(dev.is_device_memory);
  CHECK(dev.device_ordinal == 0);
  const PointerInfo inner = pointer_info(reinterpret_cast<const void*>(static_cast<uintptr_t>(buf.get() + 100)));
  CHECK(inner.is_device_memory);

  CUstream s = create_stream();
  CUdeviceptr p = alloc_async(1 << 16, s);
  synchronize(s);
  CHECK(pointer_info(reinterpret_cast<const void*>(static_cast<uintptr_t>(p))).is_device_memory);
  free_async(p, s);
  synchronize(s);
  destroy_stream(s);

  std::vector<float> host(1024);
  int on_stack = 0;
  const PointerInfo h = pointer_info(host.data());
  CHECK_FALSE(h.is_device_memory);
  CHECK(h.device_ordinal == -1);
  CHECK_FALSE(pointer_info(&on_stack).is_device_memory);
  CHECK_FALSE(pointer_info(nullptr).is_device_memory);
}

TEST_CASE("a call into attnjit leaves the caller's current context as it found it", "[gpu]") {
  SKIP_WITHOUT_GPU();
  const DriverApi& api = CudaDriver::get().api();
  auto current = [&] {
    CUcontext c = reinterpret_cast<CUcontext>(uintptr_t{1});
    REQUIRE(api.cuCtxGetCurrent(&c) == cu::CUDA_SUCCESS);
    return c;
  };
  Context& primary = shared_context(0);
  REQUIRE(api.cuCtxSetCurrent(nullptr) == cu::CUDA_SUCCESS);
  {
    const ScopedCurrentContext scope(primary);
    CHECK(current() == primary.handle());
  }
  CHECK(current() == nullptr);

  // Prepare (compile, load, upload the tables) and run with no context current on the thread.
  const Problem pb{1, 64, 64, 2, 2, 64, 64, DType::F16, {}};
  const size_t bytes = 64 * 2 * 64 * 2;
  std::vector<DeviceBuffer> buffers;
  {
    const ScopedCurrentContext scope(primary);
    for (int n = 0; n < 4; ++n) buffers.emplace_back(bytes, "context test");
    buffers.emplace_back(2 * 64 * sizeof(float), "context test lse");
    for (DeviceBuffer& b : buffers) memset_d8_async(b.get(), 0, b.size(), nullptr, "context test");
    synchronize(nullptr, "context test");
  }
  REQUIRE(current() == nullptr);
  RuntimeOptions ro;
  ro.device = Device::cuda(0);
  Runtime rt(ro);
  Attention op = rt.prepare(parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "causal": true}]})"), pb);
  CHECK(current() == nullptr);
  auto view = [&](int n) { return TensorView::contiguous(reinterpret_cast<void*>(buffers[n].get()), DType::F16, {1, 64, 2, 64}); };
  const TensorView lse = TensorView::contiguous(reinterpret_cast<void*>(buffers[4].get()), DType::F32, {1, 2, 64});
  op.forward(view(0), view(1), view(2), view(3), &lse);
  CHECK(current() == nullptr);
  const ScopedCurrentContext scope(primary);
  synchronize(nullptr, "context test");
}

TEST_CASE("plans dropped from the plan cache while their kernels may still run: every output is right", "[gpu][plans]") {
  SKIP_WITHOUT_GPU();
  // A budget of 0 keeps only the plan in use, so each new q_offset drops the previous plan (and
  // frees its device tables) while the kernel that reads them may still be queued on the stream.
  const Pattern p = parse_spec(R"({"attnjit": 1, "branches": [{"segment": 64}, {"segment": 256, "dilation": 4}]})");
  const Problem pb{1, 64, 256, 2, 2, 64, 64, DType::F32, {}};
  RuntimeOptions ro;
  ro.device = Device::cuda(0);
  ro.plan_cache_bytes = 0;
  Runtime rt(ro);
  Attention op = rt.prepare(p, pb);
  std::vector<float> q(64 * 2 * 64), kv(256 * 2 * 64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>((i * 40503u + 7) % 1000) / 500.0f - 1.0f;
  const std::vector<int64_t> offsets{0, 64, 128, 192, 0, 64};
  Context& primary = shared_context(0);
  const ScopedCurrentContext scope(primary);
  DeviceBuffer dq(q.size() * 4, "plans test"), dkv(kv.size() * 4, "plans test");
  copy_to_device(dq.get(), q.data(), q.size() * 4);
  copy_to_device(dkv.get(), kv.data(), kv.size() * 4);
  std::vector<DeviceBuffer> outs;
  for (size_t n = 0; n < offsets.size(); ++n) outs.emplace_back(q.size() * 4, "plans test");
  CUstream stream = create_stream();
  const TensorView qv = TensorView::contiguous(reinterpret_cast<void*>(dq.get()), DType::F32, {1, 64, 2, 64});
  const TensorView kvv = TensorView::contiguous(reinterpret_cast<void*>(dkv.get()), DType::F32, {1, 256, 2, 64});
  for (size_t n = 0; n < offsets.size(); ++n) {
    ForwardOptions fo;
    fo.q_offset = offsets[n];
    fo.stream = stream;
    op.forward(qv, kvv, kvv, TensorView::contiguous(reinterpret_cast<void*>(outs[n].get()), DType::F32, {1, 64, 2, 64}),
               nullptr, fo);
  }
  synchronize(stream, "plans test");
  destroy_stream(stream);
  CHECK(op.plan_cache_stats().plans == 1);
  CHECK(op.plan_cache_stats().evictions >= 5);
  for (size_t n = 0; n < offsets.size(); ++n) {
    std::vector<float> o(q.size());
    copy_to_host(o.data(), outs[n].get(), o.size() * 4);
    Shape s;
    s.seq_q = 64, s.seq_k = 256, s.heads_q = s.heads_kv = 2, s.head_dim = s.head_dim_v = 64, s.q_offset = offsets[n];
    const ReferenceOutput want = reference_attention(p, s, q.data(), kv.data(), kv.data());
    INFO("call " << n << ", q_offset " << offsets[n]);
    for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == Approx(want.o[i]).margin(1e-4));
  }
}
