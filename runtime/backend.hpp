// What a device does with a prepared attention. The CPU runs the plan executor; a CUDA device
// uploads the plan tables and launches the generated kernel; the emulator runs that kernel on the CPU.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "compiler/plan/paged_plan.hpp"
#include "runtime/kernel_params.hpp"

namespace attnjit {

// A plan for one (offsets, dynamic table) of a prepared attention, plus what the backend keeps
// with it (device tables).
// The plans of the backward pass: the forward plan made with the backward kernels' tiles (dQ walks
// it) and its key-major transpose (dK and dV walk that).
struct BackwardPlans {
  Plan query_major;
  BackwardPlan key_major;
};

struct PlanEntry {
  Plan plan;
  RandomLayouts random = RandomLayouts::InPlan;  // how `plan` was lowered (the backward plans alike)
  std::shared_ptr<void> device_state;  // backend-specific, e.g. uploaded tables
  // A CUDA graph captured a call that runs this plan: the graph reads its device tables, so the
  // plan is never dropped (the byte budget) while the prepared attention lives.
  mutable std::atomic<bool> in_graph{false};
  // Made on the first backward call, for `tiles` (the same on every call of a backend).
  const BackwardPlans& backward_plans(const Pattern& p, const DynamicLayout* dynamic, const TileConfig& tiles) const;
  // What a backend keeps with the backward plans (uploaded tables), made once by `make`.
  const void* backward_device_state(const std::function<std::shared_ptr<void>()>& make) const {
    std::call_once(backward_state_once_, [&] { backward_state_ = make(); });
    return backward_state_.get();
  }

private:
  mutable std::once_flag backward_state_once_;
  mutable std::shared_ptr<void> backward_state_;
  mutable std::once_flag backward_once_;
  mutable std::unique_ptr<BackwardPlans> backward_;
};

// Attention::backward_add's D and fp32 accumulators (contiguous, checked): with them a backend's
// backward() reads neither o nor dq, dk, dv (the call passes dout and the accumulators there), runs
// no pass over every row, and adds the gradients of the rows with work into the accumulators.
struct GradientSink {
  const TensorView* delta = nullptr;  // D [batch, heads_q, seq_q]
  const TensorView* dq = nullptr;
  const TensorView* dk = nullptr;
  const TensorView* dv = nullptr;
};

class Backend {
public:
  virtual ~Backend() = default;
  // Called once per plan entry, when it is made (before its first forward), under the prepared
  // attention's lock; no work on the caller's stream (a CUDA device only packs its tables here).
  virtual void upload(PlanEntry& entry, const DynamicLayout* dynamic) = 0;
  // Whether the call's stream is capturing a CUDA graph: plans dropped then are freed later, since
  // freeing waits for the device (the CUDA device; others never capture).
  virtual bool capturing(const ForwardOptions&) const { return false; }
  virtual void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& o, const TensorView* lse, const ForwardOptions& options) = 0;
  // The backward pass: dq, dk, dv from the forward's inputs and outputs and dout; or, with `sink`,
  // the gradients added into its accumulators.
  virtual void backward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const ForwardOptions& options,
                        const GradientSink* sink) = 0;
  // The attention weights of forward() (Attention::weights) into `w`, float32 contiguous
  // [B, Hq, Sq, Sk], from q, k and the forward's lse over the entry's plan. This default computes
  // on the host with the plan executor, reading the views as host memory (the CPU and emu devices);
  // the CUDA device copies them over first.
  virtual void weights(const PlanEntry& entry, const Pattern& pattern, const TensorView& q, const TensorView& k,
                       const TensorView& lse, const TensorView& w, const ForwardOptions& options);
  virtual std::string kernel_name() const = 0;
  virtual TileConfig tiles() const = 0;   // the plan's tiles must be the kernel's
  virtual int alignment() const = 0;      // bytes the kernel's loads need
  virtual size_t backward_workspace_bytes() const { return 0; }  // scratch of one backward (ForwardOptions::workspace)
  // Whether the kernels read a DeviceDynamicLayout in place (they seek through it: Plan::kernel_seeks;
  // else the runtime hands the backend a host table made from it), and whether its arrays are host
  // memory (the CPU and emu devices).
  virtual bool reads_device_tables() const { return false; }
  // Its forward reads a packed plan's key weights (BranchPacking::Packed); else plans are Separate.
  virtual bool reads_key_weights() const { return false; }
  virtual bool tables_in_host_memory() const { return true; }
};

