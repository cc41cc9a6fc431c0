// A CUDA device: generate and load the kernel once, copy each plan's tables once in the caller's
// stream order (StagedTables; nothing synchronises, and a first call may be captured in a CUDA
// graph), launch on the caller's stream. Every pointer is checked to be device memory of this
// device before a launch.
// The backward kernels are compiled and their tables uploaded on the first backward call; their
// workspaces come from the caller (ForwardOptions::workspace) or the stream-ordered pool.
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>

#include "compiler/jit/jit.hpp"
#include "compiler/nvrtc/nvrtc_library.hpp"
#include "compiler/plan/device_plan.hpp"
#include "compiler/support/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/input_checks.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/host_tensors.hpp"
#include "runtime/kernel_params.hpp"
#include "runtime/cuda/tma_maps.hpp"

namespace attnjit {
namespace {

// Tables the kernels read, packed on the host and copied to the device in the order of the stream
// that first needs them: no call synchronises. One device allocation holds every region (each
// 256-byte aligned). The first call allocates and copies on its stream, so the kernels it launches
// next see the tables; later calls wait for the copy with an event until it has finished. A
// call captured in a CUDA graph (the first call included) allocates outside the graph and makes the
// copy a node of the graph, from pinned host memory, so every replay copies the tables before its
// kernels; the plan entry is then kept while the prepared attention lives (PlanEntry::in_graph),
// because the graph reads its memory. An eager call after such a capture copies once more on its
// own stream: a capture runs nothing. A capture after an eager copy not known to have finished
// copies too (the same bytes), rather than wait on the host.
class StagedTables {
public:
  StagedTables() = default;
  StagedTables(const StagedTables&) = delete;
  StagedTables& operator=(const StagedTables&) = delete;
  // Destroyed when the plan entry goes (the byte budget, or the prepared attention): a kernel
  // launched before on some stream may still read the tables, so the context's work is waited for.
  ~StagedTables() { device_.wait_for_users(); }

  // Appends a region; returns its offset (a device address once ready_on has run: at()).
  template <typename T>
  size_t add(const std::vector<T>& v) {
    const size_t offset = (host_.size() + 255) / 256 * 256;
    host_.resize(offset + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(host_.data() + offset, v.data(), v.size() * sizeof(T));
    return offset;
  }

  // Makes the tables readable by the work enqueued next on `stream`; `capturing` says whether that
  // stream is capturing a graph (the caller holds a RelaxedCapture for it). `kernel` and `part`
  // name the tables in errors (built only where a call allocates or copies).
  void ready_on(CUstream stream, bool capturing, const std::string& kernel, const char* part) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto what = [&](const char* tail) { return std::string("the ") + part + " plan tables of " + kernel + tail; };
    if (!device_.get()) device_ = DeviceBuffer(std::max<size_t>(host_.size(), 16), what(""));
    if (landed_ || host_.empty()) return;  // (empty: no table has an entry)
    if (capturing) {
      // Also after an eager copy not known to have landed: the graph may run on any stream, and
      // copying the same bytes again is harmless.
      if (!pinned_.get()) {
        pinned_ = PinnedBuffer(host_.size(), what(" for a CUDA graph"));
        std::memcpy(pinned_.get(), host_.data(), host_.size());
      }
      copy_to_device_async(device_.get(), pinned_.get(), host_.size(), stream, what(" (in a CUDA graph)"));
      return;
    }
    if (!copied_) {
      // From pageable memory the driver stages the bytes before it returns, and the copy is ordered
      // before the stream's later work.
      copy_to_device_async(device_.get(), host_.data(), host_.size(), stream, what(""));
      copied_event_ = std::make_unique<StreamEvent>();
      copied_event_->record(stream);
      copied_ = true;
      return;
    }
    // Until the copy is known to have finished every call waits for it, the copying stream's too
    // (harmless there; a stream handle may be reused once its stream is destroyed).
    if (copied_event_->done()) {
      landed_ = true;
      std::vector<uint8_t>().swap(host_);  // never copied again: a capture now reads the device's copy
    } else {
      copied_event_->make_wait(stream);
    }
  }

