// Rendering the backward kernels (templates/bwd_*.cuh): the path and tiles of a backward request,
// the shared memory of each kernel, and the source with its four entry points.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/codegen/codegen_internal.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {

using namespace codegen_detail;

namespace {

// Dynamic shared memory of the tensor-core backward kernels (templates/bwd_sm80.cuh): _dq holds Q
// and dO of its query tile and `stages` K/V tiles; _dkdv its K/V tile and two stages of Q, dO
// (with each row's LSE and D as floats), then dS for the single pass's dQ.
int backward_dq_smem_bytes(const KernelRequest& r, const KernelConfig& c) {
  const int dp = r.head_dim + 8, dvp = r.head_dim_v + 8;
  return 2 * (c.tile_q * (dp + dvp) + c.stages * c.tile_k * (dp + dvp));
}
// Columns of S (and dP) a warp of the tensor-core backward holds at once (AJ_BWD_SUB_MAX): 64, or
// 32 past head dim 64, so that 16-row slices of S and dP fit beside the 16 x head-dim
// accumulators without spilling.
int backward_sub_max(const KernelRequest& r) { return r.head_dim > 64 || r.head_dim_v > 64 ? 32 : 64; }
// ... and of _dq's S and dP (AJ_BWD_DQ_SUB_MAX): 16 past head dim 128 (q's), where its accumulator
// holds every column of dQ (128 floats a thread at head dim 256) and no slices shrink it.
int backward_dq_sub_max(const KernelRequest& r) { return r.head_dim > 128 ? 16 : backward_sub_max(r); }

// templates/bwd_sm90.cuh: K and V of the key tile, two stages of Q and dO, dS (64 x 64), two
// stages of LSE and D (64 floats each); the swizzled tiles stay 1024-byte aligned (their sizes
// are multiples of 8 KiB), and 1024 bytes more let the kernel align the start.
int backward_dkdv_sm90_smem_bytes(const KernelRequest& r, const KernelConfig& c) {
  return 2 * (c.tile_k * (r.head_dim + r.head_dim_v) + 2 * c.tile_q * (r.head_dim + r.head_dim_v) + c.tile_q * 64) +
         2 * 2 * c.tile_q * 4 + 1024;
}

// templates/bwd_sm90_tma.cuh's dQ staging rows (AJ_BWDT_DQ_PITCH, emitted with the kernel): 64
// floats of data and 8 more. A warp stores its block in 8-byte pairs, half a warp at a time: lanes
// g * 4 + quad of a half put rows g (0..3 or 4..7) and columns quad * 2 on banks g * 8 + quad * 2
// and + 1 (mod 32), all distinct, and the rows stay 16-byte aligned for the bulk reduce.
constexpr int kBwdTmaDqPitch = 72;

// templates/bwd_sm90_tma.cuh: K and V of the 128-key tile, `stages` stages of Q and dO, two dS
// buffers (64 x 128), two buffers of LSE and D (64 floats each), each consumer warpgroup's dQ
// block (64 rows of kBwdTmaDqPitch floats), a full and an empty mbarrier per stage, and 1024 bytes
// to align the start.
int backward_dkdv_sm90_tma_smem_bytes(const KernelRequest& r, const KernelConfig& c) {
  return 2 * (c.tile_k * (r.head_dim + r.head_dim_v) + c.stages * c.tile_q * (r.head_dim + r.head_dim_v) + 2 * c.tile_q * c.tile_k) +
         2 * 2 * c.tile_q * 4 + 2 * c.tile_q * kBwdTmaDqPitch * 4 + 2 * 8 * c.stages + 1024;
}

// templates/bwd_sm90_dq.cuh: Q and dO of the 64-row query tile, `stages` K/V tiles (fwd_sm90.cuh's
// swizzled layout: every piece a multiple of 8 KiB, so 1024-byte aligned), and 1024 bytes to align
// the start. Warpgroup 1's dQ sums (64 x head dim floats) reuse the K ring at the end.
int backward_dq_sm90_smem_bytes(const KernelRequest& r, const KernelConfig& c) {
  return 2 * (c.tile_q + c.stages * c.tile_k) * (r.head_dim + r.head_dim_v) + 1024;
}

int backward_dkdv_smem_bytes(const KernelRequest& r, const KernelConfig& c) {
  const int dp = r.head_dim + 8, dvp = r.head_dim_v + 8;
  // dS^T of the tile's keys by AJ_BWD_SUB_Q query rows, for the single pass's dQ = dS K.
  const int sub_q = std::min(c.tile_q, backward_sub_max(r));
  return 2 * (c.tile_k + 2 * c.tile_q) * (dp + dvp) + 2 * 2 * c.tile_q * 4 + 2 * c.tile_k * (sub_q + 8);
}

// Tiles of the tensor-core backward: the request's when set (powers of two 16..128, 2-4 stages,
// within the arch's shared memory), else 64 x 64 with two stages, halved (keys first) until both
// kernels fit.
KernelConfig resolve_backward_sm80_config(const KernelRequest& r) {
  auto bytes = [&](const KernelConfig& c) { return std::max(backward_dq_smem_bytes(r, c), backward_dkdv_smem_bytes(r, c)); };
  const auto pow2 = [](int t) { return t == 16 || t == 32 || t == 64 || t == 128; };
  KernelConfig c = r.config;
  if (!(c == KernelConfig{})) {
    if (!c.stages) c.stages = 2;
    require(c.warps == 0 || c.warps * 16 == c.tile_q, "backward warps",
            "the tensor-core backward runs 16 query rows per warp, so tile_q " + std::to_string(c.tile_q) + " takes " +
                std::to_string(c.tile_q / 16) + " warps, got " + std::to_string(c.warps) + "; leave warps at 0");
    require(pow2(c.tile_q) && pow2(c.tile_k), "backward tile",
            "the tensor-core backward needs tile_q and tile_k in {16, 32, 64, 128}, got " + std::to_string(c.tile_q) + "x" +
                std::to_string(c.tile_k));
    require(c.stages >= 2 && c.stages <= 4, "backward stages", "cp.async pipelines have 2 to 4 stages, got " + std::to_string(c.stages));
    require(bytes(c) <= shared_limit(r.arch), "backward tile",
            "backward tile " + std::to_string(c.tile_q) + "x" + std::to_string(c.tile_k) + " with " + std::to_string(c.stages) +
                " stages needs " + std::to_string(bytes(c)) + " bytes of shared memory, over " + arch_name(r.arch) + "'s " +
                std::to_string(shared_limit(r.arch)) + "; use smaller tiles");
    c.warps = c.tile_q / 16;
    return c;
  }
  c.tile_q = 64, c.tile_k = 64, c.stages = 2;
  while (bytes(c) > shared_limit(r.arch) && (c.tile_k > 16 || c.tile_q > 16)) {
    if (c.tile_k >= c.tile_q && c.tile_k > 16) c.tile_k /= 2;
    else c.tile_q /= 2;
  }
  require(bytes(c) <= shared_limit(r.arch), "config",
          "the backward kernels need " + std::to_string(bytes(c)) + " bytes of shared memory at their smallest tiles, over " +
              arch_name(r.arch) + "'s " + std::to_string(shared_limit(r.arch)));
  c.warps = c.tile_q / 16;
  return c;
}

}  // namespace