// The table a call's plans are lowered from: the host table, or for a table on the device the
// every-block stand-in (the plan visits every tile the pattern could keep; the kernels ask the table).
inline const DynamicLayout* planning_table(const ForwardOptions& o) {
  return o.device_dynamic_layout ? &DynamicLayout::every_block() : o.dynamic_layout;
}

struct PreparedState {
  Pattern pattern;
  Problem problem;
  std::unique_ptr<Backend> backend;
  std::mutex mutex;
  // The mask's translation period (translation_period): offsets it cannot tell apart share a plan.
  std::optional<int64_t> period;
  // The plans by (offsets, table hash), most recently used first, and their bytes (plan_bytes).
  // With a period and no documents the offsets are (q_offset mod period, q_offset - k_offset),
  // else as given (runtime.cpp, plan_for).
  using PlanKey = std::tuple<int64_t, int64_t, std::string>;
  std::list<std::pair<PlanKey, std::shared_ptr<PlanEntry>>> plans;
  std::map<PlanKey, decltype(plans)::iterator> plan_index;
  int64_t plan_budget = 0;
  PlanCacheStats plan_stats;
  // Plans dropped by a call being captured in a CUDA graph: freed by the next call that is not.
  std::vector<std::shared_ptr<PlanEntry>> retired;
  // Random layouts in the kernels (Plan::kernel_seeks) where the backend's kernels seek and a plan
  // would hash more than RuntimeOptions::random_in_kernel_above blocks.
  RandomLayouts random = RandomLayouts::InPlan;
  // Packed where the options allow and the backend's forward reads key weights.
  BranchPacking packing = BranchPacking::Separate;
};

// The host bytes of a plan's tables (what PlanCacheStats counts).
int64_t plan_bytes(const Plan& plan);

// The plan of a call (its offsets, table and documents): made and handed to the backend's upload
// on first use, then reused. Over the state's byte budget the least recently used plans are
// dropped, never the call's own nor one a CUDA graph reads (PlanEntry::in_graph); plans dropped by
// a call whose stream is capturing (Backend::capturing) wait in `retired` for a call that is not.
std::shared_ptr<PlanEntry> plan_for(PreparedState& st, const ForwardOptions& o);

std::unique_ptr<Backend> make_cpu_backend(const Pattern& p, const Problem& pb);
// What the runtime chose for a prepared attention's kernels besides their tiles (the runtime folds
// in the knobs that have an option).
struct KernelChoices {
  // On the Hopper path: the TMA kernels where tensor maps describe a call's rows (ATTNJIT_TMA=0,
  // folded in by the backends, turns them off).
  bool tma = true;
  // How the runtime lowers the pattern's random layouts (InKernel: the kernels carry the seek).
  RandomLayouts random = RandomLayouts::InPlan;
  // The Hopper backward's dK/dV kernel on the warpgroup MMA.
  bool wgmma_backward = false;
  // The tensor-core forwards rescale O only once a row's maximum has grown past a threshold.
  bool lazy_rescale = false;
  // Part of the tensor-core forwards' exponentials on the FMA pipe.
  bool poly_exp2 = false;
  // The forward's plans packed (BranchPacking::Packed) and its kernels reading their key weights.
  bool pack_branches = true;
  // The Hopper TMA forward's persistent blocks (RuntimeOptions::persistent_blocks: -1 one per SM,
  // 0 off, else at most that many).
  int persistent_blocks = 0;
};
// The multiprocessors the emu device stands for in a persistent launch of one block per SM.
constexpr int kEmuPersistentSms = 4;
// The forward's and the backward's requests: `r` (the problem's) with `config` and the choices.
KernelRequest forward_request(KernelRequest r, const KernelConfig& config, const KernelChoices& c);
KernelRequest backward_request(KernelRequest r, const KernelConfig& config, const KernelChoices& c);

