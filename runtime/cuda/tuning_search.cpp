// Timing candidates on a GPU, and the search for one problem. See tuning_search.hpp.
#include "runtime/cuda/tuning_search.hpp"

#include <chrono>
#include <cstring>

#include "compiler/jit/jit.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "runtime/backend.hpp"
#include "runtime/input_checks.hpp"
#include "runtime/cuda/cuda_probe.hpp"
#include "runtime/npy.hpp"

namespace attnjit {

TuningGpu tuning_gpu(int ordinal) {
  const DriverProbe probe = probe_cuda_driver();
  if (!probe.loaded || probe.gpus.empty())
    throw UserError("attnjit tune", "tuning needs a GPU: " + probe.problem);
  if (ordinal < 0 || ordinal >= static_cast<int>(probe.gpus.size())) {
    throw UserError("attnjit tune", "tuning needs a GPU: there is no GPU " + std::to_string(ordinal) + " (found " +
                                        std::to_string(probe.gpus.size()) + ")");
  }
  const GpuInfo& g = probe.gpus[static_cast<size_t>(ordinal)];
  return TuningGpu{ordinal, g.name, g.sm_count, g.cc_major * 10 + g.cc_minor, probe.driver_version};
}

TuneKey tune_key_for(const TuningGpu& gpu, const Pattern& p, const Problem& pb, const std::vector<int64_t>& buckets,
                     bool backward) {
  TuneKey k;
  k.gpu = gpu.name;
  k.sm_count = gpu.sm_count;
  k.arch = gpu.arch;
  k.pattern_signature = pattern_signature(p);
  k.head_dim = static_cast<int>(pb.head_dim);
  k.head_dim_v = static_cast<int>(pb.head_dim_v);
  k.dtype = pb.dtype;
  k.seq_bucket = seq_bucket_of(pb.seq_q, buckets);
  k.backward = backward;
  // The backward kernels are the portable ones on every arch; the forward may be arch-specific.
  k.arch_specific = !backward && cuda_arch_specific(gpu.arch);
  return k;
}

DbMetadata tuning_metadata(const TuningGpu& gpu) {
  DbMetadata m = running_metadata(gpu.arch);
  m.driver_version = gpu.driver_version;
  m.gpu = gpu.name;
  m.sm_count = gpu.sm_count;
  m.arch = gpu.arch;
  return m;
}

namespace {

// Uniform values in [-1, 1) in the given dtype, from a small xorshift generator (the values only
// need to be finite and varied; std::mt19937 would dominate the setup time of large inputs).
DeviceBuffer random_device_buffer(int64_t elements, DType dtype, uint64_t seed) {
  const size_t bytes = static_cast<size_t>(elements) * static_cast<size_t>(dtype_bytes(dtype));
  std::vector<uint8_t> host(bytes);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t n = 0; n < elements; ++n) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float x = static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    if (dtype == DType::F32) {
      std::memcpy(host.data() + 4 * n, &x, 4);
      continue;
    }
    if (dtype == DType::E4M3) {  // FP8 codes (the timed call's descales are 1)
      host[size_t(n)] = float_to_e4m3(x);
      continue;
    }
    uint16_t h;
    if (dtype == DType::F16) {
      h = float_to_half(x);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      h = static_cast<uint16_t>(bits >> 16);  // truncation is fine for random inputs
    }
    std::memcpy(host.data() + 2 * n, &h, 2);
  }
  DeviceBuffer b(std::max<size_t>(bytes, 16), "tuning input");
  copy_to_device(b.get(), host.data(), bytes, "tuning input");
  return b;
}

}  // namespace

