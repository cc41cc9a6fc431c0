// The emu device: the kernel a GPU of the chosen arch would run, generated from the same templates,
// compiled for the CPU emulator and launched there. Each forward copies its tensors and the plan
// tables into a private "device memory" image, every buffer in its own region with poisoned gaps,
// so that an access past one tensor is reported as such instead of landing in its neighbour.
#include <cstring>
#include <mutex>

#include "compiler/jit/jit.hpp"
#include "compiler/plan/device_plan.hpp"
#include "compiler/support/error.hpp"
#include "emulator/emu_module.hpp"
#include "runtime/backend.hpp"
#include "runtime/input_checks.hpp"
#include "runtime/kernel_params.hpp"
#include "runtime/cuda/tma_maps.hpp"

namespace attnjit {
namespace {

struct HostTables {
  DevicePlan plan;
  std::vector<int64_t> dyn_rows;
  std::vector<int32_t> dyn_cols;
  int64_t dyn_q_blocks = 0;
  int32_t dyn_heads = 1;
  int64_t dyn_k_blocks = 0;
  int64_t work_items = 0;  // work_item_prefix: the launch of ForwardOptions::rows_with_work_only
};

int64_t extent_bytes(const TensorView& t) {
  int64_t last = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) last += (t.shape[d] - 1) * t.strides[d];
  return (last + 1) * dtype_bytes(t.dtype);
}

// The launch's global memory: regions placed 256-byte aligned (keeping the caller's alignment
// modulo 256), separated by 256 poisoned bytes.
class DeviceImage {
public:
  struct Region {
    std::string name;
    size_t offset, bytes;
    const void* host;
    int elem_bytes;
    bool writable;
  };
  size_t add(std::string name, const void* host, size_t bytes, int elem_bytes, bool writable) {
    size_t at = (end_ + kGap + 255) / 256 * 256 + reinterpret_cast<uintptr_t>(host) % 256;
    regions_.push_back({std::move(name), at, bytes, host, elem_bytes, writable});
    end_ = at + bytes;
    return regions_.size() - 1;
  }
  // A tensor's extent (read-only unless `writable`), and a host table read-only.
  size_t add_tensor(const char* name, const TensorView& view, bool writable) {
    return add(name, view.data, size_t(extent_bytes(view)), dtype_bytes(view.dtype), writable);
  }
  template <typename V>
  size_t add_table(const char* name, const V& vec) {
    using T = typename V::value_type;
    return add(name, vec.data(), vec.size() * sizeof(T), sizeof(T), false);
  }
  // A workspace of `bytes` that starts zeroed (others without host data start poisoned).
  size_t add_zeroed(std::string name, size_t bytes, int elem_bytes) {
    const size_t r = add(std::move(name), nullptr, bytes, elem_bytes, true);
    zeroed_.push_back(r);
    return r;
  }
  void materialise() {
    memory_.assign(end_ + kGap + 256, 0xFF);
    base_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(memory_.data()) + 255) / 256 * 256);
    for (const Region& r : regions_)
      if (r.host && r.bytes) std::memcpy(base_ + r.offset, r.host, r.bytes);
    for (size_t r : zeroed_) std::memset(base_ + regions_[r].offset, 0, regions_[r].bytes);
  }
  void* at(size_t region) { return base_ + regions_[region].offset; }
  void copy_back(size_t region, void* host) { std::memcpy(host, at(region), regions_[region].bytes); }
  std::vector<emu::GlobalBuffer> buffers() {
    std::vector<emu::GlobalBuffer> out;
    for (size_t i = 0; i < regions_.size(); ++i) {
      const Region& r = regions_[i];
      out.push_back({r.name, at(i), r.bytes, r.elem_bytes, r.writable});
    }
    return out;
  }

private:
  static constexpr size_t kGap = 256;
  std::vector<Region> regions_;
  std::vector<size_t> zeroed_;
  size_t end_ = 0;
  std::vector<uint8_t> memory_;
  uint8_t* base_ = nullptr;
};

