// The Python extension (attnjit._attnjit): the runtime behind the Python package, on raw tensor
// descriptions (address, shape, strides in elements) so that no PyTorch header is needed to
// build it; python/attnjit/ turns torch tensors and numpy arrays into these and back.
//
// Prepared attentions are kept per (spec text, device, problem), so a training loop that calls
// attention() every step plans and compiles once. The GIL is released while kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>

#include "attnjit/attnjit.hpp"
#include "compiler/driver/precompile.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/driver/dump.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/nvrtc/nvrtc_library.hpp"
#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/head_slice.hpp"
#include "compiler/pattern/pattern.hpp"
#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/tune/tuning_db.hpp"
#include "runtime/cuda/cuda_probe.hpp"
#include "runtime/input_checks.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "attnjit/reference.hpp"

namespace nb = nanobind;
using namespace attnjit;

namespace {

// A spec the user gave that does not parse or validate (Python: attnjit.PatternError).
struct SpecError : UserError {
  using UserError::UserError;
};

// A tensor as Python describes it: address, shape, strides in elements.
using Tensor = std::tuple<uintptr_t, std::vector<int64_t>, std::vector<int64_t>>;

TensorView view(const Tensor& t, DType dt) {
  TensorView v;
  v.data = reinterpret_cast<void*>(std::get<0>(t));
  v.dtype = dt;
  v.shape = std::get<1>(t);
  v.strides = std::get<2>(t);
  return v;
}

// Patterns by spec text: parsed once.
Pattern pattern_of(const std::string& spec) {
  static std::mutex mu;
  static std::map<std::string, Pattern> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(spec); it != cache.end()) return it->second;
  Pattern p;
  try {
    p = parse_spec(spec, "pattern");
  } catch (const UserError& e) {
    throw SpecError(e.where(), e.message());
  }
  return cache.emplace(spec, p).first->second;
}

Device device_of(const std::string& kind, int index) {
  if (kind == "cpu") return Device::cpu();
  if (kind == "cuda") return Device::cuda(index);
  if (kind == "emu") return Device::emu(index > 0 ? index : 80);
  if (kind.rfind("emu:", 0) == 0) {  // "emu:sm_90a": the emulator standing in for that arch
    const ArchName a = parse_arch_name(kind.substr(4), "ATTNJIT_CPU_DEVICE=" + kind + ":");
    if (!is_gpu_arch(a.arch))
      throw UserError("ATTNJIT_CPU_DEVICE=" + kind, "no GPU has this arch, so the emulator cannot model it; use one of " + gpu_arch_list());
    return Device::emu(a.arch, a.specific);
  }
  throw UserError("device", "expected cpu, cuda, emu or emu:sm_XX, got " + kind);
}

// Prepared attentions: one Runtime per device, whose cache (Runtime::prepared) keeps one Attention
// per pattern and problem.
Attention prepared(const std::string& spec, const Device& device, const Problem& pb) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Runtime>> runtimes;
  Runtime* rt = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = runtimes[device.describe()];
    if (!slot) {
      RuntimeOptions o;
      o.device = device;
      slot = std::make_unique<Runtime>(o);
    }
    rt = slot.get();
  }
  return rt->prepared(pattern_of(spec), pb);
}

Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, DType dt) {
  const auto& qs = std::get<1>(q);
  const auto& ks = std::get<1>(k);
  const auto& vs = std::get<1>(v);
  if (qs.size() != 4 || ks.size() != 4 || vs.size() != 4) throw UserError("q, k, v", "expected [B, S, H, D] tensors");
  return Problem{qs[0], qs[1], ks[1], qs[2], ks[2], qs[3], vs[3], dt, {}};
}

std::optional<DynamicLayout> dynamic_of(const std::optional<std::tuple<int64_t, std::vector<int64_t>, std::vector<int32_t>>>& d) {
  if (!d) return std::nullopt;
  DynamicLayout l;
  l.heads = std::get<0>(*d);
  l.row_offsets = std::get<1>(*d);
  l.col_indices = std::get<2>(*d);
  return l;
}

using DynamicArg = std::optional<std::tuple<int64_t, std::vector<int64_t>, std::vector<int32_t>>>;
// cu_seqlens of packed documents, or None.
using DocumentsArg = std::optional<std::vector<int64_t>>;
const std::vector<int64_t>* documents_of(const DocumentsArg& d) { return d ? &*d : nullptr; }