  CUdeviceptr at(size_t offset) const { return device_.get() + offset; }

private:
  // The packed tables (dropped once the copy has landed), and where they are on the device: changed
  // by ready_on, under the mutex.
  mutable std::vector<uint8_t> host_;
  mutable std::mutex mutex_;
  mutable DeviceBuffer device_;
  mutable PinnedBuffer pinned_;  // the source of a graph's copy: lives as long as the tables
  mutable std::unique_ptr<StreamEvent> copied_event_;
  mutable bool copied_ = false;  // an eager copy was enqueued (copied_event_ follows it)
  mutable bool landed_ = false;  // and is known to have finished
};

// The tables of one plan: where each array sits in the staged tables, and their sizes.
struct GpuTables {
  StagedTables staged;
  size_t items = 0, spans = 0, entries = 0, dyn_rows = 0, dyn_cols = 0, doc_base = 0, key_extra = 0;
  bool has_dyn = false, has_doc = false, has_extra = false;
  int64_t doc_rows = 0;
  int32_t num_items = 0;
  int32_t work_items = 0;  // work_item_prefix: the launch of ForwardOptions::rows_with_work_only
  int64_t dyn_q_blocks = 0;
  int32_t dyn_heads = 1;
  int64_t dyn_entries = 0, dyn_k_blocks = 0;

  // The kernels' view of the tables, after staged.ready_on.
  KernelTables kernel_tables() const {
    auto ptr = [&](bool present, size_t offset) { return present ? reinterpret_cast<const void*>(staged.at(offset)) : nullptr; };
    return KernelTables{static_cast<const DeviceItem*>(ptr(true, items)), static_cast<const DeviceSpan*>(ptr(true, spans)),
                        static_cast<const int32_t*>(ptr(true, entries)), static_cast<const int64_t*>(ptr(has_dyn, dyn_rows)),
                        static_cast<const int32_t*>(ptr(has_dyn, dyn_cols)), num_items, dyn_q_blocks, dyn_heads,
                        static_cast<const int64_t*>(ptr(has_doc, doc_base)), doc_rows, dyn_entries, dyn_k_blocks,
                        static_cast<const float*>(ptr(has_extra, key_extra))};
  }
};

// The tables of the backward plans: the query-major plan (the backward kernels' tiles) and the
// key-major plan.
struct GpuBackwardTables {
  GpuTables query_major;
  StagedTables key_major;
  size_t key_items = 0, query_entries = 0;
  int32_t num_key_items = 0;
};

// The backward's scratch: D [B, Hq, Sq], then the fp32 dK, dV and, for kernels that can run the
// single pass, dQ accumulators, each region 256-byte aligned.
struct BackwardScratch {
  size_t delta = 0, dk = 0, dv = 0, dq = 0;  // region offsets
  size_t dk_bytes = 0, dv_bytes = 0, dq_bytes = 0, total = 0;
  BackwardScratch(const Problem& pb, bool single_pass) {
    auto round = [](size_t n) { return (n + 255) / 256 * 256; };
    dk_bytes = size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim) * 4;
    dv_bytes = size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim_v) * 4;
    dq_bytes = single_pass ? size_t(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim) * 4 : 0;
    dk = round(size_t(pb.batch * pb.heads_q * pb.seq_q) * 4);
    dv = dk + round(dk_bytes);
    dq = dv + round(dv_bytes);
    total = dq + round(dq_bytes);
  }
};