// A DeviceDynamicLayout's arrays (host memory standing in for the device's) as regions of the
// launch's memory, so the emulator checks every read of them; the problem count goes back.
struct DeviceTableRegions {
  bool present = false;
  size_t rows = 0, cols = 0, errors = 0;
  void rebase(DeviceImage& img, KernelParams& kp) const {
    if (!present) return;
    kp.dyn_row_offsets = static_cast<const int64_t*>(img.at(rows));
    kp.dyn_cols = static_cast<const int32_t*>(img.at(cols));
    kp.dyn_errors = kp.dyn_errors ? static_cast<int32_t*>(img.at(errors)) : nullptr;
  }
  void copy_back(DeviceImage& img, const DeviceDynamicLayout* d) const {
    if (present && d->errors) img.copy_back(errors, d->errors);
  }
};
DeviceTableRegions add_device_table(DeviceImage& img, const DeviceDynamicLayout* d) {
  DeviceTableRegions r;
  if (!d) return r;
  r.present = true;
  r.rows = img.add("device table row_offsets", d->row_offsets, static_cast<size_t>(d->rows + 1) * 8, 8, false);
  r.cols = img.add("device table col_indices", d->col_indices, static_cast<size_t>(d->entries) * 4, 4, false);
  r.errors = img.add("device table errors", d->errors, d->errors ? 4 : 0, 4, true);
  return r;
}

class EmuBackend final : public Backend {
public:
  EmuBackend(const Pattern& p, const Problem& pb, ArchName arch, const std::string& cache_dir, const KernelConfig& config,
             const KernelConfig& backward_config, const TemplateSet& templates, const KernelChoices& choices)
      : pattern_(p), problem_(pb), cache_dir_(cache_dir), persistent_blocks_(choices.persistent_blocks) {
    KernelRequest r = forward_request(problem_request(pb, arch.arch, arch.specific), config, choices);
    source_ = generate_kernel(p, r, templates);
    module_ = emu::load_emu_module(emu::compile_for_emulator(emu::emu_source_of(source_), kernel_cache_for(cache_dir), knobs()));
    if (source_.tma_maps) {  // the cp.async kernel, for calls whose rows no tensor map describes
      r.tma = false;
      fallback_ = generate_kernel(p, r, templates);
    }
    if (pb.dtype == DType::E4M3) return;  // FP8 attention is forward only (check_forward_only)
    r = backward_request(problem_request(pb, arch.arch, arch.specific), backward_config, choices);
    bwd_ = generate_backward_kernels(p, r, templates);  // text only: compiled on the first backward call
    if (bwd_.source.tma_maps) bwd_fallback_ = generate_backward_kernels(p, backward_fallback_request(r, bwd_), templates);
  }