// A dynamic table where the device reads it, as addresses: (row_offsets int64, col_indices int32,
// rows, entries, heads, errors int32 counter or 0); or None.
using DeviceDynamicArg = std::optional<std::tuple<uintptr_t, uintptr_t, int64_t, int64_t, int64_t, uintptr_t>>;
std::optional<DeviceDynamicLayout> device_dynamic_of(const DeviceDynamicArg& d) {
  if (!d) return std::nullopt;
  DeviceDynamicLayout l;
  l.row_offsets = reinterpret_cast<const int64_t*>(std::get<0>(*d));
  l.col_indices = reinterpret_cast<const int32_t*>(std::get<1>(*d));
  l.rows = std::get<2>(*d), l.entries = std::get<3>(*d), l.heads = std::get<4>(*d);
  l.errors = reinterpret_cast<int32_t*>(std::get<5>(*d));
  return l;
}

// The options of one call; they point into `dyn`, `device_dyn` and `documents`, which must outlive them.
ForwardOptions options_of(int64_t q_offset, int64_t k_offset, uintptr_t stream, const std::optional<DynamicLayout>& dyn,
                          const DocumentsArg& documents, const std::optional<DeviceDynamicLayout>& device_dyn = std::nullopt) {
  ForwardOptions fo;
  fo.q_offset = q_offset, fo.k_offset = k_offset, fo.stream = reinterpret_cast<void*>(stream);
  fo.dynamic_layout = dyn ? &*dyn : nullptr;
  fo.device_dynamic_layout = device_dyn ? &*device_dyn : nullptr;
  fo.cu_seqlens = documents_of(documents);
  return fo;
}

// A table in host memory (int64 row offsets, int32 entries) with what the kernels drop dropped, for
// the pattern and call: (row_offsets, col_indices, problems), as mask.hpp's sanitize_dynamic_table.
std::tuple<std::vector<int64_t>, std::vector<int32_t>, int64_t> sanitize_dynamic(
    const std::string& spec, const std::vector<int64_t>& dims, int64_t q_offset, int64_t k_offset, uintptr_t row_offsets,
    uintptr_t col_indices, int64_t rows, int64_t entries) {
  Shape s;
  s.batch = dims[0], s.seq_q = dims[1], s.seq_k = dims[2], s.heads_q = dims[3], s.heads_kv = dims[4];
  s.q_offset = q_offset, s.k_offset = k_offset;
  if (rows < 0 || entries < 0 || !row_offsets || (entries > 0 && !col_indices)) {
    throw UserError("dynamic_layout", "needs row_offsets (rows + 1 entries) and col_indices");
  }
  DynamicLayout out;
  const int64_t problems = sanitize_dynamic_table(reinterpret_cast<const int64_t*>(row_offsets), rows,
                                                  reinterpret_cast<const int32_t*>(col_indices), entries,
                                                  dynamic_key_blocks(pattern_of(spec), s), out);
  return {std::move(out.row_offsets), std::move(out.col_indices), problems};
}

void forward(const std::string& spec, const std::string& device, int index, const std::string& dtype, const Tensor& q,
             const Tensor& k, const Tensor& v, const Tensor& o, const std::optional<Tensor>& lse, int64_t q_offset,
             int64_t k_offset, uintptr_t stream, const DynamicArg& dynamic, const DocumentsArg& documents,
             const DeviceDynamicArg& device_dynamic, bool rows_with_work_only) {
  const DType dt = parse_dtype(dtype);
  const Problem pb = problem_of(q, k, v, dt);
  const std::optional<DynamicLayout> dyn = dynamic_of(dynamic);
  const std::optional<DeviceDynamicLayout> device_dyn = device_dynamic_of(device_dynamic);
  Attention op = prepared(spec, device_of(device, index), pb);
  ForwardOptions fo = options_of(q_offset, k_offset, stream, dyn, documents, device_dyn);
  fo.rows_with_work_only = rows_with_work_only;
  const TensorView lv = lse ? view(*lse, DType::F32) : TensorView{};
  nb::gil_scoped_release release;
  op.forward(view(q, dt), view(k, dt), view(v, dt), view(o, dt), lse ? &lv : nullptr, fo);
}