// Stream-ordered workspace, freed on the same stream when it goes out of scope; or the caller's.
class Workspace {
public:
  Workspace(size_t bytes, CUstream s, void* caller)
      : stream_(s), ptr_(caller ? reinterpret_cast<CUdeviceptr>(caller) : alloc_async(std::max<size_t>(bytes, 16), s, "backward workspace")),
        owned_(caller == nullptr) {}
  ~Workspace() {
    if (owned_) free_async(ptr_, stream_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  float* at(size_t offset) const { return reinterpret_cast<float*>(ptr_ + offset); }

private:
  CUstream stream_;
  CUdeviceptr ptr_;
  bool owned_;
};

class CudaBackend final : public Backend {
public:
  CudaBackend(const Pattern& p, const Problem& pb, int device, const std::string& cache_dir, const KernelConfig& config,
              const KernelConfig& backward_config, const TemplateSet& templates, const KernelChoices& choices)
      : pattern_(p), problem_(pb), device_(device), cache_dir_(cache_dir), context_(shared_context(device)),
        persistent_blocks_(choices.persistent_blocks) {
    const ScopedCurrentContext current(context_);
    const RelaxedCapture relaxed(true);  // prepared inside a capture: loading a module is no stream work
    if (knobs().keep_pool_memory) keep_pool_memory(device);
    prefer_nvrtc_for_driver(driver_version() / 1000);  // 13000 -> 13: kernels this driver loads
    const DeviceInfo info = device_info(device);
    const int arch = info.cc_major * 10 + info.cc_minor;
    KernelRequest r = forward_request(problem_request(pb, arch, cuda_arch_specific(arch)), config, choices);
    // Kernel parameters past 4 KB (a persistent forward's O maps): CUDA 12.1's driver and NVRTC on.
    const std::optional<NvrtcLibrary> nvrtc = nvrtc_for_arch(arch);
    r.large_params = driver_version() >= 12010 && nvrtc && (nvrtc->major > 12 || (nvrtc->major == 12 && nvrtc->minor >= 1));
    source_ = generate_kernel(p, r, templates);
    max_shared_ = info.max_shared_per_block_optin;
    sm_count_ = info.sm_count;
    main_ = load(source_, info.name);
    if (source_.tma_maps) {  // the cp.async kernel, for calls whose rows no tensor map describes
      r.tma = false;
      fallback_source_ = generate_kernel(p, r, templates);
      device_name_ = info.name;
    }
    if (pb.dtype == DType::E4M3) return;  // FP8 attention is forward only (check_forward_only)
    r = backward_request(problem_request(pb, arch, cuda_arch_specific(arch)), backward_config, choices);
    bwd_[0] = generate_backward_kernels(p, r, templates);
    if (bwd_[0].source.tma_maps) bwd_[1] = generate_backward_kernels(p, backward_fallback_request(r, bwd_[0]), templates);
  }

  // Packs the tables on the host; the first call that runs the plan copies them (StagedTables).
  void upload(PlanEntry& entry, const DynamicLayout* dynamic) override {
    auto t = std::make_shared<GpuTables>();
    pack_tables(*t, entry.plan, dynamic);
    if (pattern_.has_dynamic_layout()) t->dyn_k_blocks = dynamic_key_blocks(pattern_, entry.plan.shape);
    entry.device_state = t;
  }

  bool capturing(const ForwardOptions& options) const override {
    const ScopedCurrentContext current(context_);
    return stream_capturing(static_cast<CUstream>(options.stream));
  }

  // The weights are for inspection: computed on the host (Backend::weights) from copies of q, k
  // and lse taken after the caller's stream has finished, then copied into w.
  void weights(const PlanEntry& entry, const Pattern& pattern, const TensorView& q, const TensorView& k,
               const TensorView& lse, const TensorView& w, const ForwardOptions& options) override {
    const ScopedCurrentContext current(context_);
    check_device_memory({{"q", &q}, {"k", &k}, {"lse", &lse}, {"w", &w}});
    synchronize(static_cast<CUstream>(options.stream), "waiting for the forward before computing weights");
    std::vector<std::vector<uint8_t>> copies;
    auto to_host = [&](const TensorView& t) {
      copies.emplace_back(static_cast<size_t>(view_extent_bytes(t)));
      copy_to_host(copies.back().data(), reinterpret_cast<CUdeviceptr>(t.data), copies.back().size(), "copying weights' inputs");
      TensorView h = t;
      h.data = copies.back().data();
      return h;
    };
    const TensorView hq = to_host(q), hk = to_host(k), hl = to_host(lse);
    std::vector<float> hw(static_cast<size_t>(view_extent_bytes(w) / 4));
    Backend::weights(entry, pattern, hq, hk, hl, TensorView::contiguous(hw.data(), DType::F32, w.shape), options);
    copy_to_device(reinterpret_cast<CUdeviceptr>(w.data), hw.data(), hw.size() * 4, "copying the weights");
    synchronize(nullptr, "copying the weights");  // a copy from pageable memory may return before it lands
  }

  void backward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const ForwardOptions& options, const GradientSink* sink) override {
    const ScopedCurrentContext current(context_);
    check_device_memory({{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}, {"lse", &lse}, {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv},
                         {"dlse", options.dlse}, {"delta", sink ? sink->delta : nullptr}});
    const CUstream stream = static_cast<CUstream>(options.stream);
    const bool capturing = stream_capturing(stream);
    const RelaxedCapture relaxed(capturing);  // a first backward in a graph compiles and loads its kernels
    const BackwardKernels& bwd = bwd_[0];
    const BackwardPlans& plans = entry.backward_plans(pattern_, planning_table(options),
                                                      TileConfig{bwd.source.config.tile_q, bwd.source.config.tile_k});
    check_kernel_seeks(plans.query_major, bwd.source);
    // The TMA kernel's maps of Q and dO; where no map describes the query rows, the fallback kernels
    // (the same tiles, so the same plans and tables).
    int which = 0;
    TmaMaps maps{};
    if (bwd.source.tma_maps) {
      if (const auto specs = backward_tma_map_specs(plans.key_major, problem_, q, dout, bwd.source.config.tile_q))
        maps = encode_tma_maps(*specs, false);
      else
        which = 1;
    }
    const BackwardKernels& kk = bwd_[which];
    Module& module = backward_module(which);
    const auto& t = *static_cast<const GpuBackwardTables*>(entry.backward_device_state([&] {
      auto bt = std::make_shared<GpuBackwardTables>();
      pack_tables(bt->query_major, plans.query_major, options.dynamic_layout);
      if (pattern_.has_dynamic_layout()) bt->query_major.dyn_k_blocks = dynamic_key_blocks(pattern_, plans.query_major.shape);
      const DeviceBackwardPlan kp = pack_backward_plan(plans.key_major);
      bt->key_items = bt->key_major.add(kp.items);
      bt->query_entries = bt->key_major.add(kp.entries);
      bt->num_key_items = static_cast<int32_t>(kp.items.size());
      return std::shared_ptr<void>(bt);
    }));
    t.query_major.staged.ready_on(stream, capturing, kk.source.name, "backward");
    t.key_major.ready_on(stream, capturing, kk.source.name, "backward key-major");
    if (capturing) entry.in_graph = true;
    const Problem& pb = problem_;
    const BackwardScratch layout(pb, kk.single_pass);
    if (options.workspace && !sink) {
      TensorView w;
      w.data = options.workspace;
      check_device_memory({{"workspace", &w}});
    }
    const GpuTables& f = t.query_major;
    const BackwardGrids g = backward_grids(pb, kk, size_t(sink ? f.work_items : f.num_items), plans.key_major,
                                           options.deterministic, sink != nullptr);
    // The scratch: D and the fp32 accumulators, zeroed; with a sink, the caller's, as they are.
    std::optional<Workspace> ws;
    float *delta, *dk_acc, *dv_acc, *dq_all;
    if (sink) {
      delta = static_cast<float*>(sink->delta->data), dk_acc = static_cast<float*>(dk.data);
      dv_acc = static_cast<float*>(dv.data), dq_all = static_cast<float*>(dq.data);
    } else {
      ws.emplace(layout.total, stream, options.workspace);
      delta = ws->at(layout.delta), dk_acc = ws->at(layout.dk), dv_acc = ws->at(layout.dv), dq_all = ws->at(layout.dq);
      if (!g.direct_dkdv) {  // else _dkdv stores dK and dV itself, every row
        memset_d8_async(reinterpret_cast<CUdeviceptr>(dk_acc), 0, layout.dk_bytes, stream);
        memset_d8_async(reinterpret_cast<CUdeviceptr>(dv_acc), 0, layout.dv_bytes, stream);
      }
      if (g.single_pass) memset_d8_async(reinterpret_cast<CUdeviceptr>(dq_all), 0, layout.dq_bytes, stream);
    }
    float* const dq_acc = g.single_pass ? dq_all : nullptr;
    const KernelTables tables = f.kernel_tables();
    const BackwardTables bt{reinterpret_cast<const DeviceKeyItem*>(t.key_major.at(t.key_items)),
                            reinterpret_cast<const DeviceQueryEntry*>(t.key_major.at(t.query_entries)), t.num_key_items, delta,
                            dk_acc, dv_acc, dq_acc};
    KernelBwdParams bp = backward_params(plans.query_major, pb, tables, bt, q, k, v, o, lse, dout, dq, dk, dv, options);
    if (sink) bp.dq = bp.dk = bp.dv = nullptr;  // nothing is stored in the storage type
    bp.fwd.dyn_errors = nullptr;  // the forward counted the table's problems
    void* args[] = {&bp, &maps};  // only the TMA kernel's _dkdv takes the second
    auto run_at = [&](const std::string& kernel, const LaunchGrid& g, int threads, int shared_bytes) {
      launch(module.function(kernel), g.x, g.y, g.z, static_cast<unsigned>(threads), static_cast<unsigned>(shared_bytes), stream,
             args,
             kernel + " grid=(" + std::to_string(g.x) + "," + std::to_string(g.y) + "," + std::to_string(g.z) +
                 ") block=" + std::to_string(threads));
    };
    auto run = [&](const std::string& kernel, uint64_t gx, int64_t batch, int threads, int shared_bytes) {
      if (gx != 0) run_at(kernel, item_grid(static_cast<int64_t>(gx), batch, false, 0, 0), threads, shared_bytes);
    };
    run(kk.pre, g.pre, pb.batch, kk.aux_threads, 0);
    if (sink && !g.single_pass) bp.dq_acc = dq_all;  // _dq adds into the caller's accumulator
    run(kk.dq, g.dq, pb.batch, kk.dq_threads, kk.dq_shared_bytes);
    bp.dq_acc = dq_acc;
    for (const DkdvLaunch& d : g.dkdv) {  // the launch copies the arguments: bp may change after it
      if (d.blocks == 0) continue;
      bp.key_item_base = d.key_item_base, bp.plain_add = d.plain_add, bp.key_item_count = static_cast<int32_t>(d.blocks);
      // A persistent _dkdv's block fills an SM (its shared memory): one per SM at most.
      run_at(kk.dkdv, item_grid(static_cast<int64_t>(d.blocks), pb.batch, kk.source.persistent, persistent_blocks_, sm_count_),
             kk.dkdv_threads, kk.dkdv_shared_bytes);
    }
    bp.plain_add = g.direct_dkdv ? 2 : 0;  // _cvt: with dK, dV stored, dQ alone
    run(kk.cvt, g.cvt, 1, kk.aux_threads, 0);
  }

  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    const ScopedCurrentContext current(context_);
    check_device_memory({{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}, {"lse", lse}});
    check_device_table(options.device_dynamic_layout);
    check_kernel_seeks(entry.plan, source_);
    check_kernel_weights(entry.plan, source_);
    const auto& t = *static_cast<const GpuTables*>(entry.device_state.get());
    // Every item runs; with rows_with_work_only, those that visit a tile (the other rows of o and
    // lse keep their contents).
    const int32_t launched = options.rows_with_work_only ? t.work_items : t.num_items;
    if (launched == 0) return;
    const CUstream stream = static_cast<CUstream>(options.stream);
    const bool capturing = stream_capturing(stream);
    const RelaxedCapture relaxed(capturing);  // a first call in a graph allocates and may load the fallback kernel
    t.staged.ready_on(stream, capturing, source_.name, "forward");
    if (capturing) entry.in_graph = true;
    KernelTables tables = t.kernel_tables();
    tables.num_items = launched;  // the blocks that share out a device table's check
    KernelParams kp = kernel_params(entry.plan, problem_, tables, q, k, v, o, lse, options);
    const KernelSource* source = &source_;
    CUfunction function = main_.function;
    TmaForwardMaps maps{};
    if (source_.tma_maps) {
      if (const auto specs = forward_tma_map_specs(entry.plan, problem_, q, k, v, source_.o_staged ? &o : nullptr, source_.config.tile_q,
                                                   source_.config.tile_k)) {
        maps = encode_forward_tma_maps(*specs, false);
      } else {
        std::call_once(fallback_once_, [&] { fallback_ = load(fallback_source_, device_name_); });
        source = &fallback_source_, function = fallback_.function;
      }
    }
    void* args[] = {&kp, &maps};  // the cp.async kernels take only the first
    // A persistent kernel's block fills an SM (its shared memory): one per SM at most.
    const LaunchGrid g = item_grid(launched, problem_.batch, source->persistent, persistent_blocks_, sm_count_);
    launch(function, g.x, g.y, g.z, static_cast<unsigned>(source->threads), static_cast<unsigned>(source->shared_bytes), stream,
           args,
           source->name + " grid=(" + std::to_string(g.x) + "," + std::to_string(g.y) + "," + std::to_string(g.z) +
               ") block=" + std::to_string(source->threads) + " smem=" + std::to_string(source->shared_bytes));
  }

