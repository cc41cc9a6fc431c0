// Runtime and Attention: prepare (validate, choose a backend, plan), then forward (check inputs,
// find or make the plan for these offsets, run).
#include <iterator>
#include <optional>
#include <sstream>

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/sha256.hpp"
#include "compiler/pattern/mask.hpp"
#include "compiler/tune/autotune.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/tune/tuning_db.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/cuda/tuning_search.hpp"
#include "runtime/input_checks.hpp"

namespace attnjit {

std::string Device::describe() const {
  switch (kind) {
    case DeviceKind::CPU: return "cpu";
    case DeviceKind::CUDA: return "cuda:" + std::to_string(index);
    case DeviceKind::EMU: return "emu:sm_" + std::to_string(index) + (arch_specific ? "a" : "");
  }
  return "?";
}

TensorView TensorView::contiguous(void* data, DType dtype, std::vector<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.strides.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) t.strides[d - 1] = t.strides[d] * shape[d];
  t.shape = std::move(shape);
  return t;
}

struct Runtime::Impl {
  RuntimeOptions options;
  std::mutex mutex;
  std::map<std::string, Attention> prepared;  // attention(): by pattern hash and problem
};

namespace {

std::string table_hash(const DynamicLayout* d) {
  if (!d) return "";
  Sha256 h;
  h.update(&d->heads, sizeof d->heads);
  h.update(d->row_offsets.data(), d->row_offsets.size() * sizeof(int64_t));
  h.update(d->col_indices.data(), d->col_indices.size() * sizeof(int32_t));
  return h.hex_digest();
}

}  // namespace

void check_kernel_seeks(const Plan& plan, const KernelSource& k) {
  ATTNJIT_CHECK(plan.kernel_seeks == 0 || k.seeks,
                "a plan that leaves layouts to the kernels met kernel " + k.name + ", which does not seek");
}

void check_kernel_weights(const Plan& plan, const KernelSource& k) {
  ATTNJIT_CHECK(!plan.packed() || k.key_weights, "a packed plan met kernel " + k.name + ", which does not weigh its keys");
}

int64_t plan_bytes(const Plan& plan) {
  return plan.stats.table_bytes + static_cast<int64_t>((plan.doc_base.size() + plan.documents.size()) * sizeof(int64_t));
}

// The plan for these offsets and this table: made and uploaded on first use, then reused while
// the prepared attention's plans stay within their byte budget (least recently used dropped).
std::shared_ptr<PlanEntry> plan_for(PreparedState& st, const ForwardOptions& o) {
  if (o.q_offset < 0 || o.k_offset < 0) throw UserError("ForwardOptions", "offsets must be >= 0");
  if (st.pattern.has_dynamic_layout() && !o.dynamic_layout && !o.device_dynamic_layout) {
    throw UserError("ForwardOptions.dynamic_layout", "the pattern has a dynamic layout; pass its CSR table "
                                                     "(dynamic_layout on the host, or device_dynamic_layout)");
  }
  // Every table on the device shares one plan: nothing is read from it here.
  std::string tables = o.device_dynamic_layout ? "device" : table_hash(o.dynamic_layout);
  if (o.cu_seqlens) {
    Sha256 h;
    h.update(o.cu_seqlens->data(), o.cu_seqlens->size() * sizeof(int64_t));
    tables += "/documents:" + h.hex_digest();
  }
  // Offsets the mask cannot tell apart share a plan (tables in local rows; the kernels and the plan
  // executor take the call's offsets), so a ring's steps or a stream of chunks with the same
  // distance between queries and keys plan once. Documents take no offsets: their plans are keyed
  // exactly, so that offsets with documents reach the lowering's error.
  const bool shared = st.period && !o.cu_seqlens;
  const PreparedState::PlanKey key = shared ? PreparedState::PlanKey{o.q_offset % *st.period, o.q_offset - o.k_offset, tables}
                                            : PreparedState::PlanKey{o.q_offset, o.k_offset, tables};
  std::lock_guard<std::mutex> lock(st.mutex);
  // Plans dropped by a call being captured in a CUDA graph are freed by the next call that is not
  // (freeing waits for the device, which a capture must not).
  if (!st.retired.empty() && !st.backend->capturing(o)) st.retired.clear();
  if (auto it = st.plan_index.find(key); it != st.plan_index.end()) {
    const Shape& planned = it->second->second->plan.shape;
    if (planned.q_offset != o.q_offset || planned.k_offset != o.k_offset) {
      // A plan lowered for other offsets: this call's are checked as its own lowering would.
      check_pattern_fits(st.pattern, problem_shape(st.problem, o.q_offset, o.k_offset));
    }
    st.plans.splice(st.plans.begin(), st.plans, it->second);  // now the most recently used
    ++st.plan_stats.hits;
    return it->second->second;
  }
  auto entry = std::make_shared<PlanEntry>();
  entry->random = st.random;
  entry->plan = lower_to_plan(st.pattern, problem_shape(st.problem, o.q_offset, o.k_offset), st.backend->tiles(),
                              planning_table(o), o.cu_seqlens, st.random, st.packing);
  st.backend->upload(*entry, o.dynamic_layout);
  st.plans.emplace_front(key, entry);
  st.plan_index.emplace(key, st.plans.begin());
  ++st.plan_stats.misses;
  st.plan_stats.bytes += plan_bytes(entry->plan);
  // Over the budget: drop the least recently used, never the plan this call is about to run nor
  // one a CUDA graph reads (PlanEntry::in_graph). A call still running a dropped plan holds it (and
  // its device tables) until it returns; a call being captured leaves them in `retired`.
  std::optional<bool> capturing;
  auto victim = st.plans.end();
  while (st.plan_stats.bytes > st.plan_budget) {
    while (victim != std::next(st.plans.begin()) && std::prev(victim)->second->in_graph) --victim;
    if (victim == std::next(st.plans.begin())) break;  // only this call's plan and plans in graphs are left
    --victim;
    st.plan_stats.bytes -= plan_bytes(victim->second->plan);
    st.plan_index.erase(victim->first);
    if (!capturing) capturing = st.backend->capturing(o);
    if (*capturing) st.retired.push_back(victim->second);
    victim = st.plans.erase(victim);
    ++st.plan_stats.evictions;
  }
  st.plan_stats.plans = static_cast<int64_t>(st.plans.size());
  return entry;
}

