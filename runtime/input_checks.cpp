#include "runtime/input_checks.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit {
namespace {

std::string dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t n = 0; n < v.size(); ++n) s += (n ? ", " : "") + std::to_string(v[n]);
  return s + "]";
}

// A view with no elements (a dimension of size 0).
bool empty_view(const TensorView& t) {
  return std::any_of(t.shape.begin(), t.shape.end(), [](int64_t n) { return n <= 0; });
}

void check_view(const char* name, const TensorView& t, const std::vector<int64_t>& want, DType dtype, int align) {
  if (!t.data) throw UserError(name, "is a null pointer");
  if (t.shape != want) {
    const std::string what = std::string(name) == "w" ? " ([batch, heads_q, seq_q, seq_k])"
                             : want.size() == 4      ? " ([batch, seq, heads, head_dim])"
                                                     : " ([batch, heads_q, seq_q])";
    throw UserError(name, "has shape " + dims(t.shape) + " but the problem needs " + dims(want) + what);
  }
  if (t.strides.size() != t.shape.size()) {
    throw UserError(name, "has " + std::to_string(t.strides.size()) + " strides for " + std::to_string(t.shape.size()) +
                              " dimensions; give one stride per dimension");
  }
  if (t.dtype != dtype) {
    throw UserError(name, std::string("has dtype ") + to_string(t.dtype) + " but must be " + to_string(dtype));
  }
  // A size-1 dimension's stride is never used (its only index is 0), so it may be anything: PyTorch
  // gives such dimensions arbitrary strides (a [B, S, 1, D] slice of a wider tensor, an unsqueeze).
  if (t.strides.back() != 1 && t.shape.back() != 1) {
    throw UserError(name, "last dimension has stride " + std::to_string(t.strides.back()) +
                              "; it must be contiguous (stride 1); make the tensor contiguous in its last dimension");
  }
  for (size_t d = 0; d + 1 < t.strides.size(); ++d) {
    if (t.strides[d] < 0 && t.shape[d] != 1) throw UserError(name, "has a negative stride in dimension " + std::to_string(d));
  }
  view_span_bytes(name, t);
  if (align > 1) {
    const int64_t bytes = dtype_bytes(t.dtype);
    if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(align) != 0) {
      throw UserError(name, "data pointer is not " + std::to_string(align) +
                                "-byte aligned, which the kernel's loads and stores need (allocate with the CUDA "
                                "allocator or pad the tensor)");
    }
    for (size_t d = 0; d + 1 < t.strides.size(); ++d) {
      if (t.shape[d] != 1 && t.strides[d] * bytes % align != 0) {
        throw UserError(name, "stride of dimension " + std::to_string(d) + " (" + std::to_string(t.strides[d]) +
                                  " elements) is not a multiple of " + std::to_string(align) +
                                  " bytes; pad the head dimension or make the tensor contiguous");
      }
    }
  }
}

// The byte range a view can touch (its span checked by view_span_bytes first).
std::pair<uintptr_t, uintptr_t> extent(const TensorView& t) {
  int64_t last = 0;
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (t.shape[d] > 1) last += (t.shape[d] - 1) * t.strides[d];
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + static_cast<uintptr_t>((last + 1) * dtype_bytes(t.dtype))};
}

bool overlap(const TensorView& a, const TensorView& b) {
  const auto [a0, a1] = extent(a);
  const auto [b0, b1] = extent(b);
  return a0 < b1 && b0 < a1;
}

}  // namespace

uint64_t view_span_bytes(const char* name, const TensorView& t) {
  if (empty_view(t)) return 0;
  // The furthest element's offset, in elements then bytes, every step checked: a stride past any
  // memory would make the extent wrap and the kernels read or write wrapped addresses.
  int64_t last = 0;
  bool wraps = false;
  for (size_t d = 0; d < t.shape.size() && d < t.strides.size(); ++d) {
    if (t.shape[d] == 1) continue;  // its stride is never used
    int64_t step = 0;
    wraps |= __builtin_mul_overflow(t.shape[d] - 1, t.strides[d] < 0 ? -t.strides[d] : t.strides[d], &step) ||
             __builtin_add_overflow(last, step, &last);
  }
  int64_t bytes = 0;
  wraps |= __builtin_add_overflow(last, int64_t{1}, &bytes) || __builtin_mul_overflow(bytes, int64_t{dtype_bytes(t.dtype)}, &bytes);
  constexpr int64_t kMaxSpan = int64_t{1} << 56;  // no address space holds more
  if (wraps || bytes > kMaxSpan)
    throw UserError(name, "strides " + dims(t.strides) + " over shape " + dims(t.shape) +
                              " reach more than 2^56 bytes past the data pointer, beyond any memory; check the strides "
                              "(in elements, not bytes)");
  return static_cast<uint64_t>(bytes);
}