  void upload(PlanEntry& entry, const DynamicLayout* dynamic) override {
    auto t = std::make_shared<HostTables>();
    t->plan = pack_plan(entry.plan);
    t->work_items = work_item_prefix(entry.plan);
    if (dynamic) {
      t->dyn_rows = dynamic->row_offsets;
      t->dyn_cols = dynamic->col_indices;
      t->dyn_heads = static_cast<int32_t>(dynamic->heads);
      t->dyn_q_blocks = (static_cast<int64_t>(dynamic->row_offsets.size()) - 1) / dynamic->heads;
    }
    if (pattern_.has_dynamic_layout()) t->dyn_k_blocks = dynamic_key_blocks(pattern_, entry.plan.shape);
    entry.device_state = t;
  }

  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    check_kernel_seeks(entry.plan, source_);
    check_kernel_weights(entry.plan, source_);
    const auto& t = *static_cast<const HostTables*>(entry.device_state.get());
    // Every item runs; with rows_with_work_only, those that visit a tile, and the other rows keep
    // o's and lse's contents (the image starts with them).
    const int64_t launched = options.rows_with_work_only ? t.work_items : static_cast<int64_t>(t.plan.items.size());
    if (launched == 0) return;
    DeviceImage img;
    const size_t iq = img.add_tensor("q", q, false), ik = img.add_tensor("k", k, false);
    const size_t iv = img.add_tensor("v", v, false), io = img.add_tensor("o", o, true);
    const size_t il = lse ? img.add_tensor("lse", *lse, true) : 0;
    const size_t items = img.add_table("plan items", t.plan.items), spans = img.add_table("plan spans", t.plan.spans);
    const size_t entries = img.add_table("plan entries", t.plan.entries);
    const size_t rows = img.add_table("dynamic row_offsets", t.dyn_rows);
    const size_t cols = img.add_table("dynamic col_indices", t.dyn_cols);
    const size_t docs = img.add_table("document starts", t.plan.doc_base);
    const size_t extra = img.add_table("key weights", t.plan.key_extra);
    const DeviceTableRegions device_table = add_device_table(img, options.device_dynamic_layout);
    const TensorView* descales[3] = {options.q_descale, options.k_descale, options.v_descale};
    size_t descale_at[3] = {};
    for (int n = 0; n < 3; ++n)
      if (descales[n]) descale_at[n] = img.add_tensor(n == 0 ? "q_descale" : n == 1 ? "k_descale" : "v_descale", *descales[n], false);
    img.materialise();

