// attnjit: the public C++ API.
//
//   attnjit::Runtime rt(attnjit::RuntimeOptions{attnjit::Device::cuda(0)});
//   attnjit::Pattern pattern = attnjit::load_spec_file("examples/longnet.json");
//   attnjit::Attention op = rt.prepare(pattern, {.batch = 1, .seq_q = 32768, .seq_k = 32768,
//                                                .heads_q = 16, .heads_kv = 16, .head_dim = 128,
//                                                .head_dim_v = 128, .dtype = attnjit::DType::BF16});
//   op.forward(q, k, v, o, &lse, {.stream = my_stream});
//
// Tensors are views: [B, S, H, D] logically, any strides with a contiguous last dimension (so
// [B, H, S, D] memory works through strides). On a CUDA device the pointers are device memory; on
// the CPU device they are host memory and the plan executor runs the same plan; on the emu device
// they are host memory and the CPU emulator runs the kernel a GPU would.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"  // UserError, what the API throws for bad input
#include "compiler/support/types.hpp"  // DType, KernelConfig

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

struct TemplateSet;  // compiler/codegen/templates.hpp: the kernels' templates (RuntimeOptions::templates)

// CPU: the plan executor. CUDA: a GPU. EMU: the generated kernel of a GPU of compute capability
// `arch` (80: sm_80), run by the CPU emulator of the CUDA execution model (emulator/) on host memory.
enum class DeviceKind { CPU, CUDA, EMU };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;  // CUDA: the device ordinal; EMU: the emulated arch (10 * major + minor)
  // EMU: the arch-specific kernels of sm_90a (the Hopper forward, wgmma), as a CUDA device of
  // compute capability 9.0 runs them (unless ATTNJIT_SM90A=0).
  bool arch_specific = false;
  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  static Device emu(int arch = 80, bool arch_specific = false) { return {DeviceKind::EMU, arch, arch_specific}; }
  std::string describe() const;  // "cpu", "cuda:0", "emu:sm_80", "emu:sm_90a"
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;    // [B, S, H, D] for q/k/v/o; [B, H, S] for lse
  std::vector<int64_t> strides;  // in elements, one per dimension
  // Row-major strides for `shape`.
  static TensorView contiguous(void* data, DType dtype, std::vector<int64_t> shape);
};

struct Problem {
  int64_t batch = 1, seq_q = 0, seq_k = 0, heads_q = 1, heads_kv = 1;
  int64_t head_dim = kDefaultHeadDim, head_dim_v = kDefaultHeadDim;
  DType dtype = DType::BF16;  // q, k and v (and o, unless out_dtype says otherwise)
  // O's dtype where it is not `dtype`: only with dtype fp8_e4m3, whose O is bf16 (the default
  // there) or fp16. FP8 attention is forward only (no backward, no weights): see
  // ForwardOptions::q_descale and docs/spec.md, "FP8 inputs".
  std::optional<DType> out_dtype;
  DType o_dtype() const { return out_dtype ? *out_dtype : dtype == DType::E4M3 ? DType::BF16 : dtype; }
};

// A dynamic layout's CSR table where the device reads it (a layout recomputed every step on the
// GPU): the kernels read it in place, so a new table costs no planning, no copy and no
// synchronisation. The rows and entries are DynamicLayout's; `rows` (= heads * query blocks) and
// `entries` are what the arrays hold. The host cannot look inside, so the kernels do: the forward
// counts the table's problems (row offsets out of order or range, entries outside the key blocks
// or not increasing in their row) into `errors` when it is given, and reads only inside the
// arrays whatever they hold. Entries outside the key blocks are skipped; which blocks of a row that
// is not increasing are kept is unspecified. On the CPU and emu devices the arrays are host memory
// (the CPU device drops what is wrong, as mask.hpp's sanitize_dynamic_table does).
struct DeviceDynamicLayout {
  const int64_t* row_offsets = nullptr;  // rows + 1 entries
  const int32_t* col_indices = nullptr;  // `entries` entries
  int64_t rows = 0;
  int64_t entries = 0;
  int64_t heads = 1;                     // 1 (shared) or heads_q
  int32_t* errors = nullptr;             // optional: problems are added here (device memory on a GPU)
};