  std::string kernel_name() const override { return source_.name; }
  TileConfig tiles() const override { return TileConfig{source_.config.tile_q, source_.config.tile_k}; }
  int alignment() const override { return source_.path != KernelPath::Simt ? 16 : dtype_bytes(problem_.dtype); }
  bool reads_device_tables() const override { return true; }
  bool reads_key_weights() const override { return true; }
  bool tables_in_host_memory() const override { return false; }
  size_t backward_workspace_bytes() const override { return BackwardScratch(problem_, bwd_[0].single_pass).total; }

private:
  void check_device_memory(std::initializer_list<std::pair<const char*, const TensorView*>> tensors) const {
    for (const auto& [name, t] : tensors) {
      if (!t) continue;
      const PointerInfo pi = pointer_info(t->data);
      if (!pi.is_device_memory || pi.device_ordinal != device_) {
        throw UserError(name, std::string("is not device memory of cuda:") + std::to_string(device_) +
                                  "; copy it to the runtime's GPU (or use a Runtime on the CPU device for host tensors)");
      }
    }
  }

  // A table the kernels read in place must be this GPU's memory (checked per pointer; nothing is read).
  void check_device_table(const DeviceDynamicLayout* d) const {
    if (!d) return;
    const std::pair<const char*, const void*> arrays[] = {
        {"device_dynamic_layout.row_offsets", d->row_offsets},
        {"device_dynamic_layout.col_indices", d->entries > 0 ? d->col_indices : nullptr},
        {"device_dynamic_layout.errors", d->errors}};
    for (const auto& [name, ptr] : arrays) {
      if (!ptr) continue;
      const PointerInfo pi = pointer_info(ptr);
      if (!pi.is_device_memory || pi.device_ordinal != device_) {
        throw UserError(name, std::string("is not device memory of cuda:") + std::to_string(device_) +
                                  "; give the table in this GPU's memory (or as ForwardOptions.dynamic_layout on the host)");
      }
    }
  }

