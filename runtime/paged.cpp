// PagedAttention: checks a call against the problem, plans its requests (compiler/plan/paged_plan),
// and hands it to the device: the CPU gathers each request's tokens and runs the plan executor; the
// emu and CUDA devices run the paged kernels (templates/fwd_paged.cuh).
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "attnjit/attnjit.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/half.hpp"
#include "runtime/backend.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "runtime/host_tensors.hpp"
#include "runtime/input_checks.hpp"

namespace attnjit {

struct PagedState {
  Pattern pattern;
  PagedProblem problem;
  std::unique_ptr<PagedBackend> backend;
  double softmax_scale = 1.0, output_scale = 1.0;  // the pattern's (a graph's run() has no plan)
  // Planning on the device: the classes of heads its kernel plans alike (at the backend's tile_q)
  // and the branches with a layout, which the forward seeks through.
  std::vector<PagedHeadClass> head_classes;
  uint64_t layout_branches = 0;
};

KernelRequest paged_request(const PagedProblem& pb, int arch, const KernelConfig& config) {
  KernelRequest r;
  r.head_dim = static_cast<int>(pb.head_dim);
  r.head_dim_v = static_cast<int>(pb.head_dim_v);
  r.dtype = pb.dtype;
  r.arch = arch;
  r.config = config;
  r.kv_dtype = pb.kv_dtype;
  return r;
}

namespace {

void require(bool ok, const std::string& what, const std::string& fix) {
  if (!ok) throw UserError(what, fix);
}

std::string dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// `t` has `rank` dims equal to `want` where want >= 0, the dtype, last stride 1, strides >= 0.
void check_view(const char* name, const TensorView& t, std::vector<int64_t> want, DType dtype) {
  require(t.shape.size() == want.size() && t.strides.size() == want.size(), name,
          "expected " + std::to_string(want.size()) + " dimensions, got shape " + dims(t.shape));
  for (size_t d = 0; d < want.size(); ++d)
    require(want[d] < 0 || t.shape[d] == want[d], name, "has shape " + dims(t.shape) + "; dimension " + std::to_string(d) +
                                                            " must be " + std::to_string(want[d]));
  require(t.dtype == dtype, name, std::string("is ") + to_string(t.dtype) + "; expected " + to_string(dtype));
  require(t.strides.back() == 1, name, "needs last stride 1 (contiguous head dims)");
  for (int64_t s : t.strides) require(s >= 0, name, "has a negative stride; make it contiguous");
  for (int64_t n : t.shape) require(n >= 0, name, "has a negative size");
  require(t.data != nullptr || std::any_of(t.shape.begin(), t.shape.end(), [](int64_t n) { return n == 0; }), name,
          "is null");
  view_span_bytes(name, t);
}

}  // namespace

std::shared_ptr<PagedState> make_paged_state(const Pattern& pattern, const PagedProblem& pb, const RuntimeOptions& o) {
  require(pb.heads_q >= 1 && pb.heads_kv >= 1 && pb.heads_q % pb.heads_kv == 0, "PagedProblem.heads_q",
          std::to_string(pb.heads_q) + " query heads over " + std::to_string(pb.heads_kv) +
              " kv heads: both >= 1, and heads_kv must divide heads_q");
  require(pb.head_dim >= 1 && pb.head_dim_v >= 1, "PagedProblem.head_dim", "head dims must be >= 1");
  require(pb.dtype != DType::E4M3, "PagedProblem.dtype", "q and o are fp32, fp16 or bf16; fp8_e4m3 is a cache dtype (kv_dtype)");
  require(!pb.kv_dtype || *pb.kv_dtype == pb.dtype || *pb.kv_dtype == DType::E4M3, "PagedProblem.kv_dtype",
          std::string("the caches are q's dtype (") + to_string(pb.dtype) + ") or fp8_e4m3, got " +
              (pb.kv_dtype ? to_string(*pb.kv_dtype) : ""));
  require(!pattern.has_dynamic_layout(), "pattern", "paged attention cannot take a dynamic layout; use a fixed or random layout");
  Shape s;
  s.seq_q = s.seq_k = 1, s.heads_q = pb.heads_q, s.heads_kv = pb.heads_kv, s.head_dim = pb.head_dim, s.head_dim_v = pb.head_dim_v;
  check_pattern_fits(pattern, s);  // heads, head groups, GQA
  auto st = std::make_shared<PagedState>();
  st->pattern = pattern;
  st->problem = pb;
  const TemplateSet& templates = o.templates ? *o.templates : TemplateSet::embedded();
  switch (o.device.kind) {
    case DeviceKind::CPU: st->backend = make_cpu_paged(pattern, pb); break;
    case DeviceKind::EMU:
      st->backend = make_emu_paged(pattern, pb, {o.device.index, o.device.arch_specific}, o.cache_dir, o.config, templates);
      break;
    case DeviceKind::CUDA: st->backend = make_cuda_paged(pattern, pb, o.device.index, o.cache_dir, o.config, templates); break;
  }
  const PagedPlan one = lower_paged_plan(pattern, pb.heads_q, pb.heads_kv, pb.head_dim, pb.head_dim_v, {{1, 1}},
                                         st->backend->tiles());
  st->softmax_scale = one.tables.softmax_scale;
  st->output_scale = one.tables.output_scale;
  st->head_classes = paged_head_classes(pattern, pb.heads_q, pb.heads_kv, st->backend->tiles().tile_q);
  for (size_t b = 0; b < pattern.branches.size(); ++b)
    if (pattern.branches[b].layout) st->layout_branches |= uint64_t{1} << b;
  return st;
}

const Pattern& PagedAttention::pattern() const { return state_->pattern; }
const PagedProblem& PagedAttention::problem() const { return state_->problem; }
std::string PagedAttention::kernel_name() const { return state_->backend->kernel_name(); }

namespace {

// The call's tensors checked against the problem (UserError naming what is wrong).
void check_tensors(const PagedState& st, const PagedCall& c) {
  const PagedProblem& pb = st.problem;
  require(c.q.shape.size() == 3, "q", "expected [total_q, Hq, D], got shape " + dims(c.q.shape));
  const int64_t total = c.q.shape[0];
  check_view("q", c.q, {-1, pb.heads_q, pb.head_dim}, pb.dtype);
  const DType kv = pb.kv_dtype.value_or(pb.dtype);
  check_view("k_cache", c.k_cache, {-1, -1, pb.heads_kv, pb.head_dim}, kv);
  check_view("v_cache", c.v_cache, {c.k_cache.shape[0], c.k_cache.shape[1], pb.heads_kv, pb.head_dim_v}, kv);
  if (kv != DType::E4M3)
    require(!c.k_scale && !c.v_scale, c.k_scale ? "k_scale" : "v_scale",
            "applies to fp8_e4m3 caches (PagedProblem::kv_dtype); these are " + std::string(to_string(kv)));
  check_view("o", c.o, {total, pb.heads_q, pb.head_dim_v}, pb.dtype);
  check_no_self_overlap("o", c.o);
  if (c.lse) {
    check_view("lse", *c.lse, {total, pb.heads_q}, DType::F32);
    check_no_self_overlap("lse", *c.lse);
  }
  const int64_t page_size = c.k_cache.shape[1];
  require(page_size >= 1 && page_size <= 256, "k_cache", "page size " + std::to_string(page_size) + " is out of range; pages hold 1 to 256 tokens");
  require(c.splits >= 0 && c.splits <= 64, "splits", "expected 0 (automatic) to 64, got " + std::to_string(c.splits));
}

bool device_lengths(const PagedCall& c) { return c.device_kv_lens != nullptr; }

// A call checked against the problem: its requests (UserError naming what is wrong).
std::vector<PagedRequest> checked_requests(const PagedState& st, const PagedCall& c) {
  require(!device_lengths(c), "PagedCall.device_kv_lens", "is set: this call is planned on the device (internal: host path)");
  require(c.device_cu_seqlens_q == nullptr, "PagedCall.device_cu_seqlens_q",
          "needs device_kv_lens too (lengths on the device); with host lengths give cu_seqlens_q");
  check_tensors(st, c);
  const int64_t batch = static_cast<int64_t>(c.kv_lens.size());
  const int64_t total = c.q.shape[0];
  const int64_t num_pages = c.k_cache.shape[0], page_size = c.k_cache.shape[1];
  // The queries of each request.
  std::vector<int64_t> cu = c.cu_seqlens_q;
  if (cu.empty()) {
    require(total == batch, "q", "has " + std::to_string(total) + " queries for " + std::to_string(batch) +
                                     " requests; pass cu_seqlens_q for several per request");
    for (int64_t b = 0; b <= batch; ++b) cu.push_back(b);
  }
  require(static_cast<int64_t>(cu.size()) == batch + 1, "cu_seqlens_q",
          "expected " + std::to_string(batch + 1) + " entries (requests + 1), got " + std::to_string(cu.size()));
  require(cu.front() == 0 && cu.back() == total, "cu_seqlens_q", "must run from 0 to total_q = " + std::to_string(total));
  std::vector<PagedRequest> requests(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const std::string at = "[" + std::to_string(b) + "]";
    require(cu[b] <= cu[b + 1], "cu_seqlens_q", "must not decrease (entry " + std::to_string(b + 1) + ")");
    const int64_t len = c.kv_lens[b];
    require(len >= 0, "kv_lens" + at, "= " + std::to_string(len) + " is negative");
    const int64_t pages = (len + page_size - 1) / page_size;
    require(pages <= c.block_table_stride, "kv_lens" + at,
            "= " + std::to_string(len) + " needs " + std::to_string(pages) + " pages of " + std::to_string(page_size) +
                " tokens; the block table has " + std::to_string(c.block_table_stride) + " per request");
    requests[b] = {cu[b + 1] - cu[b], len};
  }
  require(batch == 0 || c.block_table != nullptr, "block_table", "is null");
  // The table's entries where the host can read them; a GPU's kernel counts or poisons bad ones, as
  // the emu device's does when given a counter.
  if (st.backend->host_memory() && (c.errors == nullptr || !st.backend->graphs())) {
    for (int64_t b = 0; b < batch; ++b) {
      if (requests[b].queries == 0) continue;
      for (int64_t j = 0; j * page_size < requests[b].kv_len; ++j) {
        const int64_t page = c.block_table[b * c.block_table_stride + j];
        require(page >= 0 && page < num_pages, "block_table[" + std::to_string(b) + ", " + std::to_string(j) + "]",
                "= " + std::to_string(page) + " is not a page of the cache (0 .. " + std::to_string(num_pages - 1) + ")");
      }
    }
  }
  return requests;
}

// Rows of a request with no attended key, and requests with nothing cached, still get O = 0 and
// LSE = -inf from their items; requests with no queries have none.
PagedPlan plan_of(const PagedState& st, const std::vector<PagedRequest>& requests) {
  const PagedProblem& pb = st.problem;
  return lower_paged_plan(st.pattern, pb.heads_q, pb.heads_kv, pb.head_dim, pb.head_dim_v, requests, st.backend->tiles());
}

int32_t splits_of(const PagedState& st, const PagedPlan& plan, const PagedCall& c) {
  return c.splits ? c.splits : paged_splits(plan, st.backend->target_blocks());
}

const PagedState& state_of(const std::shared_ptr<PagedState>& st) {
  require(st != nullptr, "PagedAttention", "is empty; get one from Runtime::prepare_paged");
  return *st;
}

void check_lengths_given_once(const PagedCall& c) {
  require(c.kv_lens.empty() && c.cu_seqlens_q.empty(), c.kv_lens.empty() ? "cu_seqlens_q" : "kv_lens",
          "is given with device_kv_lens; give the lengths on the host or on the device, not both");
}

// A call with lengths on the device, checked as far as the host can without reading them.
void check_device_call(const PagedState& st, const PagedCall& c) {
  check_lengths_given_once(c);
  check_tensors(st, c);
  const int64_t total = c.q.shape[0];
  require(c.requests >= 0 && c.requests < (int64_t{1} << 31), "PagedCall.requests",
          "= " + std::to_string(c.requests) + "; expected the entries of device_kv_lens (0 to 2^31 - 1)");
  require(total < (int64_t{1} << 31), "q", "has " + std::to_string(total) + " queries; device planning takes fewer than 2^31");
  require(c.device_cu_seqlens_q || total == c.requests, "q",
          "has " + std::to_string(total) + " queries for " + std::to_string(c.requests) +
              " requests; pass device_cu_seqlens_q for several per request");
  require(c.requests == 0 || c.block_table != nullptr, "block_table", "is null");
  require(c.block_table_stride >= 0, "block_table_stride", "is negative");
}

// The CPU device's memory is the host's: a call with device lengths read into host lengths.
PagedCall with_host_lengths(const PagedCall& c) {
  check_lengths_given_once(c);
  PagedCall h = c;
  h.device_kv_lens = nullptr, h.device_cu_seqlens_q = nullptr;
  require(c.requests >= 0, "PagedCall.requests", "is negative");
  h.kv_lens.assign(c.device_kv_lens, c.device_kv_lens + c.requests);
  if (c.device_cu_seqlens_q) h.cu_seqlens_q.assign(c.device_cu_seqlens_q, c.device_cu_seqlens_q + c.requests + 1);
  return h;
}

DevicePlanning planning_of(const PagedState& st, const PagedCall& c) {
  DevicePlanning d;
  d.kv_lens = c.device_kv_lens;
  d.cu_seqlens_q = c.device_cu_seqlens_q;
  d.requests = c.requests;
  d.fixed_splits = c.splits;
  d.target_blocks = st.backend->target_blocks();
  d.seek_branches = st.layout_branches;
  return d;
}

PagedCapacity device_needs(const PagedState& st, const PagedCall& c) {
  const PagedCapacity cap =
      device_planned_capacity(st.head_classes, static_cast<int64_t>(st.pattern.branches.size()), st.backend->tiles().tile_q,
                              c.requests, c.q.shape[0], c.splits, st.backend->target_blocks());
  require(cap.items < (int64_t{1} << 31) && cap.spans < (int64_t{1} << 31), "q",
          "has " + std::to_string(c.q.shape[0]) + " queries: planned on the device they could make " + std::to_string(cap.items) +
              " work items, past 2^31; split the call, or give the lengths on the host");
  return cap;
}

}  // namespace

void PagedAttention::forward(const PagedCall& c) {
  const PagedState& st = state_of(state_);
  if (device_lengths(c)) {
    if (!st.backend->graphs()) return forward(with_host_lengths(c));
    check_device_call(st, c);
    if (c.q.shape[0] == 0) return;
    st.backend->forward_planned(c, device_needs(st, c), st.softmax_scale, st.output_scale, planning_of(st, c));
    return;
  }
  const std::vector<PagedRequest> requests = checked_requests(st, c);
  if (c.q.shape[0] == 0) return;
  const PagedPlan plan = plan_of(st, requests);
  st.backend->forward(plan, c, splits_of(st, plan, c));
}

PagedCapacity PagedAttention::needs(const PagedCall& c) const {
  const PagedState& st = state_of(state_);
  if (device_lengths(c)) {
    if (!st.backend->graphs()) return needs(with_host_lengths(c));
    check_device_call(st, c);
    return device_needs(st, c);
  }
  const PagedPlan plan = plan_of(st, checked_requests(st, c));
  return paged_capacity_of(plan, splits_of(st, plan, c));
}

size_t PagedAttention::workspace_bytes(const PagedCapacity& cap) const {
  const PagedState& st = state_of(state_);
  return paged_workspace(cap, st.backend->tiles().tile_q, st.problem.head_dim_v).total;
}

void PagedAttention::plan(const PagedCall& c, void* workspace, const PagedCapacity& cap) {
  const PagedState& st = state_of(state_);
  require(workspace != nullptr, "workspace", "is null; allocate workspace_bytes(cap) bytes");
  require(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, "workspace", "must be 256-byte aligned");
  require(cap.splits >= 1 && cap.splits <= 64, "PagedCapacity.splits", "expected 1 to 64, got " + std::to_string(cap.splits));
  require(!device_lengths(c) || !st.backend->graphs(), "PagedAttention::plan",
          "is for calls with host lengths; a call with device_kv_lens is planned on the device by run(): call run() alone");
  if (device_lengths(c)) return;  // the CPU device: run() is forward()
  const PagedPlan plan = plan_of(st, checked_requests(st, c));
  // The step's splits: the call's, or what fills the device, at most the capacity's.
  const int32_t splits = c.splits ? c.splits : std::min(splits_of(st, plan, c), cap.splits);
  const PagedWorkspace w = paged_workspace(cap, st.backend->tiles().tile_q, st.problem.head_dim_v);
  st.backend->write_workspace(workspace, pack_paged_workspace(plan, splits, cap, w), c);
}

void PagedAttention::run(const PagedCall& c, void* workspace, const PagedCapacity& cap) {
  const PagedState& st = state_of(state_);
  if (!st.backend->graphs()) return forward(c);  // the CPU: no graphs, its own plan
  if (device_lengths(c)) {
    check_device_call(st, c);
    require(workspace != nullptr, "workspace", "is null; allocate workspace_bytes(needs(call)) bytes");
    require(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, "workspace", "must be 256-byte aligned");
    const PagedCapacity need = device_needs(st, c);
    for (const auto& [name, want, have] : {std::tuple<const char*, int64_t, int64_t>{"requests", need.requests, cap.requests},
                                           {"items", need.items, cap.items}, {"spans", need.spans, cap.spans}}) {
      require(have >= want, std::string("PagedCapacity.") + name,
              "holds " + std::to_string(have) + "; a call of " + std::to_string(c.requests) + " requests and " +
                  std::to_string(c.q.shape[0]) + " queries planned on the device may need " + std::to_string(want) +
                  " (size it with needs(call))");
    }
    require(cap.splits >= 1 && cap.splits <= 64, "PagedCapacity.splits", "expected 1 to 64, got " + std::to_string(cap.splits));
    if (c.q.shape[0] == 0) return;
    const PagedWorkspace w = paged_workspace(cap, st.backend->tiles().tile_q, st.problem.head_dim_v);
    const DevicePlanning d = planning_of(st, c);
    st.backend->run_workspace(c, workspace, w, cap, st.softmax_scale, st.output_scale, &d);
    return;
  }
  checked_requests(st, c);  // the tensors and lengths as plan() saw them (a graph's launch reads its workspace)
  require(workspace != nullptr, "workspace", "is null; give plan()'s workspace");
  if (c.q.shape[0] == 0 || cap.items == 0) return;
  const PagedWorkspace w = paged_workspace(cap, st.backend->tiles().tile_q, st.problem.head_dim_v);
  st.backend->run_workspace(c, workspace, w, cap, st.softmax_scale, st.output_scale);
}

namespace {

// The CPU device: each request's queries and tokens gathered into float32 and run by the plan
// executor over the request's own plan (lowered with the executor's tiles).
class CpuPaged final : public PagedBackend {
public:
  CpuPaged(const Pattern& p, const PagedProblem& pb) : pattern_(p), problem_(pb) {}