struct ForwardOptions {
  int64_t q_offset = 0, k_offset = 0;              // global positions of row 0 (chunks, ring steps)
  // CUstream of the caller (CUDA device). Everything a call enqueues is ordered on it, a plan's
  // first copy of its tables included; nothing synchronises, so any call (a first one too) may be
  // captured in a CUDA graph. A plan a graph ran is then kept (PlanCacheStats::in_graph): keep the
  // Attention alive while the graph is.
  void* stream = nullptr;
  const DynamicLayout* dynamic_layout = nullptr;   // host CSR table, for patterns with a dynamic layout
  // Or the table in device memory; one plan serves every such table (no re-planning per table).
  const DeviceDynamicLayout* device_dynamic_layout = nullptr;
  // Packed documents (FlashAttention's varlen API), on the host: cu_seqlens = {0, e_1, ..., seq},
  // non-decreasing, batch 1, seq_q == seq_k. Queries attend keys of their own document only, and
  // positions restart at 0 in each document; not with offsets. Each distinct list gets its plan.
  const std::vector<int64_t>* cu_seqlens = nullptr;
  // forward(): write O and the LSE only at the rows of work items that visit a key tile (they hold
  // every row that attends a key, whatever the tiles; a row among them that attends nothing gets
  // O = 0, LSE = -inf); every other row of o and lse keeps what it held. One step of ring attention
  // then costs its rows with work, not its whole chunk, and merges just the rows that attend
  // (plan_attending_rows). Default: every row is written. Not with device_dynamic_layout.
  bool rows_with_work_only = false;
  // backward(): bitwise-reproducible gradients (dK/dV added layer by layer, dQ by its own pass over
  // the forward plan: no atomics). Also the ATTNJIT_DETERMINISTIC knob. Otherwise the tensor-core
  // kernels add dQ with atomics in their single pass.
  bool deterministic = false;
  // backward(): the gradient of the loss with respect to the forward's lse output, fp32
  // [batch, heads_q, seq_q] like lse (last stride 1); null: zero. It enters each row's dS as
  // P * dlse (d lse / d S = P), so a loss that uses lse (merging partial attentions) is
  // differentiated exactly. Rows that attend nothing take none of it. forward() does not read it
  // (one ForwardOptions may serve both calls).
  const TensorView* dlse = nullptr;
  // backward() scratch memory from the caller (e.g. PyTorch's caching allocator) instead of the
  // driver's stream-ordered pool: device memory of the runtime's GPU, 256-byte aligned, at least
  // Attention::backward_workspace_bytes() bytes, not used by other work on the stream until the
  // backward's kernels have run. Null: the pool. The CPU and emu devices need none; forward()
  // does not read it.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // FP8 inputs (Problem::dtype fp8_e4m3): q, k and v hold codes whose values are the inputs divided
  // by these factors (FlashAttention-3's q_descale, k_descale, v_descale). Each is fp32 of shape
  // [batch, heads_kv] in the device's memory (host memory on the CPU and emu devices), by its
  // strides (0 and 0: one factor for the whole tensor; q's heads read their kv head's factor).
  // Required with fp8_e4m3 and refused otherwise. The scores are (q . k) * q_descale * k_descale *
  // scale and O is v_descale times the softmax of them applied to v's values.
  const TensorView* q_descale = nullptr;
  const TensorView* k_descale = nullptr;
  const TensorView* v_descale = nullptr;
};