  static void pack_tables(GpuTables& t, const Plan& plan, const DynamicLayout* dynamic) {
    const DevicePlan d = pack_plan(plan);
    t.items = t.staged.add(d.items);
    t.spans = t.staged.add(d.spans);
    t.entries = t.staged.add(d.entries);
    t.num_items = static_cast<int32_t>(d.items.size());
    t.work_items = static_cast<int32_t>(work_item_prefix(plan));
    if (!d.key_extra.empty()) t.key_extra = t.staged.add(d.key_extra), t.has_extra = true;
    if (!d.doc_base.empty()) {
      t.doc_base = t.staged.add(d.doc_base), t.has_doc = true;
      t.doc_rows = static_cast<int64_t>(d.doc_base.size());
    }
    if (dynamic) {
      t.dyn_rows = t.staged.add(dynamic->row_offsets);
      t.dyn_cols = t.staged.add(dynamic->col_indices);
      t.has_dyn = true;
      t.dyn_heads = static_cast<int32_t>(dynamic->heads);
      t.dyn_q_blocks = (static_cast<int64_t>(dynamic->row_offsets.size()) - 1) / dynamic->heads;
      t.dyn_entries = static_cast<int64_t>(dynamic->col_indices.size());
    }
  }

  // A CUBIN is loaded once per device and shared by every prepared attention that uses it.
  static std::shared_ptr<Module> load_module(int device, const CompiledKernel& k) {
    static std::mutex m;
    // Never destroyed: unloading at exit could run after the driver itself is gone.
    static auto* modules = new std::map<std::pair<int, std::string>, std::shared_ptr<Module>>;
    std::lock_guard<std::mutex> lock(m);
    auto& slot = (*modules)[{device, k.key.hex}];
    if (!slot) slot = std::make_shared<Module>(k.cubin, k.name);
    return slot;
  }