    auto rebased = [&](const TensorView& view, size_t region) {
      TensorView r = view;
      r.data = img.at(region);
      return r;
    };
    const TensorView q_dev = rebased(q, iq), k_dev = rebased(k, ik), v_dev = rebased(v, iv), o_dev = rebased(o, io);
    const TensorView lse_dev = lse ? rebased(*lse, il) : TensorView{};
    const KernelTables tables{static_cast<const DeviceItem*>(img.at(items)), static_cast<const DeviceSpan*>(img.at(spans)),
                              t.plan.entries.empty() ? nullptr : static_cast<const int32_t*>(img.at(entries)),
                              t.dyn_rows.empty() ? nullptr : static_cast<const int64_t*>(img.at(rows)),
                              t.dyn_cols.empty() ? nullptr : static_cast<const int32_t*>(img.at(cols)),
                              static_cast<int32_t>(launched), t.dyn_q_blocks, t.dyn_heads,
                              t.plan.doc_base.empty() ? nullptr : static_cast<const int64_t*>(img.at(docs)),
                              static_cast<int64_t>(t.plan.doc_base.size()), static_cast<int64_t>(t.dyn_cols.size()),
                              t.dyn_k_blocks, t.plan.key_extra.empty() ? nullptr : static_cast<const float*>(img.at(extra))};
    KernelParams kp = kernel_params(entry.plan, problem_, tables, q_dev, k_dev, v_dev, o_dev, lse ? &lse_dev : nullptr, options);
    device_table.rebase(img, kp);
    if (descales[0]) {
      kp.q_descale = static_cast<const float*>(img.at(descale_at[0]));
      kp.k_descale = static_cast<const float*>(img.at(descale_at[1]));
      kp.v_descale = static_cast<const float*>(img.at(descale_at[2]));
    }
    const KernelSource* source = &source_;
    const emu::EmuModule* module = module_.get();
    TmaForwardMaps maps{};
    if (source_.tma_maps) {
      if (const auto specs = forward_tma_map_specs(entry.plan, problem_, q_dev, k_dev, v_dev, source_.o_staged ? &o_dev : nullptr, source_.config.tile_q, source_.config.tile_k)) {
        maps = encode_forward_tma_maps(*specs, true);
      } else {
        std::call_once(fallback_once_, [&] {
          fallback_module_ =
              emu::load_emu_module(emu::compile_for_emulator(emu::emu_source_of(fallback_), kernel_cache_for(cache_dir_), knobs()));
        });
        source = &fallback_, module = fallback_module_.get();
      }
    }
    void* args[] = {&kp, &maps};  // the cp.async kernels take only the first
    emu::LaunchRequest r;
    const LaunchGrid g = item_grid(launched, problem_.batch, source->persistent, persistent_blocks_, kEmuPersistentSms);
    r.grid[0] = g.x, r.grid[1] = g.y, r.grid[2] = g.z;
    r.block_threads = static_cast<unsigned>(source->threads);
    r.dynamic_shared = static_cast<size_t>(source->shared_bytes);
    r.args = args;
    r.buffers = img.buffers();
    module->launch(r);
    img.copy_back(io, o.data);
    if (lse) img.copy_back(il, lse->data);
    device_table.copy_back(img, options.device_dynamic_layout);
  }

  void backward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const ForwardOptions& options, const GradientSink* sink) override {
    const TileConfig tiles{bwd_.source.config.tile_q, bwd_.source.config.tile_k};
    const BackwardPlans& plans = entry.backward_plans(pattern_, planning_table(options), tiles);
    check_kernel_seeks(plans.query_major, bwd_.source);
    const DevicePlan fp = pack_plan(plans.query_major);
    const DeviceBackwardPlan kp = pack_backward_plan(plans.key_major);
    const Problem& pb = problem_;
    DeviceImage img;
    const size_t iq = img.add_tensor("q", q, false), ik = img.add_tensor("k", k, false);
    const size_t iv = img.add_tensor("v", v, false), io = img.add_tensor("o", o, false);
    const size_t il = img.add_tensor("lse", lse, false), ido = img.add_tensor("dout", dout, false);
    const size_t idlse = options.dlse ? img.add_tensor("dlse", *options.dlse, false) : 0;
    const BackwardGrids g = backward_grids(pb, bwd_, sink ? work_item_prefix(plans.query_major) : fp.items.size(),
                                           plans.key_major, options.deterministic, sink != nullptr);
    // The gradients' storage and the fp32 workspaces; with a sink its D and accumulators instead
    // (and no storage-type gradients: the kernels must not write any).
    size_t idq = 0, idk = 0, idv = 0, idelta, idka, idva, idqa;
    if (sink) {
      idelta = img.add_tensor("delta", *sink->delta, false);
      idka = img.add_tensor("dk_acc", *sink->dk, true), idva = img.add_tensor("dv_acc", *sink->dv, true);
      idqa = img.add_tensor("dq_acc", *sink->dq, true);
    } else {
      idq = img.add_tensor("dq", dq, true), idk = img.add_tensor("dk", dk, true), idv = img.add_tensor("dv", dv, true);
      idelta = img.add("D workspace", nullptr, size_t(pb.batch * pb.heads_q * pb.seq_q) * 4, 4, true);
      idka = img.add_zeroed("dK workspace", size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim) * 4, 4);
      idva = img.add_zeroed("dV workspace", size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim_v) * 4, 4);
      idqa = img.add_zeroed("dQ workspace", g.single_pass ? size_t(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim) * 4 : 0, 4);
    }
    const size_t items = img.add_table("plan items", fp.items), spans = img.add_table("plan spans", fp.spans);
    const size_t entries = img.add_table("plan entries", fp.entries);
    const size_t kitems = img.add_table("backward key items", kp.items);
    const size_t qentries = img.add_table("backward query entries", kp.entries);
    const DynamicLayout* dyn = options.dynamic_layout;
    const std::vector<int64_t> no_rows;
    const std::vector<int32_t> no_cols;
    const size_t rows = img.add_table("dynamic row_offsets", dyn ? dyn->row_offsets : no_rows);
    const size_t cols = img.add_table("dynamic col_indices", dyn ? dyn->col_indices : no_cols);
    const size_t docs = img.add_table("document starts", fp.doc_base);
    const DeviceTableRegions device_table = add_device_table(img, options.device_dynamic_layout);
    img.materialise();
    auto rebased = [&](const TensorView& view, size_t region) {
      TensorView r = view;
      r.data = img.at(region);
      return r;
    };
    auto ptr = [&](size_t region, bool present) { return present ? img.at(region) : nullptr; };
    const KernelTables tables{static_cast<const DeviceItem*>(img.at(items)), static_cast<const DeviceSpan*>(img.at(spans)),
                              static_cast<const int32_t*>(ptr(entries, !fp.entries.empty())),
                              static_cast<const int64_t*>(ptr(rows, dyn != nullptr)),
                              static_cast<const int32_t*>(ptr(cols, dyn != nullptr)), static_cast<int32_t>(fp.items.size()),
                              dyn ? (static_cast<int64_t>(dyn->row_offsets.size()) - 1) / dyn->heads : 0,
                              dyn ? static_cast<int32_t>(dyn->heads) : 1,
                              static_cast<const int64_t*>(ptr(docs, !fp.doc_base.empty())), static_cast<int64_t>(fp.doc_base.size()),
                              dyn ? static_cast<int64_t>(dyn->col_indices.size()) : 0,
                              pattern_.has_dynamic_layout() ? dynamic_key_blocks(pattern_, plans.query_major.shape) : 0};
    const BackwardTables bt{static_cast<const DeviceKeyItem*>(img.at(kitems)), static_cast<const DeviceQueryEntry*>(img.at(qentries)),
                            static_cast<int32_t>(kp.items.size()), static_cast<float*>(img.at(idelta)),
                            static_cast<float*>(img.at(idka)), static_cast<float*>(img.at(idva)),
                            g.single_pass ? static_cast<float*>(img.at(idqa)) : nullptr};
    auto out = [&](const TensorView& view, size_t region) { return sink ? view : rebased(view, region); };
    KernelBwdParams bp = backward_params(plans.query_major, pb, tables, bt, rebased(q, iq), rebased(k, ik), rebased(v, iv),
                                         rebased(o, io), rebased(lse, il), rebased(dout, ido), out(dq, idq),
                                         out(dk, idk), out(dv, idv), options);
    if (sink) bp.dq = bp.dk = bp.dv = nullptr;
    if (options.dlse) bp.dlse = static_cast<const float*>(img.at(idlse));
    device_table.rebase(img, bp.fwd);
    bp.fwd.dyn_errors = nullptr;  // the forward counted its problems
    // The TMA kernel's maps of Q and dO; where no map describes the query rows, the fallback kernels
    // (the same tiles, so the same plans).
    const BackwardKernels* kernels = &bwd_;
    TmaMaps maps{};
    if (bwd_.source.tma_maps) {
      if (const auto specs = backward_tma_map_specs(plans.key_major, pb, rebased(q, iq), rebased(dout, ido), tiles.tile_q))
        maps = encode_tma_maps(*specs, true);
      else
        kernels = &bwd_fallback_;
    }
    const BackwardKernels& kk = *kernels;
    const emu::EmuModule& module = backward_module(kernels == &bwd_ ? 0 : 1, kk);
    void* args[] = {&bp, &maps};  // only the TMA kernel's _dkdv takes the second
    auto launch_at = [&](const std::string& kernel, const LaunchGrid& grid, int threads, int shared_bytes) {
      emu::LaunchRequest r;
      r.kernel = kernel;
      r.grid[0] = grid.x;
      r.grid[1] = grid.y;
      r.grid[2] = grid.z;
      r.block_threads = static_cast<unsigned>(threads);
      r.dynamic_shared = static_cast<size_t>(shared_bytes);
      r.args = args;
      r.buffers = img.buffers();
      module.launch(r);
    };
    auto launch = [&](const std::string& kernel, uint64_t grid_x, int64_t batch, int threads, int shared_bytes) {
      if (grid_x != 0) launch_at(kernel, item_grid(static_cast<int64_t>(grid_x), batch, false, 0, 0), threads, shared_bytes);
    };
    launch(kk.pre, g.pre, pb.batch, kk.aux_threads, 0);
    if (sink && !g.single_pass) bp.dq_acc = static_cast<float*>(img.at(idqa));  // _dq adds into it
    launch(kk.dq, g.dq, pb.batch, kk.dq_threads, kk.dq_shared_bytes);
    bp.dq_acc = bt.dq_acc;
    for (const DkdvLaunch& d : g.dkdv) {
      if (d.blocks == 0) continue;
      bp.key_item_base = d.key_item_base, bp.plain_add = d.plain_add, bp.key_item_count = static_cast<int32_t>(d.blocks);
      launch_at(kk.dkdv, item_grid(static_cast<int64_t>(d.blocks), pb.batch, kk.source.persistent, persistent_blocks_, kEmuPersistentSms),
                kk.dkdv_threads, kk.dkdv_shared_bytes);
    }
    bp.plain_add = g.direct_dkdv ? 2 : 0;  // _cvt: with dK, dV stored, dQ alone
    launch(kk.cvt, g.cvt, 1, kk.aux_threads, 0);  // covers every batch itself
    if (sink) {
      img.copy_back(idqa, sink->dq->data);
      img.copy_back(idka, sink->dk->data);
      img.copy_back(idva, sink->dv->data);
      return;
    }
    img.copy_back(idq, dq.data);
    img.copy_back(idk, dk.data);
    img.copy_back(idv, dv.data);
  }

  std::string kernel_name() const override { return source_.name + " (emulated " + source_.arch + ")"; }
  TileConfig tiles() const override { return TileConfig{source_.config.tile_q, source_.config.tile_k}; }
  int alignment() const override { return source_.path != KernelPath::Simt ? 16 : dtype_bytes(problem_.dtype); }
  bool reads_device_tables() const override { return true; }
  bool reads_key_weights() const override { return true; }