struct RuntimeOptions {
  Device device = Device::cpu();
  std::string cache_dir;  // empty: the ATTNJIT_CACHE_DIR knob (or ~/.cache/attnjit)
  KernelConfig config;    // zeros: the tuning database's choice (or the path's default)
  // The backward kernels' tiles; zeros: the tuning database's backward entry (`attnjit tune
  // --backward`), else the path's default. Tuning on a miss covers the forward only.
  KernelConfig backward_config;
  bool tune = false;      // tune on a database miss (also the ATTNJIT_TUNE knob)
  // The bytes of plan tables each prepared attention keeps; -1: the ATTNJIT_PLAN_CACHE_BYTES knob
  // (default 256 MiB). See Attention::plan_cache_stats.
  int64_t plan_cache_bytes = -1;
  // Random layouts decided in the kernels instead of the plan (emu and CUDA devices) where a plan
  // would hash more than this many blocks (heads_q x query blocks x key blocks per random layout);
  // -1: the ATTNJIT_RANDOM_IN_KERNEL knob (default 2^26: BigBird past 256K tokens at 16 heads).
  // 0 decides every random layout in the kernels.
  int64_t random_in_kernel_above = -1;
  // On the Hopper path (sm_90a): the forward's TMA kernel (a producer warpgroup loads K and V) for
  // every call whose key rows tensor maps describe, and with wgmma_backward the backward's (a
  // producer loads Q and dO) for every call whose query rows they describe; false (or the
  // ATTNJIT_TMA=0 knob): always the kernels that load with cp.async.
  bool tma = true;
  // On the Hopper path (sm_90a, head dims 64 and 128): the backward's dK/dV kernel on the warpgroup
  // MMA (wgmma) instead of the sm_80 kernel's mma.sync. False (or the ATTNJIT_BWD_WGMMA=0 knob, or
  // a backward_config other than its fixed tiles) runs the sm_80 kernels.
  bool wgmma_backward = true;
  // The tensor-core forwards keep a row's running maximum until a tile's passes it by more than
  // 2^8 and rescale O only then (FlashAttention-4's lazy rescale: the same result, fewer multiplies);
  // also the ATTNJIT_LAZY_RESCALE=1 knob. Off by default until measured on a GPU.
  bool lazy_rescale = false;
  // The tensor-core forwards take every fourth n-tile's exponentials on the FMA pipe (a cubic,
  // relative error below 1e-4, far below fp16's and bf16's rounding) instead of the SFU
  // (FlashAttention-4); also the ATTNJIT_POLY_EXP2=1 knob. Off by default until measured on a GPU.
  bool poly_exp2 = false;
  // The forward computes a pair that several branches attend (LongNet's overlapping segments) once,
  // its probability weighted by the number of branches (every device; the backward's plans stay
  // per branch); false (or the ATTNJIT_PACK_BRANCHES=0 knob): once per branch, and kernels without
  // the weights. The same softmax either way; `attnjit dump SPEC --stage plan --pack-branches`
  // shows what is left out.
  bool pack_branches = true;
  // On the Hopper path (sm_90a): the TMA kernels in their persistent form (the forward, and the
  // backward's dK/dV kernel), launched with at most this many blocks, each taking work items in turn
  // (heaviest first) while its producer runs on into the next item's loads. -1: one block per SM
  // (the emu device stands for a GPU of 4 SMs); 0: one block per work item, as the other kernels.
  // Also the ATTNJIT_PERSISTENT=1 knob (-1). Off by default until a GPU has measured it.
  int persistent_blocks = 0;
  // Kernels are rendered from these templates instead of the embedded ones (tests render
  // deliberately broken kernels this way; a changed template changes the kernel's cache key).
  std::shared_ptr<const TemplateSet> templates;
};

class Runtime;
struct PreparedState;  // the plan(s), device tables and loaded kernel of one (pattern, problem)

// The plans a prepared attention keeps: one per distinct (offsets, dynamic table, documents),
// made and uploaded on first use. `bytes` counts their host tables (work items, key spans, tile
// entries, document starts; a GPU holds one copy more); above RuntimeOptions::plan_cache_bytes
// the least recently used are dropped (a plan still in use by a call lives until it returns), but
// never one a CUDA graph reads (`in_graph` counts them).
struct PlanCacheStats {
  int64_t plans = 0, bytes = 0;
  int64_t hits = 0, misses = 0, evictions = 0;
  int64_t in_graph = 0;
};