namespace {

// A table on the device: its shape checked against the call (nothing inside it is read). On a
// backend whose kernels do not read it in place (the CPU) it becomes a host table in `host`, made
// as the kernels read it (sanitize_dynamic_table), its problems added to `errors`; so does it for
// `to_host` (the weights, computed on the host) where its arrays are host memory. Only the forward
// counts (`count`): a backward or weights call with the same table adds nothing.
ForwardOptions resolve_device_table(PreparedState& st, const ForwardOptions& o, DynamicLayout& host, bool to_host = false,
                                    bool count = true) {
  const DeviceDynamicLayout* d = o.device_dynamic_layout;
  if (!d) return o;
  const std::string what = "ForwardOptions.device_dynamic_layout";
  if (!st.pattern.has_dynamic_layout()) throw UserError(what, "was given, but the pattern has no \"dynamic\" layout");
  if (o.dynamic_layout) throw UserError(what, "and ForwardOptions.dynamic_layout are both set; pass the table once");
  if (o.cu_seqlens) {
    throw UserError(what, "packed documents with a dynamic layout are not supported yet; run the documents as separate calls");
  }
  if (o.rows_with_work_only) {  // the kernels' launch checks the table: it must run whole
    throw UserError(what, "with ForwardOptions.rows_with_work_only is not supported; pass the table as "
                          "ForwardOptions.dynamic_layout or leave rows_with_work_only off");
  }
  const Shape s = problem_shape(st.problem, o.q_offset, o.k_offset);
  if (d->heads != 1 && d->heads != s.heads_q) {
    throw UserError(what + ".heads", "is " + std::to_string(d->heads) + "; give 1 (one table for every head) or heads_q (" +
                                         std::to_string(s.heads_q) + ")");
  }
  const int64_t q_blocks = dynamic_query_blocks(st.pattern, s);
  if (d->rows < 0 || d->rows % d->heads != 0 || d->rows / d->heads != q_blocks) {
    throw UserError(what + ".rows", "is " + std::to_string(d->rows) + "; the table needs heads * query blocks = " +
                                        std::to_string(d->heads) + " * " + std::to_string(q_blocks) +
                                        " rows (query blocks of the dynamic layout over q_offset + seq_q)");
  }
  if (d->entries < 0 || d->entries > INT64_MAX / 8) throw UserError(what + ".entries", "must be >= 0 (the length of col_indices)");
  if (!d->row_offsets || (d->entries > 0 && !d->col_indices)) {
    throw UserError(what, "needs row_offsets (rows + 1 entries) and, with entries > 0, col_indices");
  }
  if (st.backend->reads_device_tables() && !to_host) return o;
  if (!st.backend->tables_in_host_memory()) {
    throw UserError(what, "is read on the host here (attention weights); pass the table as ForwardOptions.dynamic_layout");
  }
  host.heads = d->heads;
  const int64_t problems =
      sanitize_dynamic_table(d->row_offsets, d->rows, d->col_indices, d->entries, dynamic_key_blocks(st.pattern, s), host);
  if (d->errors && count) *d->errors += static_cast<int32_t>(std::min<int64_t>(problems, INT32_MAX));
  ForwardOptions out = o;
  out.device_dynamic_layout = nullptr;
  out.dynamic_layout = &host;
  return out;
}

// The kernel configuration for a CUDA problem: the caller's, else the tuning database's (exact key,
// nearest bucket, or the heuristic default), tuning first on a miss when tuning is on.
KernelConfig tuned_config(const Pattern& pattern, const Problem& problem, const RuntimeOptions& o) {
  if (!(o.config == KernelConfig{})) return o.config;
  CudaDriver::get();  // without a driver, the plain "no GPU" error rather than a tuning one
  const TuningGpu gpu = tuning_gpu(o.device.index);
  const TuneKey key = tune_key_for(gpu, pattern, problem);
  TuningDb db(default_db_files(knobs(), gpu.name), running_metadata(gpu.arch));
  if ((o.tune || knobs().tune) && db.needs_retune(key) && !pattern.has_dynamic_layout()) {
    log(LogLevel::Warn, "tuning " + key.describe() + " on first use (tuning is on); the result goes to " + db.files()[0].path);
    GpuTuneOptions to;
    to.device = o.device.index;
    to.cache_dir = o.cache_dir;
    const GpuTuneOutcome out = tune_on_gpu(pattern, problem, TuneBudget{}, to);
    db.record(db.files()[0].path, out.key, out.result, out.metadata);
    return out.result.best;
  }
  const LookupResult r = db.lookup(key);
  if (knobs().print_autotuning) {
    log(LogLevel::Warn, "autotune: " + key.describe() + " -> " + describe(r.config) + " (" + to_string(r.source) + ": " +
                            r.why + ")");
  }
  return r.config;
}

// The backward kernels' configuration: the caller's, else the tuning database's backward entry
// (exact key or nearest bucket; filled by `attnjit tune --backward`), else the path's default.
// Whether the Hopper backward's dK/dV runs on wgmma: the option and the ATTNJIT_BWD_WGMMA knob (on
// by default), unless the caller chose backward tiles, which are the sm_80 kernels' (the wgmma
// kernels' tiles are fixed).
bool wgmma_backward(const RuntimeOptions& o) {
  return o.wgmma_backward && knobs().bwd_wgmma && o.backward_config == KernelConfig{};
}

// What the prepared attention's kernels are asked for besides their tiles: the options, and the
// knobs that stand for them.
KernelChoices kernel_choices(const RuntimeOptions& o, RandomLayouts random) {
  return KernelChoices{o.tma,
                       random,
                       wgmma_backward(o),
                       o.lazy_rescale || knobs().lazy_rescale,
                       o.poly_exp2 || knobs().poly_exp2,
                       o.pack_branches && knobs().pack_branches,
                       o.persistent_blocks != 0 ? o.persistent_blocks : knobs().persistent ? -1 : 0};
}

KernelConfig tuned_backward_config(const Pattern& pattern, const Problem& problem, const RuntimeOptions& o) {
  if (!(o.backward_config == KernelConfig{})) return o.backward_config;
  // The wgmma backward's tiles are fixed (a tuned entry is for the sm_80 kernels' tiles; asked for on
  // another GPU, its sm_80 kernels take their default tiles). Past its head dims the sm_80 kernels
  // run on a Hopper too, at their tuned tiles.
  if (wgmma_backward(o) && wgmma_backward_head_dims(problem.head_dim, problem.head_dim_v)) return {};
  CudaDriver::get();  // without a driver, the plain "no GPU" error rather than a tuning one
  const TuningGpu gpu = tuning_gpu(o.device.index);
  const TuneKey key = tune_key_for(gpu, pattern, problem, {}, true);
  const LookupResult r = TuningDb(default_db_files(knobs(), gpu.name), running_metadata(gpu.arch)).lookup(key);
  if (knobs().print_autotuning) {
    log(LogLevel::Warn, "autotune: " + key.describe() + " -> " + describe(r.config) + " (" + to_string(r.source) + ": " +
                            r.why + ")");
  }
  return r.config;
}

}  // namespace