void check_no_self_overlap(const char* name, const TensorView& t) {
  if (empty_view(t)) return;
  // Dimensions of more than one index, smallest stride first: each stride must step past every
  // element the smaller ones reach, or two indices share an element (a stride 0, a broadcast, or
  // strides that interleave). Any dense layout, permuted or padded, passes.
  std::vector<size_t> order;
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (t.shape[d] > 1) order.push_back(d);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.strides[a] < t.strides[b]; });
  int64_t reach = 0;  // the largest offset the dimensions before reach
  for (size_t d : order) {
    if (t.strides[d] <= reach)
      throw UserError(name, "is an output whose elements overlap: dimension " + std::to_string(d) + " (size " +
                                std::to_string(t.shape[d]) + ", stride " + std::to_string(t.strides[d]) +
                                ") lands on elements other indices write (strides " + dims(t.strides) + " over shape " +
                                dims(t.shape) + "); give each element its own memory (a contiguous tensor)");
    reach += (t.shape[d] - 1) * t.strides[d];
  }
}

Shape problem_shape(const Problem& pb, int64_t q_offset, int64_t k_offset) {
  Shape s;
  s.batch = pb.batch;
  s.seq_q = pb.seq_q;
  s.seq_k = pb.seq_k;
  s.heads_q = pb.heads_q;
  s.heads_kv = pb.heads_kv;
  s.head_dim = pb.head_dim;
  s.head_dim_v = pb.head_dim_v;
  s.q_offset = q_offset;
  s.k_offset = k_offset;
  return s;
}

KernelRequest problem_request(const Problem& pb, int arch, bool arch_specific) {
  KernelRequest r = kernel_request(problem_shape(pb, 0, 0), pb.dtype, arch, arch_specific);
  if (pb.dtype == DType::E4M3) r.out_dtype = pb.o_dtype();
  return r;
}

void check_problem(const Problem& pb) {
  for (const auto& [name, d] : {std::pair<const char*, std::optional<DType>>{"problem.dtype", pb.dtype}, {"problem.out_dtype", pb.out_dtype}})
    if (d && (static_cast<int>(*d) < static_cast<int>(DType::F32) || static_cast<int>(*d) > static_cast<int>(DType::E4M3)))
      throw UserError(name, std::to_string(static_cast<int>(*d)) + " is no dtype; use DType::F32, F16, BF16 or E4M3");
  if (pb.out_dtype && *pb.out_dtype != pb.dtype) {
    if (pb.dtype != DType::E4M3)
      throw UserError("problem.out_dtype", std::string("differs from the inputs' dtype ") + to_string(pb.dtype) +
                                               "; only fp8_e4m3 inputs have an output of another dtype (leave it empty)");
    if (*pb.out_dtype != DType::BF16 && *pb.out_dtype != DType::F16)
      throw UserError("problem.out_dtype", std::string("is ") + to_string(*pb.out_dtype) +
                                               "; fp8_e4m3 attention writes bf16 or fp16");
  }
  check_shape(problem_shape(pb, 0, 0), "problem.");
}

void check_forward_only(const Problem& pb, const char* call) {
  if (pb.dtype == DType::E4M3)
    throw UserError(call, "is not available for fp8_e4m3 inputs: FP8 attention is forward only (inference); "
                          "train in bf16 or fp16");
}