  void forward(const PagedPlan& plan, const PagedCall& c, int32_t) override {
    const PagedProblem& pb = problem_;
    const int64_t page_size = c.k_cache.shape[1];
    for (size_t b = 0; b < plan.requests.size(); ++b) {
      const PagedRequest& r = plan.requests[b];
      if (r.queries == 0) continue;
      // The request's queries [1, n, Hq, D] and tokens [1, L, Hkv, D] as contiguous float32.
      TensorView qv = c.q;
      qv.data = static_cast<char*>(c.q.data) + plan.q_start[b] * c.q.strides[0] * dtype_bytes(c.q.dtype);
      qv.shape[0] = r.queries;
      const std::vector<float> q = gather(qv);
      auto tokens = [&](const TensorView& cache) {
        std::vector<float> out;
        out.reserve(static_cast<size_t>(r.kv_len * cache.shape[2] * cache.shape[3]));
        for (int64_t j = 0; j * page_size < r.kv_len; ++j) {
          TensorView page = cache;
          page.shape.erase(page.shape.begin());
          page.strides.erase(page.strides.begin());
          page.shape[0] = std::min(page_size, r.kv_len - j * page_size);
          page.data = static_cast<char*>(cache.data) +
                      c.block_table[int64_t(b) * c.block_table_stride + j] * cache.strides[0] * dtype_bytes(cache.dtype);
          const std::vector<float> rows = gather(page);
          out.insert(out.end(), rows.begin(), rows.end());
        }
        return out;
      };
      std::vector<float> k = tokens(c.k_cache), v = tokens(c.v_cache);
      // FP8 caches: stored value x the kv head's scale.
      for (const auto& [values, scale, width] : {std::tuple<std::vector<float>*, const float*, int64_t>{&k, c.k_scale, pb.head_dim},
                                                 {&v, c.v_scale, pb.head_dim_v}}) {
        if (!scale) continue;
        for (size_t n = 0; n < values->size(); ++n) (*values)[n] *= scale[(n / width) % pb.heads_kv];
      }
      const ExecutorOutput out = execute_plan(*plan.request_plans[b], pattern_, q.data(), k.data(), v.data());
      TensorView ov = c.o;
      ov.data = static_cast<char*>(c.o.data) + plan.q_start[b] * c.o.strides[0] * dtype_bytes(c.o.dtype);
      ov.shape[0] = r.queries;
      scatter(ov, out.o);
      if (c.lse) {  // the executor's [1, Hq, n] into [n, Hq]
        float* lse = static_cast<float*>(c.lse->data);
        for (int64_t i = 0; i < r.queries; ++i)
          for (int64_t h = 0; h < pb.heads_q; ++h)
            lse[(plan.q_start[b] + i) * c.lse->strides[0] + h * c.lse->strides[1]] = out.lse[h * r.queries + i];
      }
    }
  }
  TileConfig tiles() const override { return TileConfig{64, 64}; }
  int64_t target_blocks() const override { return 1; }
  std::string kernel_name() const override { return "cpu plan executor"; }
  // No graphs: plan() still writes its tables (host memory), run() is forward().
  bool graphs() const override { return false; }
  void write_workspace(void* workspace, const std::vector<uint8_t>& bytes, const PagedCall&) override {
    std::memcpy(workspace, bytes.data(), bytes.size());
  }
  void run_workspace(const PagedCall&, void*, const PagedWorkspace&, const PagedCapacity&, double, double,
                     const DevicePlanning*) override {
    ATTNJIT_CHECK(false, "the CPU device runs paged calls with forward()");
  }
  void forward_planned(const PagedCall&, const PagedCapacity&, double, double, const DevicePlanning&) override {
    ATTNJIT_CHECK(false, "the CPU device reads device lengths on the host");
  }

private:
  Pattern pattern_;
  PagedProblem problem_;
};

}  // namespace

std::unique_ptr<PagedBackend> make_cpu_paged(const Pattern& p, const PagedProblem& pb) {
  return std::make_unique<CpuPaged>(p, pb);
}

}  // namespace attnjit