// A prepared attention: the plans (one per offsets/dynamic table/documents, made on first use and
// kept up to a byte budget), their device tables (uploaded once), and the loaded kernel. Copies
// share the same state.
class Attention {
public:
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse = nullptr, const ForwardOptions& options = {});
  // The gradients of forward() with respect to q, k and v, given dout = dL/dO: `o` and `lse` are
  // what forward() returned for these inputs and options; dq, dk, dv are written (same shapes and
  // dtype as q, k, v). The CPU device runs the plan executor; the emu and CUDA devices the
  // generated backward kernels (dK, dV accumulate in fp32 workspaces from the stream's pool).
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
                const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const ForwardOptions& options = {});
  // The gradients of forward() added into float32 accumulators: dq_acc += dL/dq, dk_acc += dL/dk,
  // dv_acc += dL/dv, for a caller that sums the gradients of several calls (one step of ring
  // attention's backward per call) and rounds them once. Only the rows with work are touched: the
  // key tiles no query attends and the query tiles that attend no key are skipped, and nothing is
  // zeroed, converted or computed per row of the call, so a call costs its attended pairs. `delta`
  // is D = rowsum(dout * o) - dlse per query row (dlse where the lse output is used, else 0), which
  // the caller computes once from the final o: float32 [batch, heads_q, seq_q], contiguous. The
  // accumulators are float32 and contiguous, of q's, k's and v's shapes; the forward's o is not
  // read. Not with ForwardOptions::dlse (it is in delta), device_dynamic_layout or FP8. The emu and
  // CUDA devices run the backward kernels with these accumulators as their fp32 workspaces (dQ
  // atomically added in the single pass, plainly by its own pass when deterministic); the CPU device
  // adds the plan executor's gradients.
  void backward_add(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                    const TensorView& dout, const TensorView& delta, const TensorView& dq_acc, const TensorView& dk_acc,
                    const TensorView& dv_acc, const ForwardOptions& options = {});
  // The attention weights, for inspection: w is float32, contiguous [batch, heads_q, seq_q, seq_k],
  // written whole with O = W V: W[b, h, i, j] is the softmax weight of key j for query i (a key
  // two branches attend appears once with its summed weight; the head_groups "mean" factor is
  // included; keys not attended and rows that attend nothing are 0). `lse` is what forward()
  // returned for these inputs and options. Computed on the host over the forward's plan (on a CUDA
  // device: after the caller's stream has finished, from copies of q, k and lse; w is then copied
  // back). Refused above ATTNJIT_MAX_WEIGHTS elements (default 2^28).
  void weights(const TensorView& q, const TensorView& k, const TensorView& lse, const TensorView& w,
               const ForwardOptions& options = {});
  const Pattern& pattern() const;
  const Problem& problem() const;
  // The generated kernel's name, or "cpu plan executor".
  std::string kernel_name() const;
  // The scratch bytes backward() needs on this device (0 on the CPU and emu devices): the size of
  // ForwardOptions::workspace when the caller supplies it.
  size_t backward_workspace_bytes() const;
  PlanCacheStats plan_cache_stats() const;

private:
  friend class Runtime;
  std::shared_ptr<PreparedState> state_;
};

// ---- attention over a paged KV cache: decode, chunked prefill, speculative decoding ----------
// The cache layout is vLLM's and FlashInfer's: K and V caches of pages [num_pages, page_size, Hkv,
// D] (V: Dv), page sizes 1 to 256, in any page order; request b's pages listed in its row of the
// block table. Queries are packed [total_q, Hq, D]: request b's n_b queries are its last n_b cached
// tokens, so query i sits at position kv_lens[b] - n_b + i and attends the keys at 0 ..
// kv_lens[b] - 1 the pattern allows there (the call equals Attention::forward with q_offset =
// kv_lens[b] - n_b over the request's gathered tokens). Only the tokens the pattern attends are read.
struct PagedProblem {
  int64_t heads_q = 1, heads_kv = 1;
  int64_t head_dim = kDefaultHeadDim, head_dim_v = kDefaultHeadDim;
  DType dtype = DType::BF16;      // q and o
  // The caches' dtype: empty (= dtype), or DType::E4M3 (FP8 e4m3, half of bf16's bytes), read as
  // stored value x the call's per-kv-head scale (PagedCall::k_scale, v_scale).
  std::optional<DType> kv_dtype;
};

// One call. Tensors (and the block table) in the runtime device's memory (host memory on the CPU
// and emu devices), each with last stride 1; lengths on the host.
struct PagedCall {
  TensorView q;                          // [total_q, Hq, D]
  TensorView k_cache, v_cache;           // [num_pages, page_size, Hkv, D] and [.., Hkv, Dv]
  const int32_t* block_table = nullptr;  // [requests, block_table_stride]: page indices
  int64_t block_table_stride = 0;        // entries per request: enough pages for its kv_len
  std::vector<int64_t> kv_lens;          // per request: cached tokens, the queries' own included
  std::vector<int64_t> cu_seqlens_q;     // 0 = c_0 <= ... <= c_B = total_q; empty: one query per request
  TensorView o;                          // [total_q, Hq, Dv], q's dtype
  const TensorView* lse = nullptr;       // optional: fp32 [total_q, Hq] (-inf: attended nothing)
  // Blocks sharing one work item's key tiles (split-KV, merged by LSE); 0: enough to fill the device.
  int32_t splits = 0;
  void* stream = nullptr;                // CUstream of the caller (CUDA device)
  // FP8 caches: K = stored value x k_scale[kv head], V likewise; fp32 [Hkv] in the device's memory
  // (host memory on the CPU and emu devices); null: 1. Only with kv_dtype fp8_e4m3.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // A counter (int32, the device's memory) of reads of a page outside the cache, whose keys are then
  // skipped as if masked; null: such keys read as NaN (a GPU), or the call is refused (CPU and emu
  // devices, which check the table on the host unless a counter is given: the emu device then runs
  // what a GPU would; the CPU device always checks).
  int32_t* errors = nullptr;
  // The lengths in device memory instead (kv_lens and cu_seqlens_q then empty): int32 kv lengths
  // [requests] and cu_seqlens_q [requests + 1] (null: one query per request). Such a call is
  // planned on the device, from what those arrays hold when its kernels run: no work on the host
  // per step and nothing read back, so a run() captured in a CUDA graph replays correctly while
  // lengths change. Lengths the kernels find wrong (fewer tokens than queries, more than the block
  // table's pages) make that request's rows NaN and are counted in `errors`; cu_seqlens_q entries
  // out of order or past total_q leave the request's rows unwritten, counted too.
  const int32_t* device_kv_lens = nullptr;
  const int32_t* device_cu_seqlens_q = nullptr;
  int64_t requests = 0;  // with device_kv_lens: entries of it
};

