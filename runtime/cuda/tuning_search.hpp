// Tuning on a GPU: the CandidateTimer that runs candidates through the Runtime and times them with
// device events, and tune_on_gpu(), the whole search for one problem (what `attnjit tune` runs).
// Without a GPU both fail with "tuning needs a GPU: <why>".
#pragma once

#include <attnjit/attnjit.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compiler/tune/autotune.hpp"
#include "compiler/tune/tuning_db.hpp"
#include "runtime/cuda/cuda_driver.hpp"

namespace attnjit {

// The GPU a tuning runs on, as the TuneKey and the database metadata name it.
struct TuningGpu {
  int ordinal = 0;
  std::string name;
  int sm_count = 0, arch = 0;
  int driver_version = 0;
};

// GPU `ordinal`; UserError("attnjit tune", "tuning needs a GPU: <why>") when there is no driver,
// no GPU or no such ordinal.
TuningGpu tuning_gpu(int ordinal = 0);

// The key of a problem on a GPU (the bucket of seq_q: the query length sets the number of work
// items, which is what the tile choice trades against).
TuneKey tune_key_for(const TuningGpu& gpu, const Pattern& p, const Problem& pb, const std::vector<int64_t>& buckets = {},
                     bool backward = false);
DbMetadata tuning_metadata(const TuningGpu& gpu);  // running_metadata() plus the GPU fields

struct GpuTimerOptions {
  int device = 0;
  std::string cache_dir;               // kernel cache; empty: the knobs'
  double seconds_per_candidate = 2.0;  // stop sampling after this (at least 5 samples when allowed)
  uint64_t seed = 1;                   // of the random inputs
  size_t l2_flush_bytes = size_t{256} << 20;
  bool backward = false;               // time Attention::backward (RuntimeOptions::backward_config)
};

// Runs each candidate through a Runtime (RuntimeOptions::config, or with `backward` the
// backward_config, timing backward() after one forward) on random device inputs,
// rotating between up to 3 input sets, flushing L2 before every timed launch, one event pair per
// launch on its own stream. A compile or launch failure throws (tune() records it as failed).
class GpuCandidateTimer : public CandidateTimer {
public:
  GpuCandidateTimer(const Pattern& p, const Problem& pb, GpuTimerOptions options = {});
  ~GpuCandidateTimer() override;
  GpuCandidateTimer(const GpuCandidateTimer&) = delete;
  GpuCandidateTimer& operator=(const GpuCandidateTimer&) = delete;

  std::vector<double> time_ms(const KernelConfig& c, int warmup, int iterations) override;

private:
  struct InputSet {
    DeviceBuffer q, k, v;
  };
  Pattern pattern_;
  Problem problem_;
  GpuTimerOptions options_;
  CUstream stream_ = nullptr;
  std::vector<InputSet> inputs_;
  DeviceBuffer o_, lse_, flush_;
  DeviceBuffer descales_;  // FP8 inputs: three factors of 1
  DeviceBuffer dout_, dq_, dk_, dv_;  // with `backward`
};

struct GpuTuneOptions {
  int device = 0;
  std::string cache_dir;          // kernel cache; empty: the knobs'
  std::vector<int64_t> buckets;   // sequence buckets; empty: powers of two
  bool backward = false;          // tune the backward kernels (candidate_backward_configs)
};

struct GpuTuneOutcome {
  TuneKey key;
  TuneResult result;
  DbMetadata metadata;
};

// (phase, done, total); phase is "compiling" or "timing".
using TuneProgress = std::function<void(const std::string& phase, size_t done, size_t total)>;

// The whole search for one problem: candidate_configs (or candidate_backward_configs) for the GPU's arch, pruning by the cost model
// and kernel_compile_check, then tune() with a GpuCandidateTimer. Checks the GPU first: UserError
// "tuning needs a GPU: ..." without one. Patterns with a dynamic layout are a UserError (their
// tables change per call, so there is no fixed problem to time).
GpuTuneOutcome tune_on_gpu(const Pattern& p, const Problem& pb, const TuneBudget& budget,
                           const GpuTuneOptions& options = {}, const TuneProgress& progress = {});

}  // namespace attnjit