void check_descales(const Problem& pb, const ForwardOptions& options, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& o) {
  const std::pair<const char*, const TensorView*> scales[] = {
      {"q_descale", options.q_descale}, {"k_descale", options.k_descale}, {"v_descale", options.v_descale}};
  for (const auto& [name, t] : scales) {
    if (pb.dtype != DType::E4M3) {
      if (t) throw UserError(name, std::string("is only for fp8_e4m3 inputs; these are ") + to_string(pb.dtype));
      continue;
    }
    if (!t)
      throw UserError(name, "is missing: fp8_e4m3 inputs need q_descale, k_descale and v_descale (fp32 [batch, heads_kv]; "
                            "strides 0 for one factor per tensor, 1.0 where the codes are the values)");
    if (t->shape.size() != 2 || t->strides.size() != 2)
      throw UserError(name, "must be a 2-D fp32 view [batch, heads_kv] (strides 0 broadcast one factor); got shape " +
                                dims(t->shape));
    if (t->shape[0] != pb.batch || t->shape[1] != pb.heads_kv)
      throw UserError(name, "has shape " + dims(t->shape) + " but the problem needs [" + std::to_string(pb.batch) + ", " +
                                std::to_string(pb.heads_kv) + "] ([batch, heads_kv]; strides 0 broadcast one factor)");
    if (t->dtype != DType::F32) throw UserError(name, std::string("has dtype ") + to_string(t->dtype) + " but must be fp32");
    if (!t->data) throw UserError(name, "is a null pointer");
    if (t->strides[0] < 0 || t->strides[1] < 0) throw UserError(name, "has a negative stride");
    view_span_bytes(name, *t);
    for (const auto& [other, u] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}})
      if (overlap(*t, *u)) throw UserError(name, std::string("overlaps ") + other + "; give the factors their own memory");
  }
}

void check_forward_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& o, const TensorView* lse, int align_bytes) {
  check_view("q", q, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}, pb.dtype, align_bytes);
  check_view("k", k, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim}, pb.dtype, align_bytes);
  check_view("v", v, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v}, pb.dtype, align_bytes);
  // The tensor-core epilogue stores O in 16-byte chunks: o needs the inputs' alignment; the LSE is
  // written a float at a time.
  check_view("o", o, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v}, pb.o_dtype(), align_bytes);
  check_no_self_overlap("o", o);
  for (const auto* in : {&q, &k, &v}) {
    if (overlap(o, *in)) throw UserError("o", "overlaps an input (q, k or v); the output must alias nothing");
  }
  if (lse) {
    check_view("lse", *lse, {pb.batch, pb.heads_q, pb.seq_q}, DType::F32, align_bytes > 1 ? 4 : 1);
    check_no_self_overlap("lse", *lse);
    if (overlap(*lse, o) || overlap(*lse, q) || overlap(*lse, k) || overlap(*lse, v)) {
      throw UserError("lse", "overlaps another tensor; give it its own memory");
    }
  }
}

