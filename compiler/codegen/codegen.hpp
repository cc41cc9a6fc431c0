// Code generation: a Pattern's masks plus a kernel configuration -> CUDA source, rendered from the
// embedded templates. What varies per call (lengths, pointers, strides, offsets, the plan tables)
// is a kernel argument; what is fixed here (head dims, dtype, tiles, stages, arch, the mask
// predicates) is a compile-time constant. A new sequence length never recompiles.
#pragma once

#include <optional>
#include <string>
#include <vector>

// Relative to this header, as it is installed too (include/attnjit/compiler/codegen/).
#include "../pattern/pattern.hpp"
#include "../support/types.hpp"
#include "templates.hpp"

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

// Sm90: the Hopper forward (sm_90a, wgmma; loads by cp.async); Sm90Tma: the same loop fed by a
// producer warp's TMA loads (the default where TMA can describe the key rows, see `tma` below).
enum class KernelPath { Simt, Sm80, Sm90, Sm90Tma };
const char* to_string(KernelPath p);

// "QxK" (that tile, the path's default stages and warps), "QxKwN" (N warps) or "default" (all
// zeros), as the CLI's --kernel-tile and a manifest's "tiles" write it; UserError if malformed.
KernelConfig parse_kernel_tile(const std::string& text);

struct KernelRequest {
  int head_dim = kDefaultHeadDim, head_dim_v = kDefaultHeadDim;
  DType dtype = DType::BF16;
  int arch = 80;  // compute capability as 10 * major + minor
  // The arch-specific features of sm_90a (wgmma): the forward takes the Hopper path where it
  // supports the request (fp16/bf16, head dims 64, 128 or 256), the sm_80 path otherwise; the
  // kernels are compiled for sm_90a and run only on compute capability 9.0.
  bool arch_specific = false;
  // On the Hopper path: the TMA kernel (KernelPath::Sm90Tma). A runtime asks for the cp.async
  // kernel (false) for calls whose key rows no tensor map describes (runtime/cuda/tma_maps.hpp).
  bool tma = true;
  // The pattern's random layouts are decided in the kernels (Plan::kernel_seeks, for shapes whose
  // plan would hash too many blocks): the kernels carry the seek. Kernels of patterns with a
  // dynamic layout always do; others never need it, and leave it out (it costs registers).
  bool random_in_kernel = false;
  // Some branch of the pattern has a block layout (Branch::layout). The Hopper path's default then
  // keeps 128 query rows at head dim 64, where it otherwise takes 192 (FlashAttention-3's tile): a
  // 192-row tile straddles the layout's blocks and computes up to 1.5x the pairs (docs/performance.md, "Tiles of 192 rows at head dim 64").
  // generate_kernel sets it from the pattern; a caller resolving configs for a pattern without
  // generating a kernel (the tuner's baseline) uses for_pattern.
  bool block_layouts = false;
  // The backward's dK/dV kernel on the warpgroup MMA (templates/bwd_sm90_tma.cuh, 64 x 128 tiles;
  // bwd_sm90.cuh without TMA, 64 x 64) where the forward takes the Hopper path at head dims 64 or
  // 128; else bwd_sm80.cuh's (RuntimeOptions::wgmma_backward, ATTNJIT_BWD_WGMMA=0 turns it off).
  bool wgmma_backward = true;
  // The tensor-core forwards' lazy rescale (AJ_LAZY_RESCALE; RuntimeOptions::lazy_rescale).
  bool lazy_rescale = false;
  // Part of the tensor-core forwards' exponentials on the FMA pipe (AJ_POLY_EXP2; RuntimeOptions::poly_exp2).
  bool poly_exp2 = false;
  // The forwards read a packed plan's key weights (AJ_KEY_WEIGHTS, where the pattern's plans can be
  // packed: branches_may_pack; RuntimeOptions::pack_branches). Off: they run Separate plans only.
  bool pack_branches = true;
  // The Hopper TMA kernels' persistent form (AJ_PERSISTENT: fewer blocks than work items, each
  // taking items in turn; RuntimeOptions::persistent_blocks): the forward, and the backward's
  // _dkdv. Other paths ignore it.
  bool persistent = false;
  // The toolchain and the driver take kernel parameters past 4 KB (CUDA 12.1 and later): the
  // persistent TMA forward stages O and stores it by TMA only then (its O maps pass 4 KB).
  bool large_params = true;
  // The paged forward: the KV caches' dtype where it is not `dtype` (fp8_e4m3, scaled per kv head).
  std::optional<DType> kv_dtype;
  // O's dtype where it is not `dtype`: FP8 inputs (dtype fp8_e4m3) write bf16 or fp16.
  std::optional<DType> out_dtype;
  KernelConfig config;
};

// The request for a call's kernels: its head dims (from the shape), element type and arch; every
// other field at its default. Everything that turns a problem into kernels (the runtime's devices,
// the tuner, the precompiler, the CLI, Python) starts from this one function.
KernelRequest kernel_request(const Shape& s, DType dtype, int arch, bool arch_specific);