  // A compiled forward kernel, loaded, its shared memory allowed.
  struct Loaded {
    std::shared_ptr<const CompiledKernel> kernel;
    std::shared_ptr<Module> module;
    CUfunction function = nullptr;
  };
  Loaded load(const KernelSource& source, const std::string& device_name) {
    Loaded l;
    KernelCompiler compiler(kernel_cache_for(cache_dir_), knobs());
    l.kernel = compiler.get(source);
    l.module = load_module(device_, *l.kernel);
    l.function = l.module->function(source.name);
    if (source.shared_bytes > 48 * 1024) {
      if (source.shared_bytes > max_shared_) {
        throw UserError(source.name, "needs " + std::to_string(source.shared_bytes) + " bytes of shared memory; " + device_name +
                                         " allows " + std::to_string(max_shared_) + "; use a smaller kernel tile (RuntimeOptions::config)");
      }
      l.module->set_max_dynamic_shared(l.function, source.shared_bytes);
    }
    return l;
  }

  Pattern pattern_;
  Problem problem_;
  int device_;
  std::string cache_dir_;
  Context& context_;
  int persistent_blocks_ = 0;  // KernelChoices::persistent_blocks
  int max_shared_ = 0;
  int sm_count_ = 0;
  KernelSource source_;
  Loaded main_;
  KernelSource fallback_source_;  // with a TMA kernel: the cp.async kernel, loaded on first need
  std::string device_name_;
  std::once_flag fallback_once_;
  Loaded fallback_;
  // The backward kernels (index 0; rendered in the constructor, compiled on their first call)
  // and, with a TMA backward, those for calls whose query rows no tensor map describes (index 1).
  Module& backward_module(int index) {
    std::call_once(bwd_once_[index], [&] {
      const BackwardKernels& k = bwd_[index];
      KernelCompiler compiler(kernel_cache_for(cache_dir_), knobs());
      bwd_kernel_[index] = compiler.get(k.source);
      bwd_module_[index] = load_module(device_, *bwd_kernel_[index]);
      // The tensor-core gradient kernels may need the opt-in above 48 KB of shared memory.
      const DeviceInfo info = device_info(device_);
      for (const auto& [kernel, bytes] : {std::pair<const std::string&, int>{k.dq, k.dq_shared_bytes}, {k.dkdv, k.dkdv_shared_bytes}}) {
        if (bytes <= 48 * 1024) continue;
        if (bytes > info.max_shared_per_block_optin) {
          throw UserError(kernel, "needs " + std::to_string(bytes) + " bytes of shared memory; " + info.name + " allows " +
                                      std::to_string(info.max_shared_per_block_optin));
        }
        bwd_module_[index]->set_max_dynamic_shared(bwd_module_[index]->function(kernel), bytes);
      }
    });
    return *bwd_module_[index];
  }

  BackwardKernels bwd_[2];
  std::once_flag bwd_once_[2];
  std::shared_ptr<const CompiledKernel> bwd_kernel_[2];
  std::shared_ptr<Module> bwd_module_[2];
};