KernelRequest forward_request(KernelRequest r, const KernelConfig& config, const KernelChoices& c) {
  r.config = config;
  r.tma = c.tma && knobs().tma;
  r.random_in_kernel = c.random == RandomLayouts::InKernel;
  r.lazy_rescale = c.lazy_rescale;
  r.poly_exp2 = c.poly_exp2;
  r.pack_branches = c.pack_branches;
  r.persistent = c.persistent_blocks != 0;
  return r;
}


KernelRequest backward_request(KernelRequest r, const KernelConfig& config, const KernelChoices& c) {
  r = forward_request(r, config, c);
  r.wgmma_backward = c.wgmma_backward;
  return r;
}

namespace {

// The options' values that name nothing: a UserError naming the field, before anything runs on them.
void check_runtime_options(const RuntimeOptions& o) {
  const int kind = static_cast<int>(o.device.kind);
  if (kind < static_cast<int>(DeviceKind::CPU) || kind > static_cast<int>(DeviceKind::EMU))
    throw UserError("RuntimeOptions.device.kind", std::to_string(kind) +
                                                      " is no device kind; use Device::cpu(), Device::cuda(index) or "
                                                      "Device::emu(arch)");
  if (o.device.kind == DeviceKind::CUDA && o.device.index < 0)
    throw UserError("RuntimeOptions.device", "Device::cuda(" + std::to_string(o.device.index) +
                                                 "): a CUDA device ordinal is 0 or more (0: the first GPU)");
  if (o.device.kind == DeviceKind::EMU) {
    const std::string name = "sm_" + std::to_string(o.device.index) + (o.device.arch_specific ? "a" : "");
    if (!is_gpu_arch(o.device.index))
      throw UserError("RuntimeOptions.device", "Device::emu(" + std::to_string(o.device.index) + "): no GPU has " + name +
                                                   ", so the emulator cannot model it; use one of " + gpu_arch_list());
    if (o.device.arch_specific && o.device.index != 90)
      throw UserError("RuntimeOptions.device", "Device::emu(" + std::to_string(o.device.index) +
                                                   ", arch_specific): attnjit has arch-specific kernels for sm_90a only");
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"RuntimeOptions.plan_cache_bytes", o.plan_cache_bytes},
                                    {"RuntimeOptions.random_in_kernel_above", o.random_in_kernel_above}})
    if (value < -1) throw UserError(name, std::to_string(value) + " is negative; use -1 (the knob's value) or a count >= 0");
}

}  // namespace

Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<Impl>()) {
  check_runtime_options(options);
  impl_->options = std::move(options);
}
Runtime::~Runtime() = default;
const Device& Runtime::device() const { return impl_->options.device; }