// `r` with what the default configuration depends on taken from the pattern (block_layouts).
KernelRequest for_pattern(KernelRequest r, const Pattern& p);

// "sm_80" -> {80, false}, "sm_90a" -> {90, true}; UserError naming the flag otherwise.
struct ArchName {
  int arch = 0;
  bool specific = false;
};
ArchName parse_arch_name(const std::string& text, const std::string& flag = "--arch");
// The name NVRTC and the cache use: "sm_90a" for an arch-specific request.
std::string arch_name(const KernelRequest& r);

// Whether an NVIDIA GPU has this arch (10 * major + minor, sm_60 and newer: those attnjit generates
// kernels for), and the list for errors ("sm_60, sm_61, ..., sm_90, sm_90a, ..."). The emulator
// models only these.
bool is_gpu_arch(int arch);
std::string gpu_arch_list();

// Tensor maps the TMA kernel takes per K and V: one per key stride (dilation) of a plan. LongNet
// has five rates; 8 pairs of maps are 2 KB of the kernel's parameters.
constexpr int kTmaMaps = 8;

struct KernelSource {
  std::string name;           // attnjit_fwd_<12 hex of the source>
  std::string source;         // complete, self-contained CUDA text
  std::string arch;           // "sm_80"
  KernelPath path = KernelPath::Simt;
  KernelConfig config;        // resolved (no zeros)
  int threads = 0;            // block size
  int shared_bytes = 0;       // dynamic shared memory the launch needs
  bool has_mask = false;      // some branch has a causal, window or layout predicate
  bool seeks = false;         // carries the seek (kernel_seeks): runs plans that leave layouts to it
  bool key_weights = false;   // a forward that weighs a packed plan's keys (AJ_KEY_WEIGHTS): runs packed plans
  int tma_maps = 0;           // Sm90Tma: tensor maps per K and V (the kernel's second parameter, AjTmaMaps)
  bool persistent = false;    // Sm90Tma without the seek: the forward (or the backward's _dkdv) launched with at most
                              // one block per SM (AJ_PERSISTENT)
  int q_buffers = 0;          // the Sm90Tma forward's Q buffers (AJ_Q_BUFFERS): 2 where persistent and they fit, else 1
  bool o_staged = false;      // the Sm90Tma forward stores O by TMA from shared memory (AJ_O_STAGED): persistent, where it fits;
                              // its maps parameter then holds O's maps too (past 4 KB of parameters: CUDA 12.1 or later)
  std::string template_hash;  // of the templates it was rendered from
  std::string source_hash;    // sha256 of `source` (part of the cache key)
};

// The path a request takes: tensor cores for fp16/bf16 on sm_80+, SIMT otherwise (fp32 arithmetic
// on every dtype: fp16/bf16 are converted as they are loaded). FP8 inputs (fp8_e4m3) take tensor
// cores: KernelPath::Sm90 on sm_90a at head dims 64 and 128 (templates/fwd_sm90_fp8.cuh, wgmma on
// e4m3 operands), KernelPath::Sm80 on sm_89 and newer at 64, 128 and 256
// (templates/fwd_sm89_fp8.cuh, mma.sync m16n8k32; sm_90a's head dim 256 too); the SIMT path
// elsewhere (codes decoded exactly). All round P to e4m3 alike (docs/spec.md, "FP8 inputs"). Rejects what no path supports (head dims that are not multiples
// of 16 on the tensor path, archs below sm_60) with a UserError naming the fix.
KernelPath choose_path(const KernelRequest& r);
KernelConfig resolve_config(const KernelRequest& r);

// Renders the kernel. Deterministic: the same pattern masks, request and templates give the same
// bytes (and so the same name and cache key).
KernelSource generate_kernel(const Pattern& p, const KernelRequest& r,
                             const TemplateSet& templates = TemplateSet::embedded());