// The paged forward on a GPU. Each call's tables (its requests' plans) are packed on the host and
// copied in the caller's stream order into a stream-ordered allocation that also holds the split
// partials, freed on the stream after the kernels; nothing synchronises.
class CudaPaged final : public PagedBackend {
public:
  CudaPaged(const Pattern& p, const PagedProblem& pb, int device, const std::string& cache_dir, const KernelConfig& config,
            const TemplateSet& templates)
      : problem_(pb), device_(device), context_(shared_context(device)) {
    const ScopedCurrentContext current(context_);
    prefer_nvrtc_for_driver(driver_version() / 1000);
    if (knobs().keep_pool_memory) keep_pool_memory(device);
    const DeviceInfo info = device_info(device);
    sm_count_ = info.sm_count;
    kernels_ = generate_paged_kernels(p, paged_request(pb, info.cc_major * 10 + info.cc_minor, config),
                                      PagedHeads{pb.heads_q, pb.heads_kv}, templates);
    KernelCompiler compiler(kernel_cache_for(cache_dir), knobs());
    kernel_ = compiler.get(kernels_.source);
    module_ = std::make_shared<Module>(kernel_->cubin, kernel_->name);
    forward_ = module_->function(kernels_.forward);
    merge_ = module_->function(kernels_.merge);
    plan_ = module_->function(kernels_.plan);
    // A step's splits aim at one wave of the forward's resident blocks (three per SM for the
    // tensor-core kernel at head dim 128, by its registers).
    resident_per_sm_ = std::max(1, module_->resident_blocks_per_sm(forward_, kernels_.threads, 0));
  }

  void forward(const PagedPlan& plan, const PagedCall& c, int32_t splits) override {
    const ScopedCurrentContext current(context_);
    if (plan.tables.items.empty()) return;
    const CUstream stream = static_cast<CUstream>(c.stream);
    if (stream_capturing(stream))
      throw UserError("PagedCall.stream", "is capturing a CUDA graph; forward() plans on the host every step: capture run() "
                                          "instead, with plan() before each replay (PagedAttention::plan/run)");
    // A stream-ordered workspace of the plan's own size: its tables copied in, the kernels run over
    // it as a graph's would, freed on the stream after them.
    const PagedCapacity cap = paged_capacity_of(plan, splits);
    const PagedWorkspace w = paged_workspace(cap, tiles().tile_q, problem_.head_dim_v);
    const std::vector<uint8_t> tables = pack_paged_workspace(plan, splits, cap, w);
    const CUdeviceptr base = alloc_async(w.total, stream, "paged plan tables");
    copy_to_device_async(base, tables.data(), tables.size(), stream, "paged plan tables");
    run_workspace(c, reinterpret_cast<void*>(base), w, cap, plan.tables.softmax_scale, plan.tables.output_scale, nullptr);
    free_async(base, stream, "paged plan tables");
  }

  // A stream-ordered workspace of `cap`, planned and run on the device, freed after the kernels.
  void forward_planned(const PagedCall& c, const PagedCapacity& cap, double softmax_scale, double output_scale,
                       const DevicePlanning& planning) override {
    const ScopedCurrentContext current(context_);
    if (cap.items == 0) return;
    const CUstream stream = static_cast<CUstream>(c.stream);
    if (stream_capturing(stream))
      throw UserError("PagedCall.stream", "is capturing a CUDA graph; capture run() over a workspace of needs(call) bytes "
                                          "(PagedAttention::run plans on the device from the same lengths)");
    const PagedWorkspace w = paged_workspace(cap, tiles().tile_q, problem_.head_dim_v);
    const CUdeviceptr base = alloc_async(w.total, stream, "paged workspace");
    run_workspace(c, reinterpret_cast<void*>(base), w, cap, softmax_scale, output_scale, &planning);
    free_async(base, stream, "paged workspace");
  }

  // The host's bytes into the workspace in the stream's order (from pageable memory the driver
  // stages them before returning); not in a capture, where a replay would copy the same step again.
  void write_workspace(void* workspace, const std::vector<uint8_t>& bytes, const PagedCall& c) override {
    const ScopedCurrentContext current(context_);
    const TensorView ws{workspace, DType::F32, {1}, {1}};
    const PointerInfo pi = pointer_info(ws.data);
    if (!pi.is_device_memory || pi.device_ordinal != device_)
      throw UserError("workspace", "is not device memory of cuda:" + std::to_string(device_));
    const CUstream stream = static_cast<CUstream>(c.stream);
    if (stream_capturing(stream))
      throw UserError("PagedAttention::plan", "runs eagerly before each replay, never in a capture: capture run() alone");
    copy_to_device_async(reinterpret_cast<CUdeviceptr>(workspace), bytes.data(), bytes.size(), stream, "paged workspace tables");
  }