// FP8 inputs: q, k, v of e4m3 codes, each with its descale factors (fp32 [B, Hkv] views; strides
// 0 broadcast one factor), O in `out_dtype` (bf16 or fp16). Forward only.
void forward_fp8(const std::string& spec, const std::string& device, int index, const std::string& out_dtype,
                 const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const std::optional<Tensor>& lse,
                 int64_t q_offset, int64_t k_offset, uintptr_t stream, const DynamicArg& dynamic,
                 const DocumentsArg& documents, const Tensor& q_descale, const Tensor& k_descale, const Tensor& v_descale) {
  Problem pb = problem_of(q, k, v, DType::E4M3);
  pb.out_dtype = parse_dtype(out_dtype);
  const std::optional<DynamicLayout> dyn = dynamic_of(dynamic);
  Attention op = prepared(spec, device_of(device, index), pb);
  ForwardOptions fo = options_of(q_offset, k_offset, stream, dyn, documents);
  const TensorView qd = view(q_descale, DType::F32), kd = view(k_descale, DType::F32), vd = view(v_descale, DType::F32);
  fo.q_descale = &qd, fo.k_descale = &kd, fo.v_descale = &vd;
  const TensorView lv = lse ? view(*lse, DType::F32) : TensorView{};
  nb::gil_scoped_release release;
  op.forward(view(q, DType::E4M3), view(k, DType::E4M3), view(v, DType::E4M3), view(o, pb.o_dtype()), lse ? &lv : nullptr, fo);
}

void backward(const std::string& spec, const std::string& device, int index, const std::string& dtype, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq,
              const Tensor& dk, const Tensor& dv, int64_t q_offset, int64_t k_offset, uintptr_t stream,
              bool deterministic, const DynamicArg& dynamic, uintptr_t workspace, size_t workspace_bytes,
              const DocumentsArg& documents, const DeviceDynamicArg& device_dynamic, const std::optional<Tensor>& dlse) {
  const DType dt = parse_dtype(dtype);
  const Problem pb = problem_of(q, k, v, dt);
  const std::optional<DynamicLayout> dyn = dynamic_of(dynamic);
  const std::optional<DeviceDynamicLayout> device_dyn = device_dynamic_of(device_dynamic);
  Attention op = prepared(spec, device_of(device, index), pb);
  ForwardOptions fo = options_of(q_offset, k_offset, stream, dyn, documents, device_dyn);
  fo.deterministic = deterministic;
  const std::optional<TensorView> dlse_view = dlse ? std::optional<TensorView>(view(*dlse, DType::F32)) : std::nullopt;
  fo.dlse = dlse_view ? &*dlse_view : nullptr;
  fo.workspace = reinterpret_cast<void*>(workspace), fo.workspace_bytes = workspace_bytes;
  nb::gil_scoped_release release;
  op.backward(view(q, dt), view(k, dt), view(v, dt), view(o, dt), view(lse, DType::F32), view(dout, dt), view(dq, dt),
              view(dk, dt), view(dv, dt), fo);
}

// Attention::backward_add: the gradients added into fp32 accumulators (one step of
// attnjit.distributed's backward), D given.
void backward_add(const std::string& spec, const std::string& device, int index, const std::string& dtype, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& lse, const Tensor& dout, const Tensor& delta,
                  const Tensor& dq_acc, const Tensor& dk_acc, const Tensor& dv_acc, int64_t q_offset, int64_t k_offset,
                  uintptr_t stream, bool deterministic) {
  const DType dt = parse_dtype(dtype);
  const Problem pb = problem_of(q, k, v, dt);
  Attention op = prepared(spec, device_of(device, index), pb);
  ForwardOptions fo = options_of(q_offset, k_offset, stream, std::nullopt, DocumentsArg{}, std::nullopt);
  fo.deterministic = deterministic;
  nb::gil_scoped_release release;
  op.backward_add(view(q, dt), view(k, dt), view(v, dt), view(lse, DType::F32), view(dout, dt), view(delta, DType::F32),
                  view(dq_acc, DType::F32), view(dk_acc, DType::F32), view(dv_acc, DType::F32), fo);
}

