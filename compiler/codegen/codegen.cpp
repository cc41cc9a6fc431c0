// Rendering kernels from templates: the instantiation header, the mask predicate, the entry point.
#include "compiler/codegen/codegen.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <sstream>
#include <string_view>

#include "compiler/support/sha256.hpp"
#include "compiler/plan/paged_plan.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/parse_int.hpp"

namespace attnjit {

const char* to_string(KernelPath p) {
  return p == KernelPath::Simt ? "simt" : p == KernelPath::Sm80 ? "sm80" : p == KernelPath::Sm90 ? "sm90" : "sm90_tma";
}

ArchName parse_arch_name(const std::string& text, const std::string& flag) {
  // Compute capabilities are 10 * major + minor: two or three digits (sm_121). The bound only keeps
  // a number past 32 bits from wrapping to one that looks valid.
  constexpr int64_t kMaxArch = 9999;
  const std::string expected = "expected sm_XX or sm_XXa, e.g. sm_80, sm_90 or sm_90a";
  if (text.compare(0, 3, "sm_") != 0) throw UserError(flag + " " + text, expected);
  std::string_view digits = std::string_view(text).substr(3);
  const bool specific = !digits.empty() && digits.back() == 'a';
  if (specific) digits.remove_suffix(1);
  const ParsedInt n = read_int(digits, 10, kMaxArch);
  if (n.status == IntText::NotInteger) throw UserError(flag + " " + text, expected);
  if (n.status == IntText::OutOfRange)
    throw UserError(flag + " " + text, expected + "; the arch number must lie in [10, " + std::to_string(kMaxArch) +
                                           "], got " + std::string(digits));
  const int arch = static_cast<int>(n.value);
  if (specific && arch != 90)
    throw UserError(flag + " " + text, "attnjit has arch-specific kernels for sm_90a only; use sm_" + std::to_string(arch));
  return {arch, specific};
}

std::string arch_name(const KernelRequest& r) { return "sm_" + std::to_string(r.arch) + (r.arch_specific ? "a" : ""); }

namespace {
constexpr int kGpuArchs[] = {60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121};
}  // namespace

bool is_gpu_arch(int arch) { return std::find(std::begin(kGpuArchs), std::end(kGpuArchs), arch) != std::end(kGpuArchs); }

std::string gpu_arch_list() {
  std::string out;
  for (int a : kGpuArchs) out += (out.empty() ? "" : ", ") + ("sm_" + std::to_string(a)) + (a == 90 ? ", sm_90a" : "");
  return out;
}

namespace {

// Shared memory a block may use on each arch (bytes, with the opt-in above 48 KB where it exists).
// Hopper and datacenter Blackwell (sm_90, sm_100, sm_103, sm_110) have 228 KB per SM; consumer
// Blackwell (sm_120, sm_121) has Ampere's GeForce 100 KB.
int shared_limit(int arch) {
  if (arch >= 90 && arch < 120) return 227 * 1024;
  if (arch == 80 || arch == 87) return 163 * 1024;
  if (arch >= 86) return 99 * 1024;
  if (arch == 75) return 64 * 1024;
  return 48 * 1024;
}

// Shared memory of one SM, which the blocks resident on it share (each also takes 1 KB the system
// reserves, on sm_80 and newer).
int shared_per_sm(int arch) { return arch >= 75 ? shared_limit(arch) + 1024 : 64 * 1024; }

std::string arch_name(int arch) { return "sm_" + std::to_string(arch); }

// The tensor-core forward keeps its warp's Q fragments in registers when they take at most 32 of
// them per thread (templates/fwd_sm80.cuh reads Q from shared memory at every tile otherwise).
bool q_in_registers(const KernelRequest& r, const KernelConfig& c) {
  return c.tile_q / (16 * c.warps) * r.head_dim <= 128;
}

// Dynamic shared memory of the tensor-core forward: K and V stages, then the Q tile, which either
// has its own space or (q_over_kv) lies over the last V stage: that stage is first written by the
// first prefetch of the main loop, after Q has moved to registers.
// The epilogue lays the O tile ([tile_q][head_dim_v + 8]) over all of it.
int forward_sm80_smem_bytes(const KernelRequest& r, const KernelConfig& c, bool q_over_kv) {
  const int dp = r.head_dim + 8, dvp = r.head_dim_v + 8;
  const int q = c.tile_q * dp, kv = c.stages * c.tile_k * (dp + dvp), v_stage = c.tile_k * dvp;
  return 2 * std::max(q_over_kv ? kv - v_stage + std::max(v_stage, q) : kv + q, c.tile_q * dvp);
}

// Q over the last V stage costs each work item one wait for its first tiles before the pipeline
// fills, so it is taken only where the shared memory it saves lets one more block onto an SM
// (blocks of 4 warps at up to 255 registers: two per SM at most by registers).
bool q_over_kv(const KernelRequest& r, const KernelConfig& c) {
  if (!q_in_registers(r, c)) return false;
  const int by_registers = std::max(1, 65536 / (255 * 32 * c.warps));
  auto blocks = [&](bool over) {
    return std::min(by_registers, shared_per_sm(r.arch) / (forward_sm80_smem_bytes(r, c, over) + 1024));
  };
  return blocks(true) > blocks(false);
}

// Dynamic shared memory of the Hopper forward (templates/fwd_sm90.cuh): the Q tile and the K/V
// stages, unpadded (the 128-byte swizzle keeps wgmma's reads off each other's banks), and 1024
// bytes to start them on the swizzle pattern's boundary. The FP8 kernels (fwd_fp8.cuh's tiles, on
// sm_90a and sm_89) lay out the same: bytes of Q, then K and V^T tiles a stage.
// The TMA kernel adds four mbarriers per stage (full and empty, for K and for V) and two per Q
// buffer; a persistent one may take two Q buffers (forward_q_buffers).
int forward_sm90_smem_bytes(const KernelRequest& r, const KernelConfig& c, bool tma, int q_buffers = 1) {
  const int bytes = dtype_bytes(r.dtype);  // 1 for FP8
  return bytes * (q_buffers * c.tile_q * r.head_dim + c.stages * c.tile_k * (r.head_dim + r.head_dim_v)) + 1024 +
         (tma ? 4 * 8 * c.stages + 2 * 8 * q_buffers : 0);
}

// The TMA forward's Q buffers (AJ_Q_BUFFERS): two for a persistent kernel where they fit, so the
// next item's Q lands while this item's loop runs; else one.
int forward_q_buffers(const KernelRequest& r, const KernelConfig& c, bool persistent) {
  return persistent && forward_sm90_smem_bytes(r, c, true, 2) <= shared_limit(r.arch) ? 2 : 1;
}

// O's staging tile (AJ_O_STAGED: O stored by TMA, the store under the next item's loop): a
// persistent kernel's, where it fits beside the Q buffers.
int forward_o_staging_bytes(const KernelRequest& r, const KernelConfig& c) { return c.tile_q * r.head_dim_v * dtype_bytes(r.dtype); }
bool forward_o_staged(const KernelRequest& r, const KernelConfig& c, bool persistent, int q_buffers) {
  return persistent && r.large_params && forward_sm90_smem_bytes(r, c, true, q_buffers) + forward_o_staging_bytes(r, c) <= shared_limit(r.arch);
}
bool hopper(KernelPath p) { return p == KernelPath::Sm90 || p == KernelPath::Sm90Tma; }

bool fp8_sm89(KernelPath path, const KernelRequest& r) { return path == KernelPath::Sm80 && r.dtype == DType::E4M3; }

int smem_bytes(KernelPath path, const KernelRequest& r, const KernelConfig& c) {
  if (path == KernelPath::Simt) return 0;  // static shared memory, checked by its own limit
  if (hopper(path) || fp8_sm89(path, r)) return forward_sm90_smem_bytes(r, c, path == KernelPath::Sm90Tma);
  return forward_sm80_smem_bytes(r, c, q_over_kv(r, c));
}

void require(bool ok, const std::string& where, const std::string& message) {
  if (!ok) throw UserError(where, message);
}

KernelConfig resolve_simt_config(const KernelRequest& r, KernelConfig c) {
  if (!c.tile_q) c.tile_q = 32;
  if (!c.tile_k) {
    c.tile_k = 32;
    while (c.tile_k > 1 && c.tile_k * (r.head_dim + r.head_dim_v) * 4 > 48 * 1024) c.tile_k /= 2;
  }
  c.stages = 1;
  require(c.warps == 0 || c.warps == c.tile_q / 8, "warps",
          "the SIMT path runs tile_q / 8 warps (4 threads per query row), so tile_q " + std::to_string(c.tile_q) +
              " takes " + std::to_string(c.tile_q / 8) + ", got " + std::to_string(c.warps) + "; leave warps at 0");
  c.warps = c.tile_q / 8;
  require(c.tile_q >= 8 && c.tile_q <= 64 && c.tile_q % 8 == 0, "tile_q",
          "the SIMT path needs tile_q in {8, 16, ..., 64}, got " + std::to_string(c.tile_q));
  require(c.tile_k >= 1 && c.tile_k <= 64, "tile_k", "the SIMT path needs tile_k in [1, 64], got " + std::to_string(c.tile_k));
  require(c.tile_k * (r.head_dim + r.head_dim_v) * 4 <= 48 * 1024, "tile_k",
          "K and V tiles of " + std::to_string(c.tile_k) + " keys exceed 48 KB of static shared memory; use a smaller tile_k");
  return c;
}

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

// The instantiation header (head dims, dtype, tiles, stages, arch as constants) and the shared
// templates with the mask predicate, then `bodies`.
std::string render_prefix(const char* kind, const KernelSource& k, const KernelRequest& r, const Pattern& p,
                          const std::string& predicate, const TemplateSet& templates, const std::vector<std::string>& bodies,
                          bool forward = false, bool paged = false) {
  std::ostringstream os;
  os << "// attnjit generated " << kind << ": path=" << to_string(k.path) << " arch=" << k.arch << " dtype=" << to_string(r.dtype)
     << (r.out_dtype && *r.out_dtype != r.dtype ? std::string(" out_dtype=") + to_string(*r.out_dtype) : "")
     << " head_dim=" << r.head_dim << " head_dim_v=" << r.head_dim_v << " tile=" << k.config.tile_q << "x"
     << k.config.tile_k << " stages=" << k.config.stages << " warps=" << k.config.warps << "\n";
  os << "// Sequence lengths, strides, offsets and the plan tables are kernel arguments (AjParams).\n";
  os << "#define AJ_HEAD_DIM " << r.head_dim << "\n#define AJ_HEAD_DIM_V " << r.head_dim_v << "\n";
  os << "#define AJ_TILE_Q " << k.config.tile_q << "\n#define AJ_TILE_K " << k.config.tile_k << "\n";
  os << "#define AJ_STAGES " << k.config.stages << "\n#define AJ_WARPS " << k.config.warps << "\n";
  if (k.path != KernelPath::Simt && !forward) {
    const BackwardSlices slices = backward_slices(r);
    os << "#define AJ_BWD_SUB_MAX " << backward_sub_max(r) << "\n#define AJ_BWD_DQ_SUB_MAX " << backward_dq_sub_max(r)
       << "\n#define AJ_BWD_SLICES " << slices.count
       << "\n#define AJ_BWD_DK_COLS " << slices.dk_cols << "\n#define AJ_BWD_DV_COLS " << slices.dv_cols << "\n";
  }
  if (k.path == KernelPath::Sm90Tma && !forward)  // bwd_sm90_tma.cuh
    os << "#define AJ_BWD_PRODUCER 1\n#define AJ_BWDT_DQ_PITCH " << kBwdTmaDqPitch << "\n";
  // fwd_sm80.cuh's softmax: the running maximum moves only past 8 (log2 units) above itself.
  // (Not for FP8: a maximum kept 2^8 below the row's would put 2^8 P past e4m3's 448.)
  if (r.lazy_rescale && forward && k.path != KernelPath::Simt && r.dtype != DType::E4M3) os << "#define AJ_LAZY_RESCALE 8.0f\n";
  // ... and every AJ_POLY_EXP2-th n-tile's exponentials by aj_ex2_poly.
  if (r.poly_exp2 && forward && k.path != KernelPath::Simt) os << "#define AJ_POLY_EXP2 4\n";
  // The forward of a pattern whose plans may be packed weighs its weighted keys (aj_tc_weigh).
  if (k.key_weights) os << "#define AJ_KEY_WEIGHTS 1\n";
  // fwd_sm90_tma.cuh's and bwd_sm90_tma.cuh's persistent blocks
  if (k.persistent) os << "#define AJ_PERSISTENT 1\n";
  if (k.path == KernelPath::Sm80 && !paged && !fp8_sm89(k.path, r)) {
    // Where the tensor-core forward keeps Q (both decided here, with the shared memory they take).
    os << "#define AJ_Q_IN_REGS " << q_in_registers(r, k.config) << "\n#define AJ_Q_OVER_KV "
       << (forward && q_over_kv(r, k.config)) << "\n";
  } else if (hopper(k.path) || (fp8_sm89(k.path, r) && !paged)) {
    os << "#define AJ_Q_IN_REGS 0\n#define AJ_Q_OVER_KV 0\n";  // fwd_sm80.cuh's, unused here
    if (k.tma_maps) os << "#define AJ_TMA_MAPS " << k.tma_maps << "\n";
    if (k.q_buffers) os << "#define AJ_Q_BUFFERS " << k.q_buffers << "\n";
    if (k.o_staged) os << "#define AJ_O_STAGED 1\n";
  }
  auto dtype_code = [](DType d) { return d == DType::F32 ? 0 : d == DType::F16 ? 1 : d == DType::BF16 ? 2 : 3; };
  os << "#define AJ_DTYPE " << dtype_code(r.dtype) << "\n";
  if (r.out_dtype && *r.out_dtype != r.dtype) os << "#define AJ_OUT_DTYPE " << dtype_code(*r.out_dtype) << "\n";
  // Layouts the plan leaves to the kernel (AjParams::seek_branches): the tile cursor asks them.
  if (k.seeks) os << "#define AJ_KERNEL_SEEK 1\n";
  auto include = [&](const std::string& name) { os << "\n// ---- templates/" << name << "\n" << templates.text(name); };
  for (const char* name : kBlockFiles) include(name);
  include("kernel_abi.h");
  include("common.cuh");
  include("mask_lib.cuh");
  os << "\n// ---- generated: mask predicate of partial tiles\n" << predicate;
  for (const std::string& b : bodies) include(b);
  return os.str();
}

// Names the kernel after the hash of its text: AJ_KERNEL_NAME becomes `prefix` + 12 hex digits
// everywhere, so equal sources share a name and different ones never do.
void name_by_hash(KernelSource& k, std::string source, const std::string& prefix) {
  k.name = prefix + sha256_hex(source).substr(0, 12);
  const std::string placeholder = "AJ_KERNEL_NAME";
  for (size_t at; (at = source.find(placeholder)) != std::string::npos;) source.replace(at, placeholder.size(), k.name);
  k.source = std::move(source);
  k.source_hash = sha256_hex(k.source);
}

}  // namespace

KernelPath choose_path(const KernelRequest& r) {
  require(r.arch >= 60, "--arch " + arch_name(r.arch), "attnjit needs sm_60 or newer");
  require(r.head_dim >= 1 && r.head_dim_v >= 1, "--head-dim", "head dims must be positive");
  require(!r.out_dtype || *r.out_dtype == r.dtype || (r.dtype == DType::E4M3 && *r.out_dtype != DType::F32 &&
                                                        *r.out_dtype != DType::E4M3),
          "--out-dtype " + std::string(r.out_dtype ? to_string(*r.out_dtype) : ""),
          "only fp8_e4m3 inputs have an output of another dtype, bf16 or fp16");
  // Below sm_80 fp16 and bf16 take the SIMT path, which converts them to fp32 as it loads them and
  // does all arithmetic in fp32: sm_60/61 have no fast half arithmetic, and bf16 has none before sm_80.
  require(!r.arch_specific || r.arch == 90, "--arch " + arch_name(r), "attnjit has arch-specific kernels for sm_90a only");
  // FP8 at head dims 64 and 128: wgmma on e4m3 operands on sm_90a (fwd_sm90_fp8.cuh), mma.sync
  // m16n8k32 on sm_89 and newer (fwd_sm89_fp8.cuh, the Sm80 path), which takes head dim 256 too
  // (sm_90a's included: no wgmma swizzle has 256-byte rows); elsewhere the SIMT kernel.
  auto fp8_dim = [](int64_t d) { return d == 64 || d == 128; };
  auto fp8_sm89_dim = [&](int64_t d) { return fp8_dim(d) || d == 256; };
  if (r.dtype == DType::E4M3) {
    if (r.arch_specific && fp8_dim(r.head_dim) && fp8_dim(r.head_dim_v)) return KernelPath::Sm90;
    if (r.arch >= 89 && fp8_sm89_dim(r.head_dim) && fp8_sm89_dim(r.head_dim_v)) return KernelPath::Sm80;
  }
  if (r.dtype != DType::F32 && r.dtype != DType::E4M3 && r.arch >= 80) {
    auto hopper_dim = [](int d) { return d == 64 || d == 128 || d == 256; };
    if (r.arch_specific && hopper_dim(r.head_dim) && hopper_dim(r.head_dim_v)) return r.tma ? KernelPath::Sm90Tma : KernelPath::Sm90;
    require(r.head_dim % 16 == 0 && r.head_dim_v % 16 == 0 && r.head_dim <= 256 && r.head_dim_v <= 256, "--head-dim",
            "the tensor-core path needs head dims that are multiples of 16 up to 256 (got " +
                std::to_string(r.head_dim) + " and " + std::to_string(r.head_dim_v) + "); pad the head dim");
    return KernelPath::Sm80;
  }
  require(r.head_dim % 4 == 0 && r.head_dim_v % 4 == 0 && r.head_dim <= 256 && r.head_dim_v <= 256, "--head-dim",
          "the SIMT path needs head dims that are multiples of 4 up to 256 (got " + std::to_string(r.head_dim) +
              " and " + std::to_string(r.head_dim_v) + ")");
  return KernelPath::Simt;
}

KernelConfig parse_kernel_tile(const std::string& text) {
  KernelConfig c;
  if (text == "default") return c;
  // Tiles of 1 to 1024 rows and keys (as the plan's, parse_tile_config), at most 32 warps (1024
  // threads); resolve_config then checks what the kernel's path takes.
  constexpr int64_t kMaxTile = 1024, kMaxWarps = 32;
  auto bad = [&](const std::string& detail = "") {
    return UserError("--kernel-tile " + text, "expected QxK, QxKwN (N warps) or default, e.g. 128x64 or 128x64w4" + detail);
  };
  const std::string_view all(text);
  const size_t w = all.find('w');
  const std::string_view tile = all.substr(0, w);
  const size_t x = tile.find('x');
  if (x == std::string_view::npos) throw bad();
  auto number = [&](std::string_view part, const char* what, int64_t max) {
    const ParsedInt r = read_int(part, 1, max);
    if (r.status == IntText::NotInteger) throw bad();
    if (r.status == IntText::OutOfRange)
      throw bad("; " + std::string(what) + " must lie in [1, " + std::to_string(max) + "], got " + std::string(part));
    return static_cast<int>(r.value);
  };
  c.tile_q = number(tile.substr(0, x), "Q", kMaxTile);
  c.tile_k = number(tile.substr(x + 1), "K", kMaxTile);
  if (w != std::string_view::npos) c.warps = number(all.substr(w + 1), "N", kMaxWarps);
  return c;
}

namespace {

// The FP8 tensor-core kernels' tiles: 64 or 128 query rows (16 a warp), one key tile, two stages
// (fwd_fp8.cuh). The Hopper kernel (fwd_sm90_fp8.cuh) takes 128 keys a tile, one warpgroup per 64
// rows (V^T's rows: the 128-byte swizzle); the sm_89 one (fwd_sm89_fp8.cuh) 64 (the 64-byte swizzle).
KernelConfig resolve_fp8_config(KernelConfig c, bool wgmma) {
  const std::string path = wgmma ? "the FP8 sm_90a path" : "the FP8 sm_89 path";
  const int tile_k = wgmma ? 128 : 64;
  if (!c.tile_q) c.tile_q = 128;
  if (!c.tile_k) c.tile_k = tile_k;
  if (!c.stages) c.stages = 2;
  if (!c.warps) c.warps = c.tile_q / 16;
  require(c.tile_q == 64 || c.tile_q == 128, "tile_q", path + " needs tile_q 64 or 128, got " + std::to_string(c.tile_q));
  require(c.tile_k == tile_k, "tile_k", path + " takes " + std::to_string(tile_k) + "-key tiles, got " + std::to_string(c.tile_k));
  require(c.stages == 2, "stages", path + " has two stages, got " + std::to_string(c.stages));
  require(c.warps == c.tile_q / 16, "warps",
          path + (wgmma ? " runs one warpgroup per 64 query rows" : " runs one warp per 16 query rows") + ": tile_q " +
              std::to_string(c.tile_q) + " takes " + std::to_string(c.tile_q / 16) + " warps, got " + std::to_string(c.warps));
  return c;
}

}  // namespace

KernelConfig resolve_config(const KernelRequest& r) {
  const KernelPath path = choose_path(r);
  KernelConfig c = r.config;
  if (r.dtype == DType::E4M3 && path != KernelPath::Simt) {
    c = resolve_fp8_config(c, hopper(path));
  } else if (hopper(path)) {
    // One warpgroup per 64 query rows; S's wgmma N is tile_k, O's the head dim. Up to head dim 64
    // three warpgroups (192 rows) unless the pattern has block layouts (KernelRequest::block_layouts).
    if (!c.tile_q) c.tile_q = std::max(r.head_dim, r.head_dim_v) <= 64 && !r.block_layouts ? 192 : 128;
    if (!c.tile_k) c.tile_k = std::max(r.head_dim, r.head_dim_v) > 128 ? 64 : 128;
    if (!c.stages) c.stages = 2;
    require(c.tile_q == 64 || c.tile_q == 128 || c.tile_q == 192, "tile_q",
            "the sm_90a path needs tile_q 64, 128 or 192 (64 rows per warpgroup), got " + std::to_string(c.tile_q));
    // Three consumer warpgroups share the register file 160 registers a thread (fwd_sm90_tma.cuh):
    // O, S and P fit there up to head dim 64.
    require(c.tile_q < 192 || std::max(r.head_dim, r.head_dim_v) <= 64, "tile_q",
            "the sm_90a path runs 192-row tiles (three warpgroups) up to head dim 64, got " +
                std::to_string(std::max(r.head_dim, r.head_dim_v)) + "; use tile_q 64 or 128");
    require(c.tile_k == 64 || c.tile_k == 128 || c.tile_k == 176, "tile_k",
            "the sm_90a path needs tile_k 64, 128 or 176, got " + std::to_string(c.tile_k));
    // 176-key tiles (FlashAttention-3's 128 x 176): S is 88 accumulators a thread beside O's, which
    // fit two consumer warpgroups' registers up to head dim 128; key tiles that do not divide a
    // layout's blocks are left to 64 and 128.
    require(c.tile_k != 176 || (std::max(r.head_dim, r.head_dim_v) <= 128 && c.tile_q <= 128 && !r.block_layouts), "tile_k",
            "the sm_90a path runs 176-key tiles up to head dim 128, with tile_q 64 or 128 and no block layout; got head dim " +
                std::to_string(std::max(r.head_dim, r.head_dim_v)) + ", tile_q " + std::to_string(c.tile_q) +
                (r.block_layouts ? " and a block layout" : "") + "; use tile_k 64 or 128");
    require(c.stages >= 2 && c.stages <= 4, "stages", "cp.async pipelines have 2 to 4 stages, got " + std::to_string(c.stages));
    if (!c.warps) c.warps = c.tile_q / 16;
    require(c.warps == c.tile_q / 16, "warps",
            "the sm_90a path runs one warpgroup (4 warps) per 64 query rows: tile_q " + std::to_string(c.tile_q) + " takes " +
                std::to_string(c.tile_q / 16) + " warps, got " + std::to_string(c.warps));
    const int bytes = smem_bytes(path, r, c);
    require(bytes <= shared_limit(r.arch), "config",
            "tile " + std::to_string(c.tile_q) + "x" + std::to_string(c.tile_k) + " with " + std::to_string(c.stages) +
                " stages needs " + std::to_string(bytes) + " bytes of shared memory, over sm_90a's " +
                std::to_string(shared_limit(r.arch)) + "; use smaller tiles or fewer stages");
  } else if (path == KernelPath::Sm80) {
    if (!c.tile_q) c.tile_q = 64;
    if (!c.tile_k) c.tile_k = std::max(r.head_dim, r.head_dim_v) > 128 ? 32 : 64;
    if (!c.stages) c.stages = 2;
    require(c.tile_q % 16 == 0 && c.tile_q >= 16 && c.tile_q <= 128, "tile_q",
            "the tensor-core path needs tile_q in {16, 32, ..., 128} (16 rows per warp), got " + std::to_string(c.tile_q));
    require(c.tile_k % 16 == 0 && c.tile_k >= 16 && c.tile_k <= 128, "tile_k",
            "the tensor-core path needs tile_k in {16, 32, ..., 128}, got " + std::to_string(c.tile_k));
    require(c.stages >= 1 && c.stages <= 4, "stages",
            "the sm_80 forward takes 1 stage (one K and one V buffer, FlashAttention-2's pipeline) to 4, got " +
                std::to_string(c.stages));
    if (!c.warps) c.warps = c.tile_q / 16;
    const int rows = c.tile_q / c.warps;
    require(c.warps >= 1 && c.tile_q % c.warps == 0 && (rows == 16 || rows == 32), "warps",
            "the tensor-core path gives each warp 16 or 32 query rows, so tile_q " + std::to_string(c.tile_q) + " takes " +
                std::to_string(c.tile_q / 16) + (c.tile_q % 32 == 0 ? " or " + std::to_string(c.tile_q / 32) : "") +
                " warps, got " + std::to_string(c.warps));
    require(rows == 16 || std::max(r.head_dim, r.head_dim_v) <= 128, "warps",
            "32 query rows per warp hold two output accumulators, which fit the registers up to head dim 128 (got " +
                std::to_string(std::max(r.head_dim, r.head_dim_v)) + "); use " + std::to_string(c.tile_q / 16) + " warps");
    const int bytes = smem_bytes(path, r, c);
    require(bytes <= shared_limit(r.arch), "config",
            "tile " + std::to_string(c.tile_q) + "x" + std::to_string(c.tile_k) + " with " + std::to_string(c.stages) +
                " stages needs " + std::to_string(bytes) + " bytes of shared memory, over " + arch_name(r.arch) +
                "'s " + std::to_string(shared_limit(r.arch)) + "; use smaller tiles or fewer stages");
  } else {
    c = resolve_simt_config(r, c);
  }
  return c;
}

bool kernel_seeks(const Pattern& p, const KernelRequest& r) {
  return p.has_dynamic_layout() || (r.random_in_kernel && p.has_layout_kind(Layout::Kind::Random));
}

KernelRequest kernel_request(const Shape& s, DType dtype, int arch, bool arch_specific) {
  KernelRequest r;
  r.head_dim = static_cast<int>(s.head_dim);
  r.head_dim_v = static_cast<int>(s.head_dim_v);
  r.dtype = dtype;
  if (dtype == DType::E4M3) r.out_dtype = DType::BF16;  // FP8 inputs' default output
  r.arch = arch;
  r.arch_specific = arch_specific;
  return r;
}

KernelRequest for_pattern(KernelRequest r, const Pattern& p) {
  r.block_layouts = std::any_of(p.branches.begin(), p.branches.end(), [](const Branch& b) { return b.layout.has_value(); });
  return r;
}

KernelSource generate_kernel(const Pattern& p, const KernelRequest& request, const TemplateSet& templates) {
  const KernelRequest r = for_pattern(request, p);
  KernelSource k;
  k.path = choose_path(r);
  k.config = resolve_config(r);
  k.arch = arch_name(r);
  // The TMA kernel's consumer warps, and its producer warpgroup.
  k.threads = k.path == KernelPath::Simt ? k.config.tile_q * 4 : k.config.warps * 32 + (k.path == KernelPath::Sm90Tma ? 128 : 0);
  k.tma_maps = k.path == KernelPath::Sm90Tma ? kTmaMaps : 0;
  k.template_hash = templates.hash();
  const std::string predicate = generate_mask_predicate(p);
  k.has_mask = pattern_has_mask(p);
  k.seeks = kernel_seeks(p, r);
  // Persistent blocks on the TMA forward, but not in a kernel that seeks: its larger cursor, kept
  // across the loop over items, spilled into the tile loop (16 local accesses a tile at head dim 128).
  k.persistent = r.persistent && k.path == KernelPath::Sm90Tma && !k.seeks;
  k.q_buffers = k.path == KernelPath::Sm90Tma ? forward_q_buffers(r, k.config, k.persistent) : 0;
  k.o_staged = k.q_buffers && forward_o_staged(r, k.config, k.persistent, k.q_buffers);
  k.shared_bytes = k.q_buffers ? forward_sm90_smem_bytes(r, k.config, true, k.q_buffers) +
                                     (k.o_staged ? forward_o_staging_bytes(r, k.config) : 0)
                               : smem_bytes(k.path, r, k.config);
  k.key_weights = r.pack_branches && branches_may_pack(p) && r.dtype != DType::E4M3;  // FP8: Separate plans

  std::ostringstream os;
  const bool fp8 = r.dtype == DType::E4M3 && k.path == KernelPath::Sm90, fp8_89 = fp8_sm89(k.path, r);
  const std::vector<std::string> bodies =
      fp8                           ? std::vector<std::string>{"fwd_sm80.cuh", "fwd_fp8.cuh", "fwd_sm90_fp8.cuh"}
      : fp8_89                      ? std::vector<std::string>{"fwd_sm80.cuh", "fwd_fp8.cuh", "fwd_sm89_fp8.cuh"}
      : k.path == KernelPath::Sm90Tma ? std::vector<std::string>{"fwd_sm80.cuh", "fwd_sm90.cuh", "fwd_sm90_tma.cuh"}
      : k.path == KernelPath::Sm90  ? std::vector<std::string>{"fwd_sm80.cuh", "fwd_sm90.cuh"}
      : k.path == KernelPath::Sm80  ? std::vector<std::string>{"fwd_sm80.cuh"}
                                    : std::vector<std::string>{"fwd_simt.cuh"};
  os << render_prefix("kernel", k, r, p, predicate, templates, bodies, true);
  os << "\n// ---- generated: entry point\n";
  // Minimum one block per SM: lets ptxas use every register it needs rather than spill.
  os << "extern \"C\" __global__ void __launch_bounds__(" << k.threads << ", 1) AJ_KERNEL_NAME(const AjParams p"
     << (k.tma_maps ? ", const __grid_constant__ AjFwdTmaMaps maps" : "") << ") {\n  "
     << (p.has_dynamic_layout() ? "aj_dynamic_check(p, " + std::to_string(k.threads) + ");  // a table on the device: count its problems\n  " : "")
     << (fp8                           ? "aj_fwd_sm90_fp8(p);"
         : fp8_89                      ? "aj_fwd_sm89_fp8(p);"
         : k.path == KernelPath::Sm90Tma ? "aj_fwd_sm90_tma(p, maps);"
         : k.path == KernelPath::Sm90  ? "aj_fwd_sm90(p);"
         : k.path == KernelPath::Sm80  ? "aj_fwd_sm80(p);"
                                       : "aj_fwd_simt(p);")
     << "\n}\n";
  name_by_hash(k, os.str(), "attnjit_fwd_");
  return k;
}

}  // namespace attnjit

