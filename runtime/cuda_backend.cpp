// A CUDA device: generate and load the kernel once, upload each plan's tables once, launch on the
// caller's stream. Every pointer is checked to be device memory of this device before a launch.
#include <cmath>

#include "compiler/device_plan.hpp"
#include "compiler/error.hpp"
#include "compiler/jit.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/kernel_params.hpp"

namespace attnjit {
namespace {

// The uploaded tables of one plan.
struct GpuTables {
  DeviceBuffer items, spans, entries, dyn_rows, dyn_cols;
  int32_t num_items = 0;
  int64_t dyn_q_blocks = 0;
  int32_t dyn_heads = 1;
};

DeviceBuffer upload_bytes(const void* data, size_t bytes) {
  DeviceBuffer b(std::max<size_t>(bytes, 16));  // never a zero-size allocation
  if (bytes) copy_to_device(b.get(), data, bytes);
  return b;
}

class CudaBackend final : public Backend {
public:
  CudaBackend(const Pattern& p, const Problem& pb, int device, const std::string& cache_dir, const KernelConfig& config,
              const TemplateSet& templates)
      : problem_(pb), device_(device), context_(shared_context(device)) {
    context_.make_current();
    const DeviceInfo info = device_info(device);
    KernelRequest r;
    r.head_dim = static_cast<int>(pb.head_dim);
    r.head_dim_v = static_cast<int>(pb.head_dim_v);
    r.dtype = pb.dtype;
    r.arch = info.cc_major * 10 + info.cc_minor;
    r.config = config;
    source_ = generate_kernel(p, r, templates);
    KernelCompiler compiler(kernel_cache_for(cache_dir), knobs());
    kernel_ = compiler.get(source_);
    context_.make_current();
    module_ = load_module(device, *kernel_);
    function_ = module_->function(source_.name);
    if (source_.shared_bytes > 48 * 1024) {
      if (source_.shared_bytes > info.max_shared_per_block_optin) {
        throw UserError(source_.name, "needs " + std::to_string(source_.shared_bytes) + " bytes of shared memory; " +
                                          info.name + " allows " + std::to_string(info.max_shared_per_block_optin) +
                                          "; use a smaller kernel tile (RuntimeOptions::config)");
      }
      module_->set_max_dynamic_shared(function_, source_.shared_bytes);
    }
  }

  void upload(PlanEntry& entry, const DynamicLayout* dynamic) override {
    context_.make_current();
    const DevicePlan d = pack_plan(entry.plan);
    auto t = std::make_shared<GpuTables>();
    t->items = upload_bytes(d.items.data(), d.items.size() * sizeof(DeviceItem));
    t->spans = upload_bytes(d.spans.data(), d.spans.size() * sizeof(DeviceSpan));
    t->entries = upload_bytes(d.entries.data(), d.entries.size() * sizeof(int32_t));
    t->num_items = static_cast<int32_t>(d.items.size());
    if (dynamic) {
      t->dyn_rows = upload_bytes(dynamic->row_offsets.data(), dynamic->row_offsets.size() * sizeof(int64_t));
      t->dyn_cols = upload_bytes(dynamic->col_indices.data(), dynamic->col_indices.size() * sizeof(int32_t));
      t->dyn_heads = static_cast<int32_t>(dynamic->heads);
      t->dyn_q_blocks = (static_cast<int64_t>(dynamic->row_offsets.size()) - 1) / dynamic->heads;
    }
    // A copy from pageable memory may return before the DMA lands, and a launch on a
    // non-blocking stream is not ordered after it: wait here (once per plan).
    synchronize(nullptr, "uploading the plan tables of " + source_.name);
    entry.device_state = t;
  }

  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    context_.make_current();
    for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}, {"lse", lse}}) {
      if (!t) continue;
      const PointerInfo pi = pointer_info(t->data);
      if (!pi.is_device_memory || pi.device_ordinal != device_) {
        throw UserError(name, std::string("is not device memory of cuda:") + std::to_string(device_) +
                                  "; copy it to the runtime's GPU (or use a Runtime on the CPU device for host tensors)");
      }
    }
    const auto& t = *static_cast<const GpuTables*>(entry.device_state.get());
    if (t.num_items == 0) return;
    const KernelTables tables{reinterpret_cast<const DeviceItem*>(t.items.get()), reinterpret_cast<const DeviceSpan*>(t.spans.get()),
                              reinterpret_cast<const int32_t*>(t.entries.get()), reinterpret_cast<const int64_t*>(t.dyn_rows.get()),
                              reinterpret_cast<const int32_t*>(t.dyn_cols.get()), t.num_items, t.dyn_q_blocks, t.dyn_heads};
    KernelParams kp = kernel_params(entry.plan, problem_, tables, q, k, v, o, lse, options);
    void* args[] = {&kp};
    launch(function_, static_cast<unsigned>(t.num_items), static_cast<unsigned>(problem_.batch), 1,
           static_cast<unsigned>(source_.threads), static_cast<unsigned>(source_.shared_bytes),
           static_cast<CUstream>(options.stream), args,
           source_.name + " grid=(" + std::to_string(t.num_items) + "," + std::to_string(problem_.batch) +
               ") block=" + std::to_string(source_.threads) + " smem=" + std::to_string(source_.shared_bytes));
  }

  std::string kernel_name() const override { return source_.name; }
  TileConfig tiles() const override { return TileConfig{source_.config.tile_q, source_.config.tile_k}; }
  int alignment() const override { return source_.path == KernelPath::Sm80 ? 16 : dtype_bytes(problem_.dtype); }

private:
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


  Problem problem_;
  int device_;
  Context& context_;
  KernelSource source_;
  std::shared_ptr<const CompiledKernel> kernel_;
  std::shared_ptr<Module> module_;
  CUfunction function_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Pattern& p, const Problem& pb, int device, const std::string& cache_dir,
                                           const KernelConfig& config, const TemplateSet& templates) {
  return std::make_unique<CudaBackend>(p, pb, device, cache_dir, config, templates);
}

}  // namespace attnjit