// The backward pass: one source with four entry points: `pre` (D = rowsum(dO * O)), `dq` (over
// the forward plan, `dq_threads` per block), `dkdv` (over the key-major plan, `dkdv_threads` per
// block) and `cvt` (fp32 workspaces to dK, dV); `pre` and `cvt` run `aux_threads` per block
// (templates/bwd_common.cuh). `source.path` says which gradient kernels: the tensor-core ones
// (templates/bwd_sm80.cuh) for fp16/bf16 on sm_80+ (past head dim 128 by column slices,
// backward_slices), with dynamic shared memory (`dq_shared_bytes`, `dkdv_shared_bytes`), else the
// SIMT ones (templates/bwd_simt.cuh, fp32 arithmetic, static shared memory). Its tiles are the backward's own (`source.config`: the
// request's config when set, else the path's default), and the plans of a backward call are made
// with them.
struct BackwardKernels {
  KernelSource source;
  std::string pre, dq, dkdv, cvt;
  int dq_threads = 0, dkdv_threads = 0, aux_threads = 128;
  int dq_shared_bytes = 0, dkdv_shared_bytes = 0;
  // _dkdv can also add dQ = dS K into an fp32 accumulator (the tensor-core kernels), so that one
  // pass over the key-major plan gives all three gradients; the SIMT kernels always run _dq.
  bool single_pass = false;
};
KernelPath choose_backward_path(const KernelRequest& r);
// The head dims the Hopper backward's wgmma dK/dV kernels take (64 and 128, and any mix of them up
// to 128): past them the sm_80 kernels run even where the wgmma backward is asked for.
bool wgmma_backward_head_dims(int64_t head_dim, int64_t head_dim_v);
// How the tensor-core _dkdv cuts dK's and dV's columns (AJ_BWD_SLICES, AJ_BWD_DK_COLS,
// AJ_BWD_DV_COLS): one slice up to head dim 128; past it, `count` slices of at most 128 columns,
// each a walk over the key tile's query tiles that recomputes S^T and dP^T over the whole head dim
// and adds its columns of dK, dV (and, in the single pass, of dQ). Slice i holds columns
// [i * dk_cols, min(head_dim, (i + 1) * dk_cols)) of dK, and likewise of dV.
struct BackwardSlices {
  int count = 1, dk_cols = 0, dv_cols = 0;
};
BackwardSlices backward_slices(const KernelRequest& r);
// What a TMA backward (KernelPath::Sm90Tma) falls back to for calls whose query rows no tensor map
// describes: the request for bwd_sm80.cuh's kernels at the same tiles, so the same backward plans.
KernelRequest backward_fallback_request(KernelRequest r, const BackwardKernels& tma);
// r.config for the backward kernels validated (a UserError naming the fix), or their default.
KernelConfig resolve_backward_config(const KernelRequest& r);
BackwardKernels generate_backward_kernels(const Pattern& p, const KernelRequest& r,
                                          const TemplateSet& templates = TemplateSet::embedded());

// The paged forward (templates/fwd_paged.cuh; decode and chunked prefill over a paged KV cache):
// `forward` runs a paged plan's items x splits blocks (grid x: items, y: splits), `merge` its items
// when splits > 1, both `threads` per block with static shared memory. On tensor cores where
// choose_paged_path says so (16 x 64 tiles); else SIMT with fp32 arithmetic on every dtype and arch
// (sm_60+), whose config is tile_q query rows per work item (default 16, up to 64) and tile_k keys
// per tile (16, 32 or 64; default 32); past head dim 128 the defaults shrink to 16 keys and then 8
// rows, to fit 48 KB of static shared memory.
// `plan` (one block of `threads`) plans a step on the device from lengths in device memory
// (templates/plan_paged.cuh) for `heads`' query heads, whose classes (paged_head_classes) the
// source holds as tables; kernels of patterns with a block layout carry the seek for every layout
// branch, which that planner leaves to them.
struct PagedHeads {
  int64_t heads_q = 1, heads_kv = 1;
};
struct PagedKernels {
  KernelSource source;
  std::string forward, merge, plan;
  int threads = 128;
};
// The paged forward's path: tensor cores (KernelPath::Sm80, templates/fwd_paged_tc.cuh: 16 rows,
// 64-key tiles, mma.sync on sm_80 and newer) for fp16/bf16 queries with head dims that are
// multiples of 16 up to 128, unless other tiles are asked for; SIMT (fwd_paged.cuh) otherwise.
KernelPath choose_paged_path(const KernelRequest& r);
KernelConfig resolve_paged_config(const KernelRequest& r);
PagedKernels generate_paged_kernels(const Pattern& p, const KernelRequest& r, const PagedHeads& heads = {},
                                    const TemplateSet& templates = TemplateSet::embedded());

// The mask predicate alone (the generated part between the templates), for tests and dumps. With
// `seek_every_layout` the seek functions cover every branch with a layout (the paged forward, whose
// device planner leaves every layout to the kernel), not only those pattern_may_seek names.
std::string generate_mask_predicate(const Pattern& p, bool seek_every_layout = false);
// Does some branch have a block layout?
bool pattern_has_layout(const Pattern& p);
// Does some branch have a causal, window or layout condition (so partial tiles run a predicate)?
bool pattern_has_mask(const Pattern& p);
// Can the kernels be asked to decide one of the pattern's layouts (a dynamic table read on the
// device, a random layout above the planning threshold: Plan::kernel_seeks)? The mask predicate
// then holds the seek functions, compiled where the kernel seeks (kernel_seeks).
bool pattern_may_seek(const Pattern& p);
// Does a kernel for this request carry the seek (AJ_KERNEL_SEEK): a dynamic layout, or random
// layouts with KernelRequest::random_in_kernel?
bool kernel_seeks(const Pattern& p, const KernelRequest& r);

}  // namespace attnjit
#pragma GCC visibility pop