GpuCandidateTimer::GpuCandidateTimer(const Pattern& p, const Problem& pb, GpuTimerOptions options)
    : pattern_(p), problem_(pb), options_(std::move(options)) {
  tuning_gpu(options_.device);  // the clear error first
  shared_context(options_.device).make_current();
  const DeviceInfo info = device_info(options_.device);
  const int64_t q_elems = pb.batch * pb.seq_q * pb.heads_q * pb.head_dim;
  const int64_t k_elems = pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim;
  const int64_t v_elems = pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim_v;
  const size_t set_bytes = static_cast<size_t>(q_elems + k_elems + v_elems) * static_cast<size_t>(dtype_bytes(pb.dtype));
  // Rotating inputs keeps one launch's operands from being found in L2 by the next; three sets when
  // they take at most a quarter of the memory, else two.
  const int sets = 3 * set_bytes <= info.total_memory / 4 ? 3 : 2;
  for (int n = 0; n < sets; ++n) {
    const uint64_t seed = options_.seed * 16 + static_cast<uint64_t>(n) * 3;
    inputs_.push_back(InputSet{random_device_buffer(q_elems, pb.dtype, seed), random_device_buffer(k_elems, pb.dtype, seed + 1),
                               random_device_buffer(v_elems, pb.dtype, seed + 2)});
  }
  o_ = DeviceBuffer(static_cast<size_t>(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim_v * dtype_bytes(pb.o_dtype())), "tuning O");
  if (pb.dtype == DType::E4M3) {  // FP8 inputs: descale factors of 1, one per tensor
    const float ones[3] = {1.0f, 1.0f, 1.0f};
    descales_ = DeviceBuffer(sizeof ones, "tuning descales");
    copy_to_device(descales_.get(), ones, sizeof ones, "tuning descales");
  }
  lse_ = DeviceBuffer(static_cast<size_t>(pb.batch * pb.heads_q * pb.seq_q) * sizeof(float), "tuning LSE");
  flush_ = DeviceBuffer(options_.l2_flush_bytes, "L2 flush buffer");
  if (options_.backward) {
    const size_t eb = static_cast<size_t>(dtype_bytes(pb.dtype));
    dout_ = random_device_buffer(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim_v, pb.dtype, options_.seed * 16 + 15);
    dq_ = DeviceBuffer(static_cast<size_t>(q_elems) * eb, "tuning dQ");
    dk_ = DeviceBuffer(static_cast<size_t>(k_elems) * eb, "tuning dK");
    dv_ = DeviceBuffer(static_cast<size_t>(v_elems) * eb, "tuning dV");
  }
  stream_ = create_stream();
}

GpuCandidateTimer::~GpuCandidateTimer() {
  if (stream_) {
    try {
      shared_context(options_.device).make_current();
      destroy_stream(stream_);
    } catch (...) {
      // A destructor must not throw; a broken context (after a failed launch) leaks the stream.
    }
  }
}