private:
  Pattern pattern_;
  Problem problem_;
  std::string cache_dir_;
  int persistent_blocks_ = 0;  // KernelChoices::persistent_blocks
  KernelSource source_;
  KernelSource fallback_;  // with a TMA kernel: the cp.async kernel, compiled on first need
  std::once_flag fallback_once_;
  std::shared_ptr<const emu::EmuModule> fallback_module_;
  std::shared_ptr<const emu::EmuModule> module_;
  // The backward kernels, compiled on their first call (index 0), and with a TMA backward the
  // kernels for calls whose query rows no tensor map describes (index 1).
  const emu::EmuModule& backward_module(int index, const BackwardKernels& k) {
    std::call_once(bwd_once_[index], [&] {
      emu::EmuSource s = emu::emu_source_of(k.source);
      s.kernels = {k.pre, k.dq, k.dkdv, k.cvt};
      bwd_module_[index] = emu::load_emu_module(emu::compile_for_emulator(s, kernel_cache_for(cache_dir_), knobs()));
    });
    return *bwd_module_[index];
  }

  BackwardKernels bwd_, bwd_fallback_;
  std::once_flag bwd_once_[2];
  std::shared_ptr<const emu::EmuModule> bwd_module_[2];
};

// A paged call's tensors, block table, scales and counter as regions of a launch image: the
// argument block over them (with the tables' workspace `t`, already in the image), and the
// outputs copied back.
struct CallRegions {
  size_t q, k, v, o, lse, table, k_scale, v_scale, errors, kv_lens, cu_seqlens_q;
  CallRegions(DeviceImage& img, const PagedCall& c, int64_t heads_kv, const DevicePlanning* d)
      : q(img.add_tensor("q", c.q, false)), k(img.add_tensor("k_cache", c.k_cache, false)),
        v(img.add_tensor("v_cache", c.v_cache, false)), o(img.add_tensor("o", c.o, true)),
        lse(c.lse ? img.add_tensor("lse", *c.lse, true) : 0),
        table(img.add("block_table", c.block_table, size_t(requests(c) * c.block_table_stride) * 4, 4, false)),
        k_scale(img.add("k_scale", c.k_scale, c.k_scale ? size_t(heads_kv) * 4 : 0, 4, false)),
        v_scale(img.add("v_scale", c.v_scale, c.v_scale ? size_t(heads_kv) * 4 : 0, 4, false)),
        errors(img.add("errors", c.errors, c.errors ? 4 : 0, 4, true)),
        kv_lens(img.add("device_kv_lens", d ? d->kv_lens : nullptr, d ? size_t(d->requests) * 4 : 0, 4, false)),
        cu_seqlens_q(img.add("device_cu_seqlens_q", d ? d->cu_seqlens_q : nullptr,
                             d && d->cu_seqlens_q ? size_t(d->requests + 1) * 4 : 0, 4, false)) {}
  static int64_t requests(const PagedCall& c) {
    return c.device_kv_lens ? c.requests : static_cast<int64_t>(c.kv_lens.size());
  }
  // The planner's lengths at their image addresses.
  DevicePlanning planning(DeviceImage& img, const DevicePlanning& d) const {
    DevicePlanning out = d;
    out.kv_lens = static_cast<const int32_t*>(img.at(kv_lens));
    out.cu_seqlens_q = d.cu_seqlens_q ? static_cast<const int32_t*>(img.at(cu_seqlens_q)) : nullptr;
    return out;
  }
  AjPagedParams params(DeviceImage& img, const PagedCall& c, const PagedProblem& pb, double softmax_scale, double output_scale,
                       const PagedTables& t) const {
    auto rebased = [&](const TensorView& view, size_t region) {
      TensorView r = view;
      r.data = img.at(region);
      return r;
    };
    const TensorView lse_view = c.lse ? rebased(*c.lse, lse) : TensorView{};
    return paged_params(softmax_scale, output_scale, pb, t, rebased(c.q, q), rebased(c.k_cache, k), rebased(c.v_cache, v),
                        rebased(c.o, o), c.lse ? &lse_view : nullptr, static_cast<const int32_t*>(img.at(table)),
                        c.block_table_stride, c.k_scale ? static_cast<const float*>(img.at(k_scale)) : nullptr,
                        c.v_scale ? static_cast<const float*>(img.at(v_scale)) : nullptr,
                        c.errors ? static_cast<int32_t*>(img.at(errors)) : nullptr);
  }
  void copy_back(DeviceImage& img, const PagedCall& c) const {
    img.copy_back(o, c.o.data);
    if (c.lse) img.copy_back(lse, c.lse->data);
    if (c.errors) img.copy_back(errors, c.errors);
  }
};