Attention Runtime::prepare(const Pattern& pattern, const Problem& problem) {
  check_problem(problem);
  check_pattern_fits(pattern, problem_shape(problem, 0, 0));
  auto st = std::make_shared<PreparedState>();
  st->pattern = pattern;
  st->problem = problem;
  const RuntimeOptions& o = impl_->options;
  if (o.persistent_blocks < -1) {
    throw UserError("RuntimeOptions.persistent_blocks", std::to_string(o.persistent_blocks) +
                                             " is not a block count; use -1 (one per SM), 0 (one per work item) or a positive count");
  }
  st->plan_budget = o.plan_cache_bytes >= 0 ? o.plan_cache_bytes : knobs().plan_cache_bytes;
  st->period = translation_period(pattern);
  // Random layouts whose plan would hash too many blocks are left to the kernels (not on the CPU,
  // whose executor has no seek): decided now, since the kernels carry the seek only then.
  const int64_t random_above = o.random_in_kernel_above >= 0 ? o.random_in_kernel_above : knobs().random_in_kernel_above;
  if (o.device.kind != DeviceKind::CPU && random_layout_hashes(pattern, problem_shape(problem, 0, 0)) > random_above)
    st->random = RandomLayouts::InKernel;
  const TemplateSet& templates = o.templates ? *o.templates : TemplateSet::embedded();
  switch (o.device.kind) {
    case DeviceKind::CPU: st->backend = make_cpu_backend(st->pattern, problem); break;
    case DeviceKind::EMU:
      st->backend = make_emu_backend(st->pattern, problem, {o.device.index, o.device.arch_specific}, o.cache_dir, o.config,
                                     o.backward_config, templates, kernel_choices(o, st->random));
      break;
    case DeviceKind::CUDA:
      st->backend = make_cuda_backend(st->pattern, problem, o.device.index, o.cache_dir, tuned_config(pattern, problem, o),
                                      tuned_backward_config(pattern, problem, o), templates, kernel_choices(o, st->random));
      break;
  }
  // FP8 inputs run Separate plans: a packed key's weight would push P past e4m3's range (P8 rounds
  // probabilities times 2^8; five branches' 1280 is over 448).
  if (kernel_choices(o, st->random).pack_branches && st->backend->reads_key_weights() && problem.dtype != DType::E4M3)
    st->packing = BranchPacking::Packed;
  // Plan the common case now (offsets 0), so forward() only launches.
  if (!pattern.has_dynamic_layout()) plan_for(*st, ForwardOptions{});
  Attention a;
  a.state_ = std::move(st);
  return a;
}