// The paged forward (attnjit.serving): one PagedAttention per device, pattern and problem. `action`:
// "forward"; "needs" (returns the call's PagedCapacity: requests, items, spans, entries, splits);
// "workspace_bytes" (of `capacity`); "plan" and "run" over `workspace` with `capacity` (CUDA graphs).
std::vector<int64_t> paged(const std::string& action, const std::string& spec, const std::string& device, int index,
                           const std::string& dtype, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           uintptr_t block_table, int64_t block_table_stride, const std::vector<int64_t>& kv_lens,
                           const std::vector<int64_t>& cu_seqlens_q, const Tensor& o, const std::optional<Tensor>& lse,
                           int32_t splits, uintptr_t stream, const std::string& kv_dtype, uintptr_t k_scale, uintptr_t v_scale,
                           uintptr_t workspace, const std::vector<int64_t>& capacity, uintptr_t errors,
                           const std::vector<uint64_t>& device_lengths) {
  const DType dt = parse_dtype(dtype), kv = parse_dtype(kv_dtype);
  const auto& qs = std::get<1>(q);
  const auto& ks = std::get<1>(k_cache);
  const auto& vs = std::get<1>(v_cache);
  if (qs.size() != 3 || ks.size() != 4 || vs.size() != 4) throw UserError("q, k_cache, v_cache", "expected [total_q, Hq, D] and [pages, page_size, Hkv, D]");
  const PagedProblem pb{qs[1], ks[2], qs[2], vs[3], dt, kv};
  const Device dev = device_of(device, index);
  PagedAttention op;
  {
    static std::mutex mu;
    static std::map<std::string, std::pair<std::unique_ptr<Runtime>, std::map<std::string, PagedAttention>>> runtimes;
    std::lock_guard<std::mutex> lock(mu);
    auto& [rt, prepared] = runtimes[dev.describe()];
    if (!rt) {
      RuntimeOptions ro;
      ro.device = dev;
      rt = std::make_unique<Runtime>(ro);
    }
    const std::string key = spec + "|" + std::to_string(pb.heads_q) + "," + std::to_string(pb.heads_kv) + "," +
                            std::to_string(pb.head_dim) + "," + std::to_string(pb.head_dim_v) + "," + dtype + "," + kv_dtype;
    auto it = prepared.find(key);
    if (it == prepared.end()) it = prepared.emplace(key, rt->prepare_paged(pattern_of(spec), pb)).first;
    op = it->second;
  }
  PagedCall c;
  c.q = view(q, dt), c.k_cache = view(k_cache, kv), c.v_cache = view(v_cache, kv), c.o = view(o, dt);
  c.k_scale = reinterpret_cast<const float*>(k_scale);
  c.v_scale = reinterpret_cast<const float*>(v_scale);
  c.errors = reinterpret_cast<int32_t*>(errors);
  const TensorView lv = lse ? view(*lse, DType::F32) : TensorView{};
  c.lse = lse ? &lv : nullptr;
  c.block_table = reinterpret_cast<const int32_t*>(block_table);
  c.block_table_stride = block_table_stride;
  c.kv_lens = kv_lens;
  c.cu_seqlens_q = cu_seqlens_q;
  if (device_lengths.size() == 3) {  // (kv_lens, cu_seqlens_q or 0, requests): int32 arrays on the call's device
    c.device_kv_lens = reinterpret_cast<const int32_t*>(static_cast<uintptr_t>(device_lengths[0]));
    c.device_cu_seqlens_q = reinterpret_cast<const int32_t*>(static_cast<uintptr_t>(device_lengths[1]));
    c.requests = static_cast<int64_t>(device_lengths[2]);
  }
  c.splits = splits;
  c.stream = reinterpret_cast<void*>(stream);
  PagedCapacity cap;
  if (capacity.size() == 5) {
    cap.requests = capacity[0], cap.items = capacity[1], cap.spans = capacity[2], cap.entries = capacity[3];
    cap.splits = static_cast<int32_t>(capacity[4]);
  }
  void* ws = reinterpret_cast<void*>(workspace);
  nb::gil_scoped_release release;
  if (action == "forward") op.forward(c);
  else if (action == "plan") op.plan(c, ws, cap);
  else if (action == "run") op.run(c, ws, cap);
  else if (action == "workspace_bytes") return {static_cast<int64_t>(op.workspace_bytes(cap))};
  else if (action == "needs") {
    const PagedCapacity n = op.needs(c);  // and the workspace bytes it takes, saving a call per step
    return {n.requests, n.items, n.spans, n.entries, n.splits, static_cast<int64_t>(op.workspace_bytes(n))};
  } else {
    throw UserError("action", "expected forward, needs, workspace_bytes, plan or run, got " + action);
  }
  return {};
}

// The attention weights into w (float32 contiguous [B, Hq, Sq, Sk]) from q, k and the forward's lse.
void attention_weights(const std::string& spec, const std::string& device, int index, const std::string& dtype, const Tensor& q,
             const Tensor& k, const Tensor& v, const Tensor& lse, const Tensor& w, int64_t q_offset, int64_t k_offset,
             uintptr_t stream, const DynamicArg& dynamic, const DocumentsArg& documents) {
  const DType dt = parse_dtype(dtype);
  const Problem pb = problem_of(q, k, v, dt);
  const std::optional<DynamicLayout> dyn = dynamic_of(dynamic);
  Attention op = prepared(spec, device_of(device, index), pb);
  ForwardOptions fo = options_of(q_offset, k_offset, stream, dyn, documents);
  nb::gil_scoped_release release;
  op.weights(view(q, dt), view(k, dt), view(lse, DType::F32), view(w, DType::F32), fo);
}