void check_backward_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                           const TensorView& dk, const TensorView& dv, int align_bytes, const TensorView* dlse) {
  check_view("q", q, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}, pb.dtype, align_bytes);
  check_view("k", k, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim}, pb.dtype, align_bytes);
  check_view("v", v, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v}, pb.dtype, align_bytes);
  check_view("o", o, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v}, pb.dtype, align_bytes);
  check_view("lse", lse, {pb.batch, pb.heads_q, pb.seq_q}, DType::F32, align_bytes > 1 ? 4 : 1);
  check_view("dout", dout, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v}, pb.dtype, align_bytes);
  check_view("dq", dq, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}, pb.dtype, align_bytes);
  check_view("dk", dk, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim}, pb.dtype, align_bytes);
  check_view("dv", dv, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v}, pb.dtype, align_bytes);
  if (dlse) check_view("dlse", *dlse, {pb.batch, pb.heads_q, pb.seq_q}, DType::F32, align_bytes > 1 ? 4 : 1);
  const std::pair<const char*, const TensorView*> outs[] = {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  const std::pair<const char*, const TensorView*> all[] = {{"q", &q},       {"k", &k},   {"v", &v},   {"o", &o}, {"lse", &lse},
                                                           {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& [name, t] : outs) check_no_self_overlap(name, *t);
  for (const auto& [name, t] : outs)
    for (const auto& [other, u] : all)
      if (std::string(name) != other && overlap(*t, *u)) {
        throw UserError(name, std::string("overlaps ") + other + "; each gradient needs its own memory");
      }
  if (dlse)
    for (const auto& [name, t] : outs)
      if (overlap(*t, *dlse)) throw UserError(name, "overlaps dlse; each gradient needs its own memory");
}

void check_backward_add_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& lse, const TensorView& dout, const TensorView& delta, const TensorView& dq_acc,
                               const TensorView& dk_acc, const TensorView& dv_acc, int align_bytes) {
  check_view("q", q, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}, pb.dtype, align_bytes);
  check_view("k", k, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim}, pb.dtype, align_bytes);
  check_view("v", v, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v}, pb.dtype, align_bytes);
  check_view("lse", lse, {pb.batch, pb.heads_q, pb.seq_q}, DType::F32, align_bytes > 1 ? 4 : 1);
  check_view("dout", dout, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v}, pb.dtype, align_bytes);
  // The kernels address D and the accumulators as the fp32 workspaces they stand for: contiguous.
  const std::pair<const char*, const TensorView*> fp32[] = {{"delta", &delta}, {"dq_acc", &dq_acc}, {"dk_acc", &dk_acc}, {"dv_acc", &dv_acc}};
  const std::vector<int64_t> shapes[] = {{pb.batch, pb.heads_q, pb.seq_q},
                                         {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim},
                                         {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim},
                                         {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v}};
  // The accumulators take the kernels' vector and bulk adds: the kernels' alignment (16 bytes on the
  // tensor-core paths), D a float's.
  const int acc_align = align_bytes > 4 ? align_bytes : align_bytes > 1 ? 4 : 1;
  for (size_t x = 0; x < 4; ++x) {
    const auto& [name, t] = fp32[x];
    check_view(name, *t, shapes[x], DType::F32, x == 0 ? (align_bytes > 1 ? 4 : 1) : acc_align);
    const std::vector<int64_t> dense = TensorView::contiguous(nullptr, DType::F32, t->shape).strides;
    bool contiguous = true;  // a dimension of size 1 may have any stride (as in PyTorch)
    for (size_t d = 0; d < dense.size(); ++d) contiguous &= t->shape[d] == 1 || t->strides[d] == dense[d];
    if (!contiguous) {
      throw UserError(name, "must be contiguous float32 " + dims(t->shape) + " (strides " + dims(t->strides) +
                                " given); allocate it contiguous");
    }
  }
  const std::pair<const char*, const TensorView*> all[] = {{"q", &q}, {"k", &k}, {"v", &v}, {"lse", &lse}, {"dout", &dout},
                                                           {"delta", &delta}, {"dq_acc", &dq_acc}, {"dk_acc", &dk_acc}, {"dv_acc", &dv_acc}};
  for (size_t x = 1; x < 4; ++x)
    for (const auto& [other, u] : all)
      if (std::string(fp32[x].first) != other && overlap(*fp32[x].second, *u)) {
        throw UserError(fp32[x].first, std::string("overlaps ") + other + "; each accumulator needs its own memory");
      }
}

void check_weights_size(int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k) {
  // The product passes int64 for long sequences: an overflow is a count above any cap.
  int64_t elements = 0;
  const bool overflow = __builtin_mul_overflow(batch, heads_q, &elements) ||
                        __builtin_mul_overflow(elements, seq_q, &elements) || __builtin_mul_overflow(elements, seq_k, &elements);
  if (overflow || elements > knobs().max_weights) {
    const std::string shown = overflow ? "more than 2^63" : std::to_string(elements);
    throw UserError("weights", "batch * heads_q * seq_q * seq_k = " + shown +
                                   " elements is over the cap of " + std::to_string(knobs().max_weights) +
                                   " (ATTNJIT_MAX_WEIGHTS); ask for fewer rows (a chunk of queries with q_offset), "
                                   "fewer heads, or raise the cap");
  }
}

void check_weights_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& lse,
                          const TensorView& w, int align_bytes) {
  check_view("q", q, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}, pb.dtype, align_bytes);
  check_view("k", k, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim}, pb.dtype, align_bytes);
  check_view("lse", lse, {pb.batch, pb.heads_q, pb.seq_q}, DType::F32, align_bytes > 1 ? 4 : 1);
  // The cap first: a request too large to hold should say so, not that w's shape is off.
  check_weights_size(pb.batch, pb.heads_q, pb.seq_q, pb.seq_k);
  check_view("w", w, {pb.batch, pb.heads_q, pb.seq_q, pb.seq_k}, DType::F32, align_bytes > 1 ? 4 : 1);
  if (w.strides != TensorView::contiguous(nullptr, DType::F32, w.shape).strides) {
    throw UserError("w", "must be contiguous [batch, heads_q, seq_q, seq_k] (strides " + dims(w.strides) +
                             " given); allocate it contiguous");
  }
  for (const auto& [other, u] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"lse", &lse}}) {
    if (overlap(w, *u)) throw UserError("w", std::string("overlaps ") + other + "; give the weights their own memory");
  }
}

}  // namespace attnjit
