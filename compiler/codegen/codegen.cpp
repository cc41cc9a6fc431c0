// Rendering the forward kernels from templates (the instantiation header every source starts
// with, the forward's shared memory and tiles, its entry point), and what the backward's and the
// paged forward's generators share (codegen_internal.hpp; codegen_backward.cpp, codegen_paged.cpp).
#include "compiler/codegen/codegen.hpp"
#include "compiler/codegen/codegen_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string_view>

#include "compiler/support/sha256.hpp"
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

namespace codegen_detail {

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

std::string arch_name(int arch) { return "sm_" + std::to_string(arch); }

bool hopper(KernelPath p) { return p == KernelPath::Sm90 || p == KernelPath::Sm90Tma; }

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

}  // namespace codegen_detail

using namespace codegen_detail;

namespace {

// The sm_89 FP8 kernel (templates/fwd_sm89_fp8.cuh): KernelPath::Sm80 on e4m3 inputs.
bool fp8_sm89(KernelPath path, const KernelRequest& r) { return path == KernelPath::Sm80 && r.dtype == DType::E4M3; }

// Shared memory of one SM, which the blocks resident on it share (each also takes 1 KB the system
// reserves, on sm_80 and newer).
int shared_per_sm(int arch) { return arch >= 75 ? shared_limit(arch) + 1024 : 64 * 1024; }

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
int smem_bytes(KernelPath path, const KernelRequest& r, const KernelConfig& c) {
  if (path == KernelPath::Simt) return 0;  // static shared memory, checked by its own limit
  if (hopper(path) || fp8_sm89(path, r)) return forward_sm90_smem_bytes(r, c, path == KernelPath::Sm90Tma);
  return forward_sm80_smem_bytes(r, c, q_over_kv(r, c));
}

}  // namespace

namespace codegen_detail {

std::string render_prefix(const char* kind, const KernelSource& k, const KernelRequest& r, const Pattern& p,
                          const std::string& predicate, const TemplateSet& templates, const std::vector<std::string>& bodies,
                          bool forward, bool paged) {
  std::ostringstream os;
  os << "// attnjit generated " << kind << ": path=" << to_string(k.path) << " arch=" << k.arch << " dtype=" << to_string(r.dtype)
     << (r.out_dtype && *r.out_dtype != r.dtype ? std::string(" out_dtype=") + to_string(*r.out_dtype) : "")
     << " head_dim=" << r.head_dim << " head_dim_v=" << r.head_dim_v << " tile=" << k.config.tile_q << "x"
     << k.config.tile_k << " stages=" << k.config.stages << " warps=" << k.config.warps << "\n";
  os << "// Sequence lengths, strides, offsets and the plan tables are kernel arguments (AjParams).\n";
  os << "#define AJ_HEAD_DIM " << r.head_dim << "\n#define AJ_HEAD_DIM_V " << r.head_dim_v << "\n";
  os << "#define AJ_TILE_Q " << k.config.tile_q << "\n#define AJ_TILE_K " << k.config.tile_k << "\n";
  os << "#define AJ_STAGES " << k.config.stages << "\n#define AJ_WARPS " << k.config.warps << "\n";
  if (!forward) os << backward_defines(k, r);
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

void name_by_hash(KernelSource& k, std::string source, const std::string& prefix) {
  k.name = prefix + sha256_hex(source).substr(0, 12);
  const std::string placeholder = "AJ_KERNEL_NAME";
  for (size_t at; (at = source.find(placeholder)) != std::string::npos;) source.replace(at, placeholder.size(), k.name);
  k.source = std::move(source);
  k.source_hash = sha256_hex(k.source);
}

}  // namespace codegen_detail

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