// The scratch bytes backward() needs on this device (0 on the CPU): Python allocates them from
// PyTorch's caching allocator and passes them as `workspace`.
size_t backward_workspace_bytes(const std::string& spec, const std::string& device, int index, const std::string& dtype,
                                const Tensor& q, const Tensor& k, const Tensor& v) {
  return prepared(spec, device_of(device, index), problem_of(q, k, v, parse_dtype(dtype))).backward_workspace_bytes();
}

Shape shape_of(int64_t batch, int64_t seq_q, int64_t seq_k, int64_t heads_q, int64_t heads_kv, int64_t d, int64_t dv,
               int64_t q_offset, int64_t k_offset) {
  Shape s;
  s.batch = batch, s.seq_q = seq_q, s.seq_k = seq_k, s.heads_q = heads_q, s.heads_kv = heads_kv;
  s.head_dim = d, s.head_dim_v = dv, s.q_offset = q_offset, s.k_offset = k_offset;
  return s;
}

template <class T>
nb::ndarray<nb::numpy, T> numpy_of(std::vector<T>&& data, std::vector<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(data));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.data(), owner);
}

// The float64 reference on contiguous float64 inputs: (o, lse) as numpy arrays.
std::tuple<nb::ndarray<nb::numpy, double>, nb::ndarray<nb::numpy, double>> reference_forward(
    const std::string& spec, uintptr_t q, uintptr_t k, uintptr_t v, const std::vector<int64_t>& dims, int64_t q_offset,
    int64_t k_offset, const DynamicArg& dynamic, const DocumentsArg& documents) {
  const Shape s = shape_of(dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], q_offset, k_offset);
  const Pattern p = pattern_of(spec);
  const std::optional<DynamicLayout> dyn = dynamic_of(dynamic);
  ReferenceOutput r;
  {
    nb::gil_scoped_release release;
    r = reference_attention(p, s, reinterpret_cast<const double*>(q), reinterpret_cast<const double*>(k),
                            reinterpret_cast<const double*>(v), dyn ? &*dyn : nullptr, 0,
                            documents_of(documents));
  }
  const auto u = [](int64_t x) { return static_cast<size_t>(x); };
  return {numpy_of(std::move(r.o), {u(s.batch), u(s.seq_q), u(s.heads_q), u(s.head_dim_v)}),
          numpy_of(std::move(r.lse), {u(s.batch), u(s.heads_q), u(s.seq_q)})};
}

// The float64 reference's attention weights [B, Hq, Sq, Sk] on contiguous float64 q and k.
nb::ndarray<nb::numpy, double> reference_attention_weights(const std::string& spec, uintptr_t q, uintptr_t k, const std::vector<int64_t>& dims,
                                                 int64_t q_offset, int64_t k_offset, const DynamicArg& dynamic,
                                                 const DocumentsArg& documents) {
  const Shape s = shape_of(dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], q_offset, k_offset);
  check_weights_size(s.batch, s.heads_q, s.seq_q, s.seq_k);
  const Pattern p = pattern_of(spec);
  const std::optional<DynamicLayout> dyn = dynamic_of(dynamic);
  std::vector<double> w;
  {
    nb::gil_scoped_release release;
    w = reference_weights(p, s, reinterpret_cast<const double*>(q), reinterpret_cast<const double*>(k), dyn ? &*dyn : nullptr, 0,
                          documents_of(documents));
  }
  const auto u = [](int64_t x) { return static_cast<size_t>(x); };
  return numpy_of(std::move(w), {u(s.batch), u(s.heads_q), u(s.seq_q), u(s.seq_k)});
}