  // The capacity's grid over the workspace's tables (capturable: nothing here touches the host's
  // data of the step).
  void run_workspace(const PagedCall& c, void* workspace, const PagedWorkspace& w, const PagedCapacity& cap,
                     double softmax_scale, double output_scale, const DevicePlanning* planning) override {
    const ScopedCurrentContext current(context_);
    check_pointers(c);
    AjPagedParams pp = paged_params(softmax_scale, output_scale, problem_, paged_workspace_tables(workspace, w), c.q, c.k_cache,
                                    c.v_cache, c.o, c.lse, c.block_table, c.block_table_stride, c.k_scale, c.v_scale, c.errors);
    if (planning) {
      set_device_planning(pp, *planning, cap, c.q.shape[0]);
      void* args[] = {&pp};
      launch(plan_, 1, 1, 1, static_cast<unsigned>(kernels_.threads), 0, static_cast<CUstream>(c.stream), args, kernels_.plan);
    }
    run_kernels(pp, static_cast<unsigned>(cap.items), static_cast<unsigned>(cap.splits), cap.splits > 1,
                static_cast<CUstream>(c.stream));
  }

  TileConfig tiles() const override { return TileConfig{kernels_.source.config.tile_q, kernels_.source.config.tile_k}; }
  int64_t target_blocks() const override { return int64_t{resident_per_sm_} * sm_count_; }
  std::string kernel_name() const override { return kernels_.source.name; }
  bool host_memory() const override { return false; }

private:
  void run_kernels(AjPagedParams& pp, unsigned grid, unsigned splits, bool merge, CUstream stream) {
    void* args[] = {&pp};
    launch(forward_, grid, splits, 1, static_cast<unsigned>(kernels_.threads), 0, stream, args,
           kernels_.forward + " grid=(" + std::to_string(grid) + "," + std::to_string(splits) + ")");
    if (merge)
      launch(merge_, grid, 1, 1, static_cast<unsigned>(kernels_.threads), 0, stream, args, kernels_.merge + " grid=" + std::to_string(grid));
  }

  void check_pointers(const PagedCall& c) const {
    // The table and the scales checked as pointers only.
    const TensorView table{const_cast<int32_t*>(c.block_table), DType::F32, {1}, {1}};
    const TensorView ks{const_cast<float*>(c.k_scale), DType::F32, {1}, {1}}, vs{const_cast<float*>(c.v_scale), DType::F32, {1}, {1}};
    const TensorView er{c.errors, DType::F32, {1}, {1}};
    const TensorView kl{const_cast<int32_t*>(c.device_kv_lens), DType::F32, {1}, {1}},
        cu{const_cast<int32_t*>(c.device_cu_seqlens_q), DType::F32, {1}, {1}};
    for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"q", &c.q}, {"k_cache", &c.k_cache}, {"v_cache", &c.v_cache},
                                  {"o", &c.o}, {"lse", c.lse}, {"block_table", &table}, {"k_scale", c.k_scale ? &ks : nullptr},
                                  {"v_scale", c.v_scale ? &vs : nullptr}, {"errors", c.errors ? &er : nullptr},
                                  {"device_kv_lens", c.device_kv_lens ? &kl : nullptr},
                                  {"device_cu_seqlens_q", c.device_cu_seqlens_q ? &cu : nullptr}}) {
      if (!t) continue;
      const PointerInfo pi = pointer_info(t->data);
      if (!pi.is_device_memory || pi.device_ordinal != device_)
        throw UserError(name, "is not device memory of cuda:" + std::to_string(device_) + "; copy it to the runtime's GPU");
    }
  }

  PagedProblem problem_;
  int device_;
  Context& context_;
  int sm_count_ = 0;
  int resident_per_sm_ = 2;  // the forward's blocks an SM holds at once
  PagedKernels kernels_;
  std::shared_ptr<const CompiledKernel> kernel_;
  std::shared_ptr<Module> module_;
  CUfunction forward_ = nullptr, merge_ = nullptr, plan_ = nullptr;
};

}  // namespace

bool cuda_arch_specific(int arch) { return arch == 90 && knobs().sm90a; }

std::unique_ptr<Backend> make_cuda_backend(const Pattern& p, const Problem& pb, int device, const std::string& cache_dir,
                                           const KernelConfig& config, const KernelConfig& backward_config,
                                           const TemplateSet& templates, const KernelChoices& choices) {
  return std::make_unique<CudaBackend>(p, pb, device, cache_dir, config, backward_config, templates, choices);
}

std::unique_ptr<PagedBackend> make_cuda_paged(const Pattern& p, const PagedProblem& pb, int device, const std::string& cache_dir,
                                              const KernelConfig& config, const TemplateSet& templates) {
  return std::make_unique<CudaPaged>(p, pb, device, cache_dir, config, templates);
}

}  // namespace attnjit