// The emulator: `arch` is the GPU it stands in for (sm_90a: its arch-specific kernels). `config` (forward) and `backward_config`:
// zeros mean the path's default tiles; others are validated here (a UserError naming the fix).
std::unique_ptr<Backend> make_emu_backend(const Pattern& p, const Problem& pb, ArchName arch, const std::string& cache_dir,
                                          const KernelConfig& config, const KernelConfig& backward_config,
                                          const TemplateSet& templates, const KernelChoices& choices = {});
// Whether the CUDA backend runs a GPU's arch-specific kernels: the Hopper forward (sm_90a) on
// compute capability 9.0 unless ATTNJIT_SM90A=0. The tuning key follows it (TuneKey::arch_specific).
bool cuda_arch_specific(int arch);
std::unique_ptr<Backend> make_cuda_backend(const Pattern& p, const Problem& pb, int device, const std::string& cache_dir,
                                           const KernelConfig& config, const KernelConfig& backward_config,
                                           const TemplateSet& templates, const KernelChoices& choices = {});

// The paged forward on a device (runtime/paged.cpp checks the call and plans it).
class PagedBackend {
public:
  virtual ~PagedBackend() = default;
  virtual void forward(const PagedPlan& plan, const PagedCall& call, int32_t splits) = 0;
  virtual TileConfig tiles() const = 0;
  virtual int64_t target_blocks() const = 0;  // blocks that fill the device: split-KV aims for them
  virtual std::string kernel_name() const = 0;
  // Whether the block table is host memory (the CPU and emu devices check its entries).
  virtual bool host_memory() const { return true; }
  // CUDA graphs (PagedAttention::plan/run), where the device has them (not the CPU, whose run() is
  // forward()): a step's header and tables written into the workspace in the call's stream order,
  // and the kernels launched over it with a grid of the capacity.
  virtual bool graphs() const { return true; }
  // With `planning` (a call with device lengths) the _plan kernel writes the tables first.
  virtual void write_workspace(void* workspace, const std::vector<uint8_t>& bytes, const PagedCall& call) = 0;
  virtual void run_workspace(const PagedCall& call, void* workspace, const PagedWorkspace& w, const PagedCapacity& cap,
                             double softmax_scale, double output_scale, const DevicePlanning* planning = nullptr) = 0;
  // A call with device lengths run eagerly: a workspace of `cap` of its own, planned on the device.
  virtual void forward_planned(const PagedCall& call, const PagedCapacity& cap, double softmax_scale, double output_scale,
                               const DevicePlanning& planning) = 0;
};
std::unique_ptr<PagedBackend> make_cpu_paged(const Pattern& p, const PagedProblem& pb);
std::unique_ptr<PagedBackend> make_emu_paged(const Pattern& p, const PagedProblem& pb, ArchName arch, const std::string& cache_dir,
                                             const KernelConfig& config, const TemplateSet& templates);
std::unique_ptr<PagedBackend> make_cuda_paged(const Pattern& p, const PagedProblem& pb, int device, const std::string& cache_dir,
                                              const KernelConfig& config, const TemplateSet& templates);
// A prepared paged attention's state (runtime/paged.cpp): validated, its device's backend made.
std::shared_ptr<PagedState> make_paged_state(const Pattern& p, const PagedProblem& pb, const RuntimeOptions& o);
// The paged kernels' request: the problem's head dims and dtype on `arch`, with `config`.
KernelRequest paged_request(const PagedProblem& pb, int arch, const KernelConfig& config);

// A plan that leaves layouts to the kernels needs kernels that seek (an internal error otherwise:
// the kernels would take every tile of the band).
void check_kernel_seeks(const Plan& plan, const KernelSource& k);
// A packed plan (Plan::packed) meets only a forward kernel that weighs its keys (KernelSource::key_weights).
void check_kernel_weights(const Plan& plan, const KernelSource& k);

}  // namespace attnjit