namespace codegen_detail {

// How many columns of S and dP a warp holds, the column slices of dK and dV, the TMA kernel's
// producer and dQ pitch.
std::string backward_defines(const KernelSource& k, const KernelRequest& r) {
  std::ostringstream os;
  if (k.path != KernelPath::Simt) {
    const BackwardSlices slices = backward_slices(r);
    os << "#define AJ_BWD_SUB_MAX " << backward_sub_max(r) << "\n#define AJ_BWD_DQ_SUB_MAX " << backward_dq_sub_max(r)
       << "\n#define AJ_BWD_SLICES " << slices.count
       << "\n#define AJ_BWD_DK_COLS " << slices.dk_cols << "\n#define AJ_BWD_DV_COLS " << slices.dv_cols << "\n";
  }
  if (k.path == KernelPath::Sm90Tma)  // bwd_sm90_tma.cuh
    os << "#define AJ_BWD_PRODUCER 1\n#define AJ_BWDT_DQ_PITCH " << kBwdTmaDqPitch << "\n";
  return os.str();
}
}  // namespace codegen_detail

BackwardSlices backward_slices(const KernelRequest& r) {
  // Up to 128 columns of dK and of dV in a warp's registers, as at head dim 128: past it, the
  // columns are cut into `count` slices of whole 16-column blocks, the last one narrower where
  // they do not divide (head dim 208: 112 and 96).
  BackwardSlices s;
  s.count = static_cast<int>((std::max(r.head_dim, r.head_dim_v) + 127) / 128);
  const auto width = [&](int64_t d) { return static_cast<int>(16 * ((d / 16 + s.count - 1) / s.count)); };
  s.dk_cols = width(r.head_dim), s.dv_cols = width(r.head_dim_v);
  return s;
}