PagedAttention Runtime::prepare_paged(const Pattern& pattern, const PagedProblem& problem) {
  PagedAttention a;
  a.state_ = make_paged_state(pattern, problem, impl_->options);
  return a;
}

const BackwardPlans& PlanEntry::backward_plans(const Pattern& p, const DynamicLayout* dynamic, const TileConfig& tiles) const {
  std::call_once(backward_once_, [&] {
    auto b = std::make_unique<BackwardPlans>();
    // The backward's plans are Separate (a key-major entry carries no key weights).
    const bool same = tiles.tile_q == plan.tiles.tile_q && tiles.tile_k == plan.tiles.tile_k && !plan.packed();
    b->query_major = same ? plan : lower_to_plan(p, plan.shape, tiles, dynamic, plan.documents.empty() ? nullptr : &plan.documents, random);
    b->key_major = lower_to_backward_plan(b->query_major);
    backward_ = std::move(b);
  });
  return *backward_;
}

const Pattern& Attention::pattern() const { return state_->pattern; }

PlanCacheStats Attention::plan_cache_stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  PlanCacheStats s = state_->plan_stats;
  for (const auto& [key, entry] : state_->plans) s.in_graph += entry->in_graph ? 1 : 0;
  return s;
}
const Problem& Attention::problem() const { return state_->problem; }
std::string Attention::kernel_name() const { return state_->backend->kernel_name(); }

size_t Attention::backward_workspace_bytes() const {
  if (!state_) throw UserError("Attention", "is empty; get one from Runtime::prepare");
  return state_->backend->backward_workspace_bytes();
}

namespace {

// A caller's workspace: both fields or neither, aligned, large enough for this device.
void check_workspace(const ForwardOptions& o, size_t needed) {
  if (o.workspace == nullptr && o.workspace_bytes == 0) return;
  if (o.workspace == nullptr) {
    throw UserError("workspace", "is null but workspace_bytes is " + std::to_string(o.workspace_bytes) +
                                     "; pass both (or neither, for the stream-ordered pool)");
  }
  if (reinterpret_cast<uintptr_t>(o.workspace) % 256 != 0) {
    throw UserError("workspace", "must be 256-byte aligned (device allocations are); offset it or allocate it anew");
  }
  if (o.workspace_bytes < needed) {
    throw UserError("workspace", "has " + std::to_string(o.workspace_bytes) + " bytes but this backward needs " +
                                     std::to_string(needed) + " (Attention::backward_workspace_bytes())");
  }
}

}  // namespace

void Attention::forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                        const TensorView* lse, const ForwardOptions& options) {
  if (!state_) throw UserError("Attention", "is empty; get one from Runtime::prepare");
  check_forward_inputs(state_->problem, q, k, v, o, lse, state_->backend->alignment());
  check_descales(state_->problem, options, q, k, v, o);
  DynamicLayout host;
  const ForwardOptions o2 = resolve_device_table(*state_, options, host);
  const std::shared_ptr<PlanEntry> entry = plan_for(*state_, o2);
  state_->backend->forward(*entry, q, k, v, o, lse, o2);
}