std::tuple<nb::ndarray<nb::numpy, double>, nb::ndarray<nb::numpy, double>, nb::ndarray<nb::numpy, double>> reference_backward(
    const std::string& spec, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t dout, const std::vector<int64_t>& dims,
    int64_t q_offset, int64_t k_offset, const DynamicArg& dynamic,
                                                 const DocumentsArg& documents, uintptr_t dlse) {
  const Shape s = shape_of(dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], q_offset, k_offset);
  const Pattern p = pattern_of(spec);
  const std::optional<DynamicLayout> dyn = dynamic_of(dynamic);
  ReferenceGradients g;
  {
    nb::gil_scoped_release release;
    g = reference_attention_backward(p, s, reinterpret_cast<const double*>(q), reinterpret_cast<const double*>(k),
                                     reinterpret_cast<const double*>(v), reinterpret_cast<const double*>(dout),
                                     dyn ? &*dyn : nullptr, 0, documents_of(documents), reinterpret_cast<const double*>(dlse));
  }
  const auto u = [](int64_t x) { return static_cast<size_t>(x); };
  return {numpy_of(std::move(g.dq), {u(s.batch), u(s.seq_q), u(s.heads_q), u(s.head_dim)}),
          numpy_of(std::move(g.dk), {u(s.batch), u(s.seq_k), u(s.heads_kv), u(s.head_dim)}),
          numpy_of(std::move(g.dv), {u(s.batch), u(s.seq_k), u(s.heads_kv), u(s.head_dim_v)})};
}

nb::dict stats(const std::string& spec, int64_t seq_q, int64_t heads_q, int64_t seq_k, int64_t heads_kv, int64_t q_offset,
               int64_t k_offset) {
  const Shape s = shape_of(1, seq_q, seq_k, heads_q, heads_kv, 64, 64, q_offset, k_offset);
  const Pattern p = pattern_of(spec);
  check_pattern_fits(p, s);
  const PatternStats st = pattern_stats(MaskContext{p, s, nullptr});
  nb::dict d;
  d["attended_pairs"] = st.attended_pairs;
  d["pairs_per_head"] = st.pairs_per_head;
  d["pairs_per_branch"] = st.pairs_per_branch;
  d["empty_rows"] = st.empty_rows;
  d["density"] = st.density;
  d["distinct_pairs"] = st.distinct_pairs;
  d["distinct_density"] = st.distinct_density;
  return d;
}

// The attended pairs of each query row over all query heads, int64 [Sq] (pairs_per_row).
nb::ndarray<nb::numpy, int64_t> row_pairs(const std::string& spec, int64_t seq_q, int64_t heads_q, int64_t seq_k,
                                          int64_t heads_kv, int64_t q_offset, int64_t k_offset) {
  const Shape s = shape_of(1, seq_q, seq_k, heads_q, heads_kv, 64, 64, q_offset, k_offset);
  const Pattern p = pattern_of(spec);
  check_pattern_fits(p, s);
  std::vector<int64_t> out;
  {
    nb::gil_scoped_release release;
    out = pairs_per_row(MaskContext{p, s, nullptr});
  }
  return numpy_of(std::move(out), {static_cast<size_t>(seq_q)});
}

// What one call touches: (key rows attended, uint8 [Hkv, Sk]; query rows that attend a key, uint8
// [Hq, Sq]) (plan_key_rows, plan_attending_rows), the same whatever the tiles. What
// attnjit.distributed sends of a K/V shard and merges of a step's output; both all zero when the
// call attends nothing.
std::tuple<nb::ndarray<nb::numpy, uint8_t>, nb::ndarray<nb::numpy, uint8_t>> call_rows(
    const std::string& spec, int64_t seq_q, int64_t heads_q, int64_t seq_k, int64_t heads_kv, int64_t q_offset, int64_t k_offset) {
  const Shape s = shape_of(1, seq_q, seq_k, heads_q, heads_kv, 64, 64, q_offset, k_offset);
  const Pattern p = pattern_of(spec);
  check_pattern_fits(p, s);
  std::vector<uint8_t> keys, queries;
  {
    nb::gil_scoped_release release;
    const Plan plan = lower_to_plan(p, s, TileConfig{64, 64});
    keys = plan_key_rows(plan, p);
    queries = plan_attending_rows(plan, p);
  }
  return {numpy_of(std::move(keys), {static_cast<size_t>(heads_kv), static_cast<size_t>(seq_k)}),
          numpy_of(std::move(queries), {static_cast<size_t>(heads_q), static_cast<size_t>(seq_q)})};
}