bool wgmma_backward_head_dims(int64_t head_dim, int64_t head_dim_v) { return std::max(head_dim, head_dim_v) <= 128; }

KernelPath choose_backward_path(const KernelRequest& r) {
  // The tensor-core kernels keep 16 rows of dK and dV (or of dQ) in registers per warp; past head
  // dim 128 the sm_80 kernels' _dkdv keeps a slice of their columns at a time (backward_slices).
  require(r.dtype != DType::E4M3, "--dtype fp8_e4m3", "has no backward: FP8 attention is forward only; train in bf16 or fp16");
  const KernelPath forward_path = choose_path(r);  // what no path supports is refused as for the forward
  // The Hopper forward's backward when asked for (head dims 64 and 128): bwd_sm90_tma.cuh's dK/dV
  // kernel (TMA, a producer warpgroup), or bwd_sm90.cuh's (cp.async) where the request says no TMA;
  // else the sm_80 kernels, compiled for sm_90a.
  if (r.wgmma_backward && hopper(forward_path) && wgmma_backward_head_dims(r.head_dim, r.head_dim_v))
    return r.tma ? KernelPath::Sm90Tma : KernelPath::Sm90;
  return forward_path != KernelPath::Simt ? KernelPath::Sm80 : KernelPath::Simt;
}

// The sm_90a backward's tiles are fixed: 64 x 64, two stages, four warps (one warpgroup of 64 key
// rows, 64-row query tiles; bwd_sm90.cuh), which the two-pass form's _dq (bwd_sm90_dq.cuh) takes too.
// The TMA kernel's are 64 x 128 (two consumer warpgroups of 64 key rows; bwd_sm90_tma.cuh), and
// its two-pass form runs bwd_sm90_dq.cuh's _dq at those tiles.
KernelConfig resolve_backward_sm90_config(const KernelRequest& r, bool tma) {
  const KernelConfig fixed{64, tma ? 128 : 64, 2, 4};
  KernelConfig c = r.config;
  if (c == KernelConfig{}) return fixed;
  if (!c.stages) c.stages = 2;
  if (!c.warps) c.warps = 4;
  require(c == fixed, "backward tile",
          std::string("the sm_90a backward (wgmma") + (tma ? ", TMA) runs 64 x 128" : ") runs 64 x 64") +
              " tiles with 2 stages and 4 warps, got " + std::to_string(c.tile_q) + "x" +
              std::to_string(c.tile_k) + " s" + std::to_string(c.stages) + " w" + std::to_string(c.warps) +
              "; leave the backward config at its default, or turn the wgmma backward off");
  return c;
}

KernelRequest backward_fallback_request(KernelRequest r, const BackwardKernels& tma) {
  r.wgmma_backward = false;
  r.config = tma.source.config;
  return r;
}

KernelConfig resolve_backward_config(const KernelRequest& r) {
  switch (choose_backward_path(r)) {
    case KernelPath::Sm90: return resolve_backward_sm90_config(r, false);
    case KernelPath::Sm90Tma: return resolve_backward_sm90_config(r, true);
    case KernelPath::Sm80: return resolve_backward_sm80_config(r);
    default: return resolve_simt_config(r, r.config);
  }
}