namespace attnjit {

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

namespace attnjit {

namespace {
// Static shared memory of the paged forward (fwd_paged.cuh's AjPagedShared).
int paged_smem_bytes(const KernelRequest& r, const KernelConfig& c) {
  const int pitch = r.head_dim % 4 == 0 ? r.head_dim + 4 : r.head_dim + 1;  // fwd_paged.cuh's AJ_PG_KPITCH
  return 4 * (c.tile_q * r.head_dim + c.tile_k * pitch + c.tile_k * r.head_dim_v + 4 * c.tile_k);
}
}  // namespace

KernelPath choose_paged_path(const KernelRequest& r) {
  const bool tiles = (r.config.tile_q == 0 || r.config.tile_q == 16) && (r.config.tile_k == 0 || r.config.tile_k == 64);
  const bool dims = r.head_dim % 16 == 0 && r.head_dim_v % 16 == 0 && r.head_dim <= 128 && r.head_dim_v <= 128;
  return r.arch >= 80 && (r.dtype == DType::F16 || r.dtype == DType::BF16) && dims && tiles ? KernelPath::Sm80 : KernelPath::Simt;
}

KernelConfig resolve_paged_config(const KernelRequest& r) {
  require(r.arch >= 60, "--arch " + arch_name(r.arch), "attnjit needs sm_60 or newer");
  require(r.head_dim >= 1 && r.head_dim_v >= 1 && r.head_dim <= 256 && r.head_dim_v <= 256, "--head-dim",
          "the paged forward takes head dims 1 to 256, got " + std::to_string(r.head_dim) + " and " +
              std::to_string(r.head_dim_v));
  require(r.dtype != DType::E4M3, "--dtype fp8_e4m3",
          "the paged forward's queries and output are fp32, fp16 or bf16; fp8_e4m3 is a KV cache dtype (kv_dtype)");
  require(!r.kv_dtype || *r.kv_dtype == r.dtype || *r.kv_dtype == DType::E4M3, "kv_dtype",
          std::string("the KV caches are the queries' dtype (") + to_string(r.dtype) + ") or fp8_e4m3, got " +
              (r.kv_dtype ? to_string(*r.kv_dtype) : ""));
  KernelConfig c = r.config;
  if (choose_paged_path(r) == KernelPath::Sm80) {  // fwd_paged_tc.cuh: one m16 tile of rows, 16 keys per warp
    require(c.stages == 0 || c.stages == 1, "stages", "the paged forward has one stage, got " + std::to_string(c.stages));
    require(c.warps == 0 || c.warps == 4, "warps", "the paged forward runs 4 warps, got " + std::to_string(c.warps));
    return KernelConfig{16, 64, 1, 4};
  }
  const bool default_q = c.tile_q == 0, default_k = c.tile_k == 0;
  if (default_q) c.tile_q = 16;
  if (default_k) c.tile_k = 32;
  require(c.tile_q >= 1 && c.tile_q <= 64, "tile_q", "the paged forward takes 1 to 64 query rows per item, got " +
                                                         std::to_string(c.tile_q));
  require(c.tile_k == 16 || c.tile_k == 32 || c.tile_k == 64, "tile_k",
          "the paged forward takes tile_k 16, 32 or 64, got " + std::to_string(c.tile_k));
  // Past head dim 128 the default tiles shrink to fit: 16 keys, then 8 rows.
  if (default_k && paged_smem_bytes(r, c) > 48 * 1024) c.tile_k = 16;
  if (default_q && paged_smem_bytes(r, c) > 48 * 1024) c.tile_q = 8;
  require(paged_smem_bytes(r, c) <= 48 * 1024, "config",
          "the paged forward's tiles " + std::to_string(c.tile_q) + "x" + std::to_string(c.tile_k) + " need " +
              std::to_string(paged_smem_bytes(r, c)) + " bytes of static shared memory, over 48 KB; use smaller tiles");
  require(c.stages == 0 || c.stages == 1, "stages", "the paged forward has one stage, got " + std::to_string(c.stages));
  require(c.warps == 0 || c.warps == 4, "warps", "the paged forward runs 4 warps, got " + std::to_string(c.warps));
  c.stages = 1;
  c.warps = 4;
  return c;
}

namespace {
// The device planner's tables (templates/plan_paged.cuh says what each holds).
std::string paged_planner_tables(const Pattern& p, const PagedHeads& heads, int32_t tile_q) {
  if (heads.heads_q < 1 || heads.heads_kv < 1 || heads.heads_q % heads.heads_kv)
    throw UserError("heads", std::to_string(heads.heads_q) + " query heads over " + std::to_string(heads.heads_kv) +
                                 " kv heads: both >= 1, and heads_kv must divide heads_q");
  const std::vector<PagedHeadClass> classes = paged_head_classes(p, heads.heads_q, heads.heads_kv, tile_q);
  std::ostringstream os;
  auto list = [&](const char* type, const char* name, const auto& values, const char* what) {
    os << "__device__ const " << type << " " << name << "[] = {";
    for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i] << (std::string(type) == "aj_i64" ? "ll" : "");
    os << "};  // " << what << "\n";
  };
  std::vector<int64_t> segment, dilation, left, right, offsets;
  std::vector<int32_t> first, count;
  for (const Branch& b : p.branches) {
    segment.push_back(b.segment.value_or(0));
    dilation.push_back(b.dilation);
    left.push_back(b.window.left >= 0 ? b.window.left : -1);
    const bool has_right = b.window.right >= 0 || b.causal;
    right.push_back(!has_right ? -1 : b.causal ? std::min<int64_t>(b.window.right >= 0 ? b.window.right : 0, 0) : b.window.right);
  }
  for (const PagedHeadClass& c : classes) {
    first.push_back(c.head);
    count.push_back(c.heads);
    offsets.insert(offsets.end(), c.offsets.begin(), c.offsets.end());
  }
  os << "// The device planner's pattern (templates/plan_paged.cuh), for " << heads.heads_q << " query heads over "
     << heads.heads_kv << " kv heads\n";
  os << "#define AJ_PG_NB " << p.branches.size() << "\n#define AJ_PG_CLASSES " << classes.size() << "\n";
  list("aj_i64", "aj_pg_segment", segment, "per branch: segment length (0: none)");
  list("aj_i64", "aj_pg_dilation", dilation, "dilation");
  list("aj_i64", "aj_pg_left", left, "band: kpos >= qpos - left (-1: unbounded)");
  list("aj_i64", "aj_pg_right", right, "band: kpos <= qpos + right (-1: unbounded)");
  list("int", "aj_pg_class_head", first, "per class of heads: its first head");
  list("int", "aj_pg_class_heads", count, "its heads");
  list("aj_i64", "aj_pg_class_offset", offsets, "[class][branch]: the offset, -1: the branch does not apply");
  return os.str();
}
}  // namespace

PagedKernels generate_paged_kernels(const Pattern& p, const KernelRequest& request, const PagedHeads& heads,
                                    const TemplateSet& templates) {
  const KernelRequest r = for_pattern(request, p);
  PagedKernels out;
  KernelSource& k = out.source;
  k.path = choose_paged_path(r);
  k.config = resolve_paged_config(r);
  k.arch = arch_name(r);
  k.threads = out.threads;
  k.template_hash = templates.hash();
  k.has_mask = pattern_has_mask(p);
  k.seeks = pattern_has_layout(p);  // the device planner leaves every layout to the forward
  std::ostringstream os;
  const std::string generated = generate_mask_predicate(p, true) + paged_planner_tables(p, heads, k.config.tile_q);
  const bool tc = k.path == KernelPath::Sm80;
  std::vector<std::string> bodies{"fwd_paged.cuh"};
  if (tc) bodies.push_back("fwd_paged_tc.cuh");
  bodies.push_back("plan_paged.cuh");
  std::string prefix = render_prefix("paged forward", k, r, p, generated, templates, bodies, true, true);
  if (r.kv_dtype && *r.kv_dtype == DType::E4M3) {  // before the templates: fwd_paged.cuh reads it
    const std::string at = "#define AJ_DTYPE ";
    std::string kv = "#define AJ_KV_DTYPE 3  // the caches: fp8 e4m3, scaled per kv head\n";
    // sm_89 and newer decode the codes with cvt.rn.f16x2.e4m3x2 (exact, two at a time), older archs
    // in software (exact too).
    if (r.arch >= 89) kv += "#define AJ_KV_CVT 1\n";
    prefix.insert(prefix.find(at), kv);
  }
  os << prefix;
  os << "\n// ---- generated: entry points\n";
  for (const auto& [entry, body] : {std::pair<const char*, const char*>{"fwd", tc ? "aj_fwd_paged_tc(p);" : "aj_fwd_paged(p);"},
                                    {"merge", "aj_paged_merge(p);"},
                                    {"plan", "aj_paged_plan(p);"}}) {
    os << "extern \"C\" __global__ void __launch_bounds__(" << out.threads << ", 1) AJ_KERNEL_NAME_" << entry
       << "(const AjPagedParams p) {\n  " << body << "\n}\n";
  }
  name_by_hash(k, os.str(), "attnjit_paged_");
  out.forward = k.name + "_fwd";
  out.merge = k.name + "_merge";
  out.plan = k.name + "_plan";
  return out;
}

}  // namespace attnjit