// How many branches attend each (query head, query row, key row): uint8 [Hq, Sq, Sk].
nb::ndarray<nb::numpy, uint8_t> mask(const std::string& spec, int64_t seq_q, int64_t heads_q, int64_t seq_k, int64_t heads_kv,
                                     int64_t q_offset, int64_t k_offset) {
  const Shape s = shape_of(1, seq_q, seq_k, heads_q, heads_kv, 64, 64, q_offset, k_offset);
  const Pattern p = pattern_of(spec);
  check_pattern_fits(p, s);
  // A whole sequence (no offsets): explicit blocks past it are a mistake, as `attnjit run` says. With
  // offsets the call may be one chunk of a longer sequence, where such blocks attend nothing.
  if (q_offset == 0 && k_offset == 0) check_blocks_inside_sequence(p, seq_q, seq_k);
  if (heads_q * seq_q * seq_k > (int64_t{1} << 30)) {
    throw UserError("mask", "heads_q * seq_q * seq_k = " + std::to_string(heads_q * seq_q * seq_k) +
                                " entries is over 2^30; ask for fewer heads or shorter sequences (or use stats())");
  }
  std::vector<uint8_t> m(static_cast<size_t>(heads_q * seq_q * seq_k));
  const MaskContext c{p, s, nullptr};
  {
    nb::gil_scoped_release release;
    for (int64_t h = 0; h < heads_q; ++h)
      for (int64_t i = 0; i < seq_q; ++i)
        for (int64_t j = 0; j < seq_k; ++j)
          m[static_cast<size_t>((h * seq_q + i) * seq_k + j)] = static_cast<uint8_t>(attend_count(c, h, i, j));
  }
  return numpy_of(std::move(m), {static_cast<size_t>(heads_q), static_cast<size_t>(seq_q), static_cast<size_t>(seq_k)});
}

// attnjit.dump: one stage of the pipeline as `attnjit dump` prints it. dims = {batch, seq_q,
// seq_k, heads_q, heads_kv, head_dim, head_dim_v}; the plans need seq_q > 0, the kernels only the
// head dims, dtype and arch.
std::string dump(const std::string& spec, const std::string& stage, const std::vector<int64_t>& dims, int64_t q_offset,
                 int64_t k_offset, int tile_q, int tile_k, const std::string& arch, const std::string& dtype, bool backward,
                 bool full, bool paged, const std::vector<int64_t>& kv_lens, const std::vector<int64_t>& queries,
                 bool pack_branches) {
  const Pattern p = pattern_of(spec);
  DumpRequest r;
  r.stage = stage, r.backward = backward, r.full = full, r.tiles = TileConfig{tile_q, tile_k}, r.paged = paged;
  r.pack_branches = pack_branches;
  r.full_hint = "full=True", r.seq_name = "seq", r.backward_name = "backward", r.stage_name = "stage", r.kv_lens_name = "kv_lens";
  r.pack_branches_name = "pack_branches";
  if (!queries.empty() && queries.size() != kv_lens.size())
    throw UserError("queries", "has " + std::to_string(queries.size()) + " entries for " + std::to_string(kv_lens.size()) +
                                   " requests (kv_lens); give one per request, or None for one query each");
  for (size_t b = 0; b < kv_lens.size(); ++b) r.paged_requests.push_back({queries.empty() ? 1 : queries[b], kv_lens[b]});
  r.paged_heads.heads_q = dims.at(3), r.paged_heads.heads_kv = dims.at(4);
  r.paged_heads.head_dim = dims.at(5), r.paged_heads.head_dim_v = dims.at(6);
  if (dims.size() == 7 && dims[1] > 0) {
    Shape s;
    s.batch = dims[0], s.seq_q = dims[1], s.seq_k = dims[2], s.heads_q = dims[3], s.heads_kv = dims[4];
    s.head_dim = dims[5], s.head_dim_v = dims[6], s.q_offset = q_offset, s.k_offset = k_offset;
    check_shape(s, "");
    r.shape = s;
  }
  if (stage == "cuda" || stage == "ptx" || stage == "sass") {
    Shape heads;
    heads.head_dim = dims.at(5), heads.head_dim_v = dims.at(6);
    const ArchName a = parse_arch_name(arch, "arch");
    r.kernels.push_back(knob_request(heads, parse_dtype(dtype), a.arch, a.specific));
  }
  nb::gil_scoped_release release;
  return dump_stage(p, r);
}

// attnjit.precompile: a manifest's kernels into a kernel cache (the CLI's `precompile`).
nb::dict precompile(const std::string& manifest, const std::vector<std::string>& arch_names, const std::string& cache_dir,
                    int jobs, int top_k) {
  std::vector<ArchName> archs;
  for (const std::string& a : arch_names) archs.push_back(parse_arch_name(a, "arch"));
  PrecompileReport r;
  {
    nb::gil_scoped_release release;
    r = precompile_manifest(manifest, archs, cache_dir, jobs, top_k);
  }
  nb::dict d;
  d["kernels"] = r.kernels;
  d["compiled"] = r.compiled;
  d["cached"] = r.cached;
  d["failed"] = r.failed;
  d["seconds"] = r.seconds;
  d["cache_dir"] = r.cache_dir;
  d["errors"] = r.errors;
  return d;
}