// The paged forward, emulated: every call's tensors, block table and packed plan copied into a
// launch image (as the forward's), the kernels run, O and the LSE copied back.
class EmuPaged final : public PagedBackend {
public:
  EmuPaged(const Pattern& p, const PagedProblem& pb, ArchName arch, const std::string& cache_dir, const KernelConfig& config,
           const TemplateSet& templates)
      : problem_(pb) {
    KernelRequest r = paged_request(pb, arch.arch, config);
    r.arch_specific = arch.specific;
    kernels_ = generate_paged_kernels(p, r, PagedHeads{pb.heads_q, pb.heads_kv}, templates);
    emu::EmuSource s = emu::emu_source_of(kernels_.source);
    s.kernels = {kernels_.forward, kernels_.merge, kernels_.plan};
    module_ = emu::load_emu_module(emu::compile_for_emulator(s, kernel_cache_for(cache_dir), knobs()));
  }

  // An eager call: a workspace of its own plan's size, in host memory, run as a graph's would be.
  void forward(const PagedPlan& plan, const PagedCall& c, int32_t splits) override {
    if (plan.tables.items.empty()) return;
    const PagedCapacity cap = paged_capacity_of(plan, splits);
    const PagedWorkspace w = paged_workspace(cap, tiles().tile_q, problem_.head_dim_v);
    std::vector<uint8_t> workspace = pack_paged_workspace(plan, splits, cap, w);
    workspace.resize(w.total);  // the partial buffers after the tables
    run_workspace(c, workspace.data(), w, cap, plan.tables.softmax_scale, plan.tables.output_scale, nullptr);
  }
  void forward_planned(const PagedCall& c, const PagedCapacity& cap, double softmax_scale, double output_scale,
                       const DevicePlanning& planning) override {
    if (cap.items == 0) return;
    const PagedWorkspace w = paged_workspace(cap, tiles().tile_q, problem_.head_dim_v);
    std::vector<uint8_t> workspace(w.total, 0);
    run_workspace(c, workspace.data(), w, cap, softmax_scale, output_scale, &planning);
  }
  // Host memory stands in for the device's: the bytes are copied now.
  void write_workspace(void* workspace, const std::vector<uint8_t>& bytes, const PagedCall&) override {
    std::memcpy(workspace, bytes.data(), bytes.size());
  }