void Attention::backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                         const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                         const TensorView& dv, const ForwardOptions& options) {
  if (!state_) throw UserError("Attention", "is empty; get one from Runtime::prepare");
  check_forward_only(state_->problem, "backward");
  check_backward_inputs(state_->problem, q, k, v, o, lse, dout, dq, dk, dv, state_->backend->alignment(), options.dlse);
  check_workspace(options, state_->backend->backward_workspace_bytes());
  DynamicLayout host;
  ForwardOptions o2 = resolve_device_table(*state_, options, host, /*to_host=*/false, /*count=*/false);
  o2.deterministic = options.deterministic || knobs().deterministic;
  const std::shared_ptr<PlanEntry> entry = plan_for(*state_, o2);
  state_->backend->backward(*entry, q, k, v, o, lse, dout, dq, dk, dv, o2, nullptr);
}

void Attention::backward_add(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                             const TensorView& dout, const TensorView& delta, const TensorView& dq_acc,
                             const TensorView& dk_acc, const TensorView& dv_acc, const ForwardOptions& options) {
  if (!state_) throw UserError("Attention", "is empty; get one from Runtime::prepare");
  check_forward_only(state_->problem, "backward_add");
  if (options.dlse) {
    throw UserError("dlse", "is not an option of backward_add: subtract it from delta (D = rowsum(dout * o) - dlse)");
  }
  if (options.device_dynamic_layout) {
    throw UserError("device_dynamic_layout", "is not supported by backward_add; give the table on the host "
                                             "(ForwardOptions::dynamic_layout) or use backward()");
  }
  check_backward_add_inputs(state_->problem, q, k, v, lse, dout, delta, dq_acc, dk_acc, dv_acc, state_->backend->alignment());
  DynamicLayout host;
  ForwardOptions o2 = resolve_device_table(*state_, options, host, /*to_host=*/false, /*count=*/false);
  o2.deterministic = options.deterministic || knobs().deterministic;
  const std::shared_ptr<PlanEntry> entry = plan_for(*state_, o2);
  const GradientSink sink{&delta, &dq_acc, &dk_acc, &dv_acc};
  // o is never read (D is given): dout stands in its place; the accumulators in the gradients'.
  state_->backend->backward(*entry, q, k, v, dout, lse, dout, dq_acc, dk_acc, dv_acc, o2, &sink);
}

void Attention::weights(const TensorView& q, const TensorView& k, const TensorView& lse, const TensorView& w,
                        const ForwardOptions& options) {
  if (!state_) throw UserError("Attention", "is empty; get one from Runtime::prepare");
  check_forward_only(state_->problem, "weights");
  check_weights_inputs(state_->problem, q, k, lse, w, state_->backend->alignment());
  DynamicLayout host;
  const ForwardOptions o2 = resolve_device_table(*state_, options, host, /*to_host=*/true, /*count=*/false);
  const std::shared_ptr<PlanEntry> entry = plan_for(*state_, o2);
  state_->backend->weights(*entry, state_->pattern, q, k, lse, w, o2);
}

void attention(Runtime& rt, const Pattern& pattern, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& o, const TensorView* lse, const ForwardOptions& options) {
  Problem pb;
  if (q.shape.size() != 4 || k.shape.size() != 4 || v.shape.size() != 4) {
    throw UserError("q/k/v", "must be 4-D views [batch, seq, heads, head_dim]");
  }
  pb.batch = q.shape[0];
  pb.seq_q = q.shape[1];
  pb.heads_q = q.shape[2];
  pb.head_dim = q.shape[3];
  pb.seq_k = k.shape[1];
  pb.heads_kv = k.shape[2];
  pb.head_dim_v = v.shape[3];
  pb.dtype = q.dtype;
  if (o.dtype != q.dtype) pb.out_dtype = o.dtype;  // fp8_e4m3 inputs: o's dtype says which output
  rt.prepared(pattern, pb).forward(q, k, v, o, lse, options);
}

Attention Runtime::prepared(const Pattern& pattern, const Problem& pb) {
  std::ostringstream key;
  key << pattern_hash(pattern) << "/" << pb.batch << "," << pb.seq_q << "," << pb.seq_k << "," << pb.heads_q << ","
      << pb.heads_kv << "," << pb.head_dim << "," << pb.head_dim_v << "," << to_string(pb.dtype) << "," << to_string(pb.o_dtype());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->prepared.find(key.str());
  if (it == impl_->prepared.end()) it = impl_->prepared.emplace(key.str(), prepare(pattern, pb)).first;
  return it->second;
}

}  // namespace attnjit