std::vector<double> GpuCandidateTimer::time_ms(const KernelConfig& c, int warmup, int iterations) {
  RuntimeOptions ro;
  ro.device = Device::cuda(options_.device);
  ro.cache_dir = options_.cache_dir;
  (options_.backward ? ro.backward_config : ro.config) = c;
  Runtime rt(ro);
  Attention op = rt.prepare(pattern_, problem_);  // compiles or loads the kernel, uploads the tables
  shared_context(options_.device).make_current();

  const Problem& pb = problem_;
  auto view = [&](const DeviceBuffer& b, DType dt, std::vector<int64_t> shape) {
    return TensorView::contiguous(reinterpret_cast<void*>(b.get()), dt, std::move(shape));
  };
  const TensorView o = view(o_, pb.o_dtype(), {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v});
  const TensorView lse = view(lse_, DType::F32, {pb.batch, pb.heads_q, pb.seq_q});
  ForwardOptions fo;
  fo.stream = stream_;
  TensorView descale = view(descales_, DType::F32, {pb.batch, pb.heads_kv});
  descale.strides = {0, 0};
  if (pb.dtype == DType::E4M3) fo.q_descale = fo.k_descale = fo.v_descale = &descale;
  auto forward = [&](size_t n) {
    const InputSet& in = inputs_[n % inputs_.size()];
    op.forward(view(in.q, pb.dtype, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}),
               view(in.k, pb.dtype, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim}),
               view(in.v, pb.dtype, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v}), o, &lse, fo);
  };
  // The backward reads O and LSE of the first input set's forward (any finite values time the same).
  if (options_.backward) forward(0);
  auto run = [&](size_t n) {
    if (!options_.backward) return forward(n);
    const InputSet& in = inputs_[n % inputs_.size()];
    const std::vector<int64_t> qs{pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}, ks{pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim},
        vs{pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v}, os{pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v};
    op.backward(view(in.q, pb.dtype, qs), view(in.k, pb.dtype, ks), view(in.v, pb.dtype, vs), o, lse, view(dout_, pb.dtype, os),
                view(dq_, pb.dtype, qs), view(dk_, pb.dtype, ks), view(dv_, pb.dtype, vs), fo);
  };

  for (int n = 0; n < warmup; ++n) run(static_cast<size_t>(n));
  synchronize(stream_, "tuning warm-up");

  EventTimer timer;
  std::vector<double> samples;
  const int min_samples = std::min(iterations, 5);
  const auto t0 = std::chrono::steady_clock::now();
  for (int n = 0; n < iterations; ++n) {
    // Writing a buffer larger than L2 evicts the previous launch's data. It also keeps the stream
    // busy while the host checks the inputs and launches, so the start event does not fire (and the
    // clock does not run) before the kernel is queued behind it.
    memset_d8_async(flush_.get(), static_cast<unsigned char>(n), flush_.size(), stream_, "L2 flush");
    timer.record_start(stream_);
    run(static_cast<size_t>(n));
    timer.record_stop(stream_);
    samples.push_back(timer.elapsed_ms());
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (static_cast<int>(samples.size()) >= min_samples && spent > options_.seconds_per_candidate) break;
  }
  return samples;
}

GpuTuneOutcome tune_on_gpu(const Pattern& p, const Problem& pb, const TuneBudget& budget, const GpuTuneOptions& options,
                           const TuneProgress& progress) {
  const TuningGpu gpu = tuning_gpu(options.device);
  if (p.has_dynamic_layout()) {
    throw UserError("attnjit tune", "patterns with a dynamic layout cannot be tuned: their tables change per call; "
                                    "tune the same pattern with a static layout instead");
  }
  const Shape shape = problem_shape(pb, 0, 0);
  check_pattern_fits(p, shape);

  GpuTuneOutcome out;
  out.key = tune_key_for(gpu, p, pb, options.buckets, options.backward);
  out.metadata = tuning_metadata(gpu);
  // The candidates of the path the runtime will run.
  const KernelRequest base = problem_request(pb, gpu.arch, out.key.arch_specific);
  // The default first, as the runtime resolves it for this pattern (KernelRequest::block_layouts).
  const std::vector<KernelConfig> candidates =
      options.backward ? candidate_backward_configs(base) : candidate_configs(for_pattern(base, p));

  std::unique_ptr<KernelCache> own;
  if (!options.cache_dir.empty()) own = std::make_unique<KernelCache>(options.cache_dir, knobs().cache_max_bytes, true);
  KernelCompiler compiler(own ? *own : default_kernel_cache(), knobs());
  const std::vector<std::string> skip = prune_candidates(
      candidates,
      [&](const KernelConfig& c) {
        // The forward's plans packed as the runtime packs them (its options are the knobs' here).
        const bool packed = !options.backward && knobs().pack_branches;
        return planned_pairs(p, shape, c, nullptr, packed ? BranchPacking::Packed : BranchPacking::Separate);
      },
      kernel_compile_check(p, base, compiler, budget.compile_timeout_s, options.backward),
      [&](size_t done, size_t total) {
        if (progress) progress("compiling", done, total);
      });

  GpuTimerOptions to;
  to.device = options.device;
  to.cache_dir = options.cache_dir;
  to.seconds_per_candidate = budget.seconds_per_candidate;
  to.backward = options.backward;
  GpuCandidateTimer timer(p, pb, to);
  out.result = tune(candidates, skip, timer, budget, [&](size_t done, size_t total) {
    if (progress) progress("timing", done, total);
  });
  return out;
}

}  // namespace attnjit