  // The kernels over a workspace, one region of the image: the grid the capacity's (the header says
  // how much of it the step's plan uses).
  void run_workspace(const PagedCall& c, void* workspace, const PagedWorkspace& w, const PagedCapacity& cap,
                     double softmax_scale, double output_scale, const DevicePlanning* planning) override {
    DeviceImage img;
    const CallRegions call(img, c, problem_.heads_kv, planning);
    const size_t iws = img.add("paged workspace", workspace, w.total, 4, true);
    img.materialise();
    AjPagedParams pp = call.params(img, c, problem_, softmax_scale, output_scale, paged_workspace_tables(img.at(iws), w));
    if (planning) {
      set_device_planning(pp, call.planning(img, *planning), cap, c.q.shape[0]);
      launch(img, pp, kernels_.plan, 1, 1);
    }
    launch(img, pp, kernels_.forward, unsigned(cap.items), unsigned(cap.splits));
    if (cap.splits > 1) launch(img, pp, kernels_.merge, unsigned(cap.items), 1);
    call.copy_back(img, c);
    img.copy_back(iws, workspace);  // what the kernels wrote there (the planner's tables), as on a GPU
  }

  TileConfig tiles() const override { return TileConfig{kernels_.source.config.tile_q, kernels_.source.config.tile_k}; }
  // An H100's 132 SMs, two blocks each: splits as a GPU would take them.
  int64_t target_blocks() const override { return 264; }
  std::string kernel_name() const override { return kernels_.source.name + " (emulated " + kernels_.source.arch + ")"; }

private:
  void launch(DeviceImage& img, AjPagedParams& pp, const std::string& kernel, unsigned gx, unsigned gy) {
    void* args[] = {&pp};
    emu::LaunchRequest r;
    r.kernel = kernel;
    r.grid[0] = gx;
    r.grid[1] = gy;
    r.grid[2] = 1;
    r.block_threads = static_cast<unsigned>(kernels_.threads);
    r.dynamic_shared = 0;
    r.args = args;
    r.buffers = img.buffers();
    module_->launch(r);
  }

  PagedProblem problem_;
  PagedKernels kernels_;
  std::shared_ptr<const emu::EmuModule> module_;
};

}  // namespace

std::unique_ptr<Backend> make_emu_backend(const Pattern& p, const Problem& pb, ArchName arch, const std::string& cache_dir,
                                          const KernelConfig& config, const KernelConfig& backward_config,
                                          const TemplateSet& templates, const KernelChoices& choices) {
  return std::make_unique<EmuBackend>(p, pb, arch, cache_dir, config, backward_config, templates, choices);
}

std::unique_ptr<PagedBackend> make_emu_paged(const Pattern& p, const PagedProblem& pb, ArchName arch, const std::string& cache_dir,
                                             const KernelConfig& config, const TemplateSet& templates) {
  return std::make_unique<EmuPaged>(p, pb, arch, cache_dir, config, templates);
}

}  // namespace attnjit
