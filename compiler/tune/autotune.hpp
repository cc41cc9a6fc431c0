// The autotuner (docs/architecture.md, "Tune"): the candidate configs of a kernel
// request, pruning before timing, and the search itself. Timing goes through CandidateTimer, so the
// search runs (and is tested) without a GPU; runtime/cuda/tuning_search.hpp has the real one.
//
// The search survives bad candidates: a config that fails to compile or to launch
// scores +inf with its reason and the search goes on. Winners are picked deterministically (ties go
// to the earlier candidate), so two processes tuning the same problem agree.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"
#include "compiler/plan/plan.hpp"

namespace attnjit {

class KernelCompiler;

// What a tuning result is valid for: the GPU (name, SM count, arch), the pattern, the kernel's
// compile-time constants and a bucket of sequence lengths.
struct TuneKey {
  std::string gpu;
  int sm_count = 0;
  int arch = 0;                   // 10 * major + minor
  std::string pattern_signature;  // pattern_signature(pattern)
  int head_dim = 0, head_dim_v = 0;
  DType dtype = DType::BF16;
  int64_t seq_bucket = 0;  // seq_bucket_of(seq_q)
  bool backward = false;   // the backward kernels' tiles (they are tuned apart from the forward's)
  // The arch-specific kernels (sm_90a: the Hopper forward): other kernels with other tiles, so they
  // are tuned and looked up apart from the same arch's portable ones.
  bool arch_specific = false;
  bool operator==(const TuneKey&) const = default;
  // "NVIDIA H100 (132 SMs, sm_90a) pattern 0123456789abcdef d=128/128 bf16 seq<=16384" (+ " backward")
  std::string describe() const;
};

// The bucket a sequence length falls in: the next power of two >= seq by default; with an explicit
// list (sorted ascending, positive), the first bucket >= seq, or the last one for longer sequences.
// UserError for seq < 1 or a list that is not sorted and positive.
int64_t seq_bucket_of(int64_t seq, const std::vector<int64_t>& buckets = {});

// pattern_hash: canonical masks, segments, dilations and offsets all change the best tiles.
std::string pattern_signature(const Pattern& p);

// The configs worth timing for a request (its config is ignored), resolved (no zeros) and in a
// fixed order with resolve_config's default FIRST (for a pattern's default, pass
// for_pattern(request, pattern)). Tensor-core path: tile_q {64, 128} x tile_k
// {32, 64, 128} x stages {2, 3} (128 rows also with 4 warps), and 128 x {32, 64, 128} with 4
// warps and one stage (FlashAttention-2's single K and V buffers); Hopper path: tile_q {64, 128, 192
// up to head dim 64} x tile_k {64, 128} x stages {2, 3}; SIMT path: tile_q {16, 32, 64} x tile_k {16, 32}. Configs that
// resolve_config rejects (over the arch's shared memory) are left out.
std::vector<KernelConfig> candidate_configs(const KernelRequest& base);
// The same for the backward kernels (resolve_backward_config's default first): tensor-core path
// tile_q x tile_k in {32, 64, 128}^2, 2 stages; SIMT path as the forward's.
std::vector<KernelConfig> candidate_backward_configs(const KernelRequest& base);

std::string describe(const KernelConfig& c);  // "64x64 s2"

// ---- pruning before timing ----------------------------------------------------------------

// A reason not to time a config (a spill, too many registers), or nullopt to keep it. May throw:
// the candidate then fails ("failed: <what>") and the others go on. `baseline`: the config is the
// default (candidates[0]), which the runtime runs wherever the database has no entry, so it is
// timed whenever it can run at all (a spill is then no reason: the timing sees what it costs).
using CompileCheck = std::function<std::optional<std::string>(const KernelConfig&, bool baseline)>;
// The pairs a config computes for the problem being tuned (see planned_pairs).
using CostModel = std::function<int64_t(const KernelConfig&)>;

// Candidates whose plans compute more than this many times the pairs of the leanest candidate are
// not timed: see prune_candidates.
constexpr double kMaxPairsRatio = 1.5;

// computed_pairs of the plan with the config's tiles (batch 1): the work the MMA units do. The
// forward's plans are packed as the runtime packs them (`packing`); the backward's never are.
int64_t planned_pairs(const Pattern& p, const Shape& s, const KernelConfig& c, const DynamicLayout* dynamic = nullptr,
                      BranchPacking packing = BranchPacking::Separate);

// Why each candidate is skipped ("pruned: ..." or "failed: ..."), index-aligned with `candidates`;
// an empty string keeps it. The cost model runs first (planning takes milliseconds, compiling
// seconds), then the compile check on the survivors. Either function may be empty. The first
// candidate (the default) is never pruned by the cost model, nor for spilling: it is the baseline
// of default_ms.
std::vector<std::string> prune_candidates(const std::vector<KernelConfig>& candidates, const CostModel& cost,
                                          const CompileCheck& compile_check,
                                          const std::function<void(size_t, size_t)>& progress = {});

// The real compile check: generates and compiles the kernel through `compiler` (so the timer finds
// it in the cache) and prunes one that spills (ptxas' count when compiled now, else a non-zero stack
// frame; not the baseline: on the H100 the spilling default of BigBird's Hopper kernel, 48 bytes,
// ran 1.18x faster than the best candidate that did not spill; nor a forward kernel whose main loop
// has no local loads or stores in its SASS, find_main_loop: its spills are reloaded a few times a
// block, not every tile; without nvdisasm or cuobjdump a spill prunes), needs more than 65536 registers
// per block, or compiled for longer than timeout_s (NVRTC cannot be interrupted, so that is judged
// afterwards). Compile errors throw (the candidate fails).
// `p` and `compiler` are held by reference: keep them alive while the check is used.
// With `backward`, the backward kernels' four entry points are checked instead.
CompileCheck kernel_compile_check(const Pattern& p, const KernelRequest& base, KernelCompiler& compiler,
                                  double timeout_s, bool backward = false);

// ---- the search ---------------------------------------------------------------------------

// Times one candidate: `warmup` untimed runs, then up to `iterations` samples in milliseconds.
// Throws on a compile or launch failure.
class CandidateTimer {
public:
  virtual ~CandidateTimer();
  virtual std::vector<double> time_ms(const KernelConfig& c, int warmup, int iterations) = 0;
};

struct TuneBudget {
  int warmup = 3;
  int max_iterations = 50;
  double seconds_per_candidate = 2.0;  // the timer stops sampling a candidate after this
  double compile_timeout_s = 30;       // see kernel_compile_check
  double tie_tolerance = 0.02;         // relative: medians this close are a tie
};

constexpr double kInfMs = std::numeric_limits<double>::infinity();

struct CandidateResult {
  KernelConfig config;
  std::string status;  // "ok", "pruned: ...", "failed: ..."
  double median_ms = kInfMs, p20_ms = kInfMs, p80_ms = kInfMs;  // +inf when not ok
};

struct TuneResult {
  std::vector<CandidateResult> candidates;  // every candidate, in the order given
  KernelConfig best;                        // the first candidate when none ran
  double best_ms = kInfMs;
  double default_ms = kInfMs;  // the first candidate's median
  double wall_s = 0;
  bool found() const { return best_ms < kInfMs; }
};

// Times every candidate (candidates[0] is the default). A candidate that throws scores +inf with
// "failed: <what>"; tuning goes on. The winner has the smallest median, except that the EARLIEST
// candidate within tie_tolerance of that median wins, so repeated runs pick the same config.
// progress(done, total) is called before each candidate and once at the end.
TuneResult tune(const std::vector<KernelConfig>& candidates, CandidateTimer& timer, const TuneBudget& budget,
                std::function<void(size_t, size_t)> progress = {});
// The same, with candidates already judged by prune_candidates (`skip`, index-aligned): those are
// listed with their reason and not timed.
TuneResult tune(const std::vector<KernelConfig>& candidates, const std::vector<std::string>& skip,
                CandidateTimer& timer, const TuneBudget& budget, std::function<void(size_t, size_t)> progress = {});

// The results as a table: candidate, median, p20, p80, status; the winner marked.
std::string format_tune_table(const TuneResult& r);

}  // namespace attnjit