nb::dict info() {
  nb::dict d;
  d["version"] = ATTNJIT_VERSION;
  d["nvrtc_version"] = nvrtc_available() ? nvrtc_version() : std::string("none");
  nb::list nvrtcs;
  const NvrtcSearch search = nvrtc_search();
  for (const NvrtcLibrary& lib : search.found) {
    nb::dict n;
    n["version"] = lib.version;
    n["path"] = lib.path;
    n["found_by"] = lib.found_by;
    n["archs"] = lib.archs;
    n["serves"] = archs_served(search, lib);
    nvrtcs.append(n);
  }
  d["nvrtc"] = nvrtcs;
  d["nvrtc_skipped"] = search.skipped;
  d["cache_dir"] = knobs().cache_dir;
  d["shipped_db_dir"] = shipped_db_dir();  // "" when ATTNJIT_SHIPPED_DB_DIR=none
  d["cpu_executor"] = std::string(cpu_simd_name(cpu_simd_selected()));
  const DriverProbe probe = probe_cuda_driver();
  d["cuda_driver"] = probe.loaded ? std::to_string(probe.driver_version) : std::string("none: ") + probe.problem;
  nb::list gpus;
  for (const GpuInfo& g : probe.gpus) gpus.append(g.name + " (sm_" + std::to_string(g.cc_major) + std::to_string(g.cc_minor) + ")");
  d["gpus"] = gpus;
  return d;
}

}  // namespace

NB_MODULE(_attnjit, m) {
  m.doc() = "attnjit's runtime; use the attnjit package, not this module";
  static nb::object attnjit_error = nb::steal(PyErr_NewException("attnjit.AttnjitError", PyExc_ValueError, nullptr));
  static nb::object pattern_error = nb::steal(PyErr_NewException("attnjit.PatternError", attnjit_error.ptr(), nullptr));
  m.attr("AttnjitError") = attnjit_error;
  m.attr("PatternError") = pattern_error;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const SpecError& e) {
      PyErr_SetString(pattern_error.ptr(), e.what());
    } catch (const UserError& e) {
      PyErr_SetString(attnjit_error.ptr(), e.what());
    }
  });

  m.def("jit_counters", []() {
    const JitCounters c = jit_counters();
    nb::dict d;
    d["compiled"] = c.compiled;
    d["cache_hits"] = c.cache_hits;
    d["failed"] = c.failed;
    d["compile_seconds"] = c.compile_seconds;
    d["compile_wall_seconds"] = c.compile_wall_seconds;
    d["lookup_seconds"] = c.lookup_seconds;
    return d;
  }, "process-wide JIT counters: kernels compiled (and their seconds), cache hits, failed compiles");
  m.def("validate", [](const std::string& spec) {
    const Pattern p = pattern_of(spec);
    return std::make_tuple(canonical_text(p), pattern_hash(p));
  }, "(canonical text, hash) of a spec; raises PatternError naming what is wrong");
  m.def("head_slice", [](const std::string& spec, int64_t first, int64_t count, int64_t heads_q) {
    const std::string text = spec_json_text(head_slice(pattern_of(spec), first, count, heads_q));
    pattern_of(text);  // what it wrote reads back (a PatternError here is attnjit's bug, not the caller's)
    return text;
  }, "the JSON spec of the pattern over query heads [first, first + count) of heads_q (head parallelism)");
  m.def("spec_json", [](const std::string& spec) { return spec_json_text(pattern_of(spec)); },
        "the spec with every default written out, as attnjit reads it");
  m.def("forward", &forward);
  m.def("forward_fp8", &forward_fp8);
  m.def("backward", &backward);
  m.def("backward_add", &backward_add);
  m.def("paged", &paged);
  m.def("sanitize_dynamic", &sanitize_dynamic);
  m.def("reference_forward", &reference_forward);
  m.def("reference_backward", &reference_backward);
  m.def("weights", &attention_weights);
  m.def("reference_weights", &reference_attention_weights);
  m.def("check_weights_size", &check_weights_size);
  m.def("stats", &stats);
  m.def("mask", &mask);
  m.def("call_rows", &call_rows);
  m.def("row_pairs", &row_pairs);
  m.def("info", &info);
  m.def("_add_nvrtc_search_path", &add_nvrtc_search_path, "a file or folder to search for NVRTC (the package registers PyPI's NVRTC wheels)");
  m.def("backward_workspace_bytes", &backward_workspace_bytes);
  m.def("dump", &dump);
  m.def("precompile", &precompile);
}