// CUDA graphs (a decode loop captured once): a step's tables in a workspace at a fixed address,
// sized for the most any step will need. PagedAttention::needs says what one call's plan takes.
struct PagedCapacity {
  int64_t requests = 0;  // requests (kv_lens entries)
  int64_t items = 0;     // work items of the plan
  int64_t spans = 0;     // key spans
  int64_t entries = 0;   // listed tiles (block layouts)
  int32_t splits = 1;    // blocks sharing an item at most (the grid's y)
};

struct PagedState;
// A prepared paged attention: the paged kernels rendered and loaded for (pattern, problem); each
// call plans its requests (one lowering per distinct (queries, kv_len)) and runs. On a GPU a page
// index outside the cache is never read: its keys are counted and skipped (PagedCall::errors) or
// read as NaN, so the rows attending them come out NaN (the CPU and emu devices refuse the call,
// naming the entry).
class PagedAttention {
public:
  void forward(const PagedCall& call);
  // CUDA graphs: plan() checks and plans the call and copies its tables into `workspace` in the
  // call's stream order (device memory of workspace_bytes(cap), 256-byte aligned; host memory on
  // the CPU and emu devices); it runs eagerly, never in a capture. run() launches the kernels over
  // the workspace with a grid of `cap` (blocks past the step's plan return at once), so a run()
  // captured once replays every later step whose plan() came before it on the stream; its call
  // must be plan()'s (the same tensors, lengths and splits). A plan above `cap` is refused by
  // plan(), naming the count (size `cap` from needs() at the largest batch and lengths served).
  // The CPU device has no graphs: its run() is forward().
  // A call with device lengths (PagedCall::device_kv_lens) needs no plan(): its run() plans on the
  // device first, so the captured run() alone replays a step. Its needs() depend only on the
  // requests, total_q and splits (the most items any lengths can make).
  PagedCapacity needs(const PagedCall& call) const;
  size_t workspace_bytes(const PagedCapacity& cap) const;
  void plan(const PagedCall& call, void* workspace, const PagedCapacity& cap);
  void run(const PagedCall& call, void* workspace, const PagedCapacity& cap);
  const Pattern& pattern() const;
  const PagedProblem& problem() const;
  std::string kernel_name() const;  // the generated kernel's, or "cpu plan executor"

private:
  friend class Runtime;
  std::shared_ptr<PagedState> state_;
};

class Runtime {
public:
  explicit Runtime(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Validates the problem against the pattern and the device, plans, compiles or loads the
  // kernel. Thread-safe.
  Attention prepare(const Pattern& pattern, const Problem& problem);
  // prepare() once per (pattern, problem) in this runtime's life: later calls return the same
  // Attention (attention() below and the Python package call this). Thread-safe.
  Attention prepared(const Pattern& pattern, const Problem& problem);
  // The paged forward for (pattern, problem): validated, kernels rendered and loaded. Thread-safe;
  // the PagedAttention's calls are too.
  PagedAttention prepare_paged(const Pattern& pattern, const PagedProblem& problem);
  const Device& device() const;

  struct Impl;

private:
  friend void attention(Runtime&, const Pattern&, const TensorView&, const TensorView&, const TensorView&,
                        const TensorView&, const TensorView*, const ForwardOptions&);
  std::unique_ptr<Impl> impl_;
};

// One call: prepare (cached by pattern hash and problem) and forward.
void attention(Runtime& rt, const Pattern& pattern, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& o, const TensorView* lse = nullptr, const ForwardOptions& options = {});

}  // namespace attnjit
#pragma GCC visibility pop