BackwardKernels generate_backward_kernels(const Pattern& p, const KernelRequest& r, const TemplateSet& templates) {
  BackwardKernels out;
  KernelSource& k = out.source;
  k.path = choose_backward_path(r);
  k.config = resolve_backward_config(r);
  k.arch = arch_name(r);
  k.template_hash = templates.hash();
  const std::string predicate = generate_mask_predicate(p);
  k.has_mask = pattern_has_mask(p);
  k.seeks = kernel_seeks(p, r);
  k.persistent = r.persistent && k.path == KernelPath::Sm90Tma && !k.seeks;  // bwd_sm90_tma.cuh's _dkdv
  const char* body;       // _dq's (and _dkdv's unless dkdv_body says otherwise)
  const char* dkdv_body = nullptr;
  std::vector<std::string> bodies;
  if (k.path == KernelPath::Sm80) {
    out.dq_threads = k.config.tile_q * 2;
    out.dkdv_threads = k.config.tile_k * 2;
    out.dq_shared_bytes = backward_dq_smem_bytes(r, k.config);
    out.dkdv_shared_bytes = backward_dkdv_smem_bytes(r, k.config);
    out.single_pass = true;
    bodies = {"fwd_sm80.cuh", "bwd_common.cuh", "bwd_sm80.cuh"};
    body = "_sm80";
  } else if (k.path == KernelPath::Sm90) {
    out.dq_threads = 256;    // bwd_sm90_dq.cuh's _dq (the two-pass form): two warpgroups
    out.dkdv_threads = 128;  // one warpgroup
    out.dq_shared_bytes = backward_dq_sm90_smem_bytes(r, k.config);
    out.dkdv_shared_bytes = backward_dkdv_sm90_smem_bytes(r, k.config);
    out.single_pass = true;
    bodies = {"fwd_sm80.cuh", "fwd_sm90.cuh", "bwd_common.cuh", "bwd_sm80.cuh", "bwd_sm90.cuh", "bwd_sm90_dq.cuh"};
    body = "_sm90";
  } else if (k.path == KernelPath::Sm90Tma) {
    out.dq_threads = 256;    // bwd_sm90_dq.cuh's _dq (the two-pass form): two warpgroups
    out.dkdv_threads = 384;  // two consumer warpgroups and the producer
    out.dq_shared_bytes = backward_dq_sm90_smem_bytes(r, k.config);
    out.dkdv_shared_bytes = backward_dkdv_sm90_tma_smem_bytes(r, k.config);
    out.single_pass = true;
    k.tma_maps = kTmaMaps;  // Q's and dO's, per query stride: _dkdv's second parameter
    bodies = {"fwd_sm80.cuh",  "fwd_sm90.cuh", "fwd_sm90_tma.cuh", "bwd_common.cuh",
              "bwd_sm80.cuh", "bwd_sm90.cuh", "bwd_sm90_tma.cuh", "bwd_sm90_dq.cuh"};
    body = "_sm90";
    dkdv_body = "_sm90_tma";
  } else {
    out.dq_threads = k.config.tile_q * 4;
    out.dkdv_threads = k.config.tile_k * 4;
    bodies = {"fwd_simt.cuh", "bwd_common.cuh", "bwd_simt.cuh"};
    body = "";
  }
  k.threads = out.dq_threads;
  k.shared_bytes = std::max(out.dq_shared_bytes, out.dkdv_shared_bytes);
  std::ostringstream os;
  os << render_prefix("backward kernels", k, r, p, predicate, templates, bodies);
  os << "\n// ---- generated: entry points\n";
  const std::tuple<const char*, int, const char*> entries[] = {{"pre", out.aux_threads, ""},
                                                               {"dq", out.dq_threads, body},
                                                               {"dkdv", out.dkdv_threads, dkdv_body ? dkdv_body : body},
                                                               {"cvt", out.aux_threads, ""}};
  for (const auto& [suffix, threads, impl] : entries) {
    const bool maps = k.tma_maps && std::string(suffix) == "dkdv";  // the TMA kernel's maps
    os << "extern \"C\" __global__ void __launch_bounds__(" << threads << ", 1) AJ_KERNEL_NAME_" << suffix
       << "(const AjBwdParams p" << (maps ? ", const __grid_constant__ AjTmaMaps maps" : "") << ") {\n  aj_bwd_" << suffix
       << impl << (maps ? "(p, maps);" : "(p);") << "\n}\n";
  }
  name_by_hash(k, os.str(), "attnjit_bwd_");
  out.pre = k.name + "_pre", out.dq = k.name + "_dq", out.dkdv = k.name + "_dkdv", out.cvt = k.name + "_cvt";
  return out;
}

}  // namespace attnjit
