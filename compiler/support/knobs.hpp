// Every environment variable attnjit reads, in one place (Triton's knobs.py). Code elsewhere asks
// knobs() and never calls getenv itself, so `attnjit info` can show the whole configuration.
#pragma once

#include <cstdint>
#include <string>

namespace attnjit {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

// The CPU plan executor's instruction set (runtime/cpu/plan_executor.hpp): Auto picks the best this
// CPU runs; Generic is the baseline build (SSE2 on x86-64); Avx2 needs AVX2 and FMA.
enum class CpuSimd { Auto, Generic, Avx2, Avx512 };

// The shipped tuning databases' folder compiled in (ATTNJIT_AUTOTUNE_DB_DIR), or "none".
inline std::string default_shipped_db_dir() {
#ifdef ATTNJIT_AUTOTUNE_DB_DIR
  return ATTNJIT_AUTOTUNE_DB_DIR;
#else
  return "none";
#endif
}

struct Knobs {
  // ATTNJIT_CACHE_DIR; default $XDG_CACHE_HOME/attnjit, else $HOME/.cache/attnjit, else /tmp/attnjit-cache.
  std::string cache_dir;
  bool disable_cache = false;           // ATTNJIT_DISABLE_CACHE=1: no disk cache (memory only)
  bool always_compile = false;          // ATTNJIT_ALWAYS_COMPILE=1: ignore cache hits, recompile and overwrite
  bool no_jit = false;                  // ATTNJIT_NO_JIT=1: a cache miss is an error listing the missing kernels
  std::string dump_dir;                 // ATTNJIT_DUMP_DIR: every compiled kernel's source, options and log go there
  LogLevel log_level = LogLevel::Warn;  // ATTNJIT_LOG_LEVEL=error|warn|info|debug
  // ATTNJIT_CACHE_MAX_BYTES: least-recently-used entries are evicted above it, never the one just
  // written, so 0 keeps only the latest kernel (no disk cache at all: ATTNJIT_DISABLE_CACHE).
  int64_t cache_max_bytes = int64_t{1} << 30;
  bool print_autotuning = false;        // ATTNJIT_PRINT_AUTOTUNING=1
  bool tune = false;                    // ATTNJIT_TUNE=1: tune on a tuning-database miss
  bool deterministic = false;           // ATTNJIT_DETERMINISTIC=1: every backward is bitwise reproducible
  // ATTNJIT_BWD_SINGLE_PASS=0: the tensor-core backward runs its two-pass form (a dQ kernel over
  // the forward plan, then dK/dV) even where it is not asked to be deterministic; by default the
  // dK/dV kernel also adds dS K into an fp32 dQ accumulator (one pass, atomics).
  bool bwd_single_pass = true;
  // On the Hopper path (sm_90a, head dims 64 and 128) the backward's dK/dV kernel runs on the
  // warpgroup MMA (templates/bwd_sm90_tma.cuh, bwd_sm90.cuh without TMA; 1.15-1.22x the sm_80
  // kernels on an H200); ATTNJIT_BWD_WGMMA=0 runs the sm_80 kernel's mma.sync there instead
  // (as RuntimeOptions::wgmma_backward = false).
  bool bwd_wgmma = true;
  // ATTNJIT_KEEP_POOL_MEMORY=1: the CUDA device's default memory pool (where the backward's and the
  // paged forward's stream-ordered workspaces come from) keeps what is freed instead of returning it
  // at each synchronisation (its release threshold raised to the maximum), so a later call's
  // allocation maps no memory. Off by default until a GPU has measured what it saves: it changes
  // the pool for the whole process.
  bool keep_pool_memory = false;
  // ATTNJIT_LAZY_RESCALE=1: the tensor-core forwards keep a row's running maximum until a tile's
  // passes it by more than 2^8 and rescale O only then (FlashAttention-4); off by default until a
  // GPU has measured it (RuntimeOptions::lazy_rescale).
  bool lazy_rescale = false;
  // ATTNJIT_PACK_BRANCHES=0: every branch's tiles computed, also a pair other branches attend too
  // (BranchPacking::Separate), where the forward otherwise computes such a pair once with its
  // multiplicity as a weight (RuntimeOptions::pack_branches).
  bool pack_branches = true;
  // ATTNJIT_POLY_EXP2=1: the tensor-core forwards take every fourth n-tile's exponentials on the
  // FMA pipe (a cubic, aj_ex2_poly) instead of the SFU (FlashAttention-4); off by default until a
  // GPU has measured it (RuntimeOptions::poly_exp2).
  bool poly_exp2 = false;
  // ATTNJIT_PERSISTENT=1: the Hopper TMA forward runs persistent blocks, one per SM, each taking
  // work items in turn (RuntimeOptions::persistent_blocks = -1); off by default until a GPU has
  // measured it.
  bool persistent = false;
  // A GPU of compute capability 9.0 runs the Hopper forward (sm_90a: wgmma, TMA) where it supports
  // the request, as proven in the emulator; ATTNJIT_SM90A=0 runs the sm_80 kernel there instead.
  bool sm90a = true;
  // ATTNJIT_TMA=0: the Hopper forward loads with cp.async instead of TMA and a producer warp (for
  // comparisons; TMA is used where tensor maps describe a call's key rows).
  bool tma = true;
  // ATTNJIT_MAX_WEIGHTS: the most elements (batch * heads_q * seq_q * seq_k) Attention::weights
  // writes; above it the call is refused (a dense fp32 matrix of 2^28 elements is 1 GiB).
  int64_t max_weights = int64_t{1} << 28;
  // ATTNJIT_PLAN_CACHE_BYTES: the bytes of plan tables one prepared attention keeps (one plan per
  // distinct offsets, dynamic table or documents); least recently used plans are evicted above it,
  // never the one in use. Ring attention and chunked prefill meet many offsets.
  int64_t plan_cache_bytes = int64_t{256} << 20;
  // ATTNJIT_RANDOM_IN_KERNEL: random layouts are decided in the kernels (emu and CUDA devices) where
  // a plan would hash more blocks than this (heads_q x query blocks x key blocks per random
  // layout); 0: always. RuntimeOptions::random_in_kernel_above overrides it. 2^26: BigBird (128-token
  // blocks, 16 heads) is planned up to 256K tokens (0.29 s of planning once per shape, 66 MB of
  // tables) and seeks beyond; on an H100 its seeking kernel ran 6-7x slower than its planned one.
  int64_t random_in_kernel_above = int64_t{1} << 26;
  // ATTNJIT_SHIPPED_DB_DIR: the shipped tuning databases (default: the source tree's autotune_db/,
  // compiled in; "none": no shipped databases, only the user's).
  std::string shipped_db_dir = default_shipped_db_dir();
  // ATTNJIT_NVRTC: the NVRTC libraries to compile with, files or folders separated by ':', used
  // instead of searching (compiler/nvrtc/nvrtc_library.hpp); "none": no NVRTC at all; unset: search.
  std::string nvrtc;
  CpuSimd cpu_simd = CpuSimd::Auto;     // ATTNJIT_CPU_SIMD=auto|generic|avx2|avx512: the CPU device's tile arithmetic
  // The CPU emulator (Device::emu()):
  std::string emu_cxx = "c++";          // ATTNJIT_EMU_CXX: the host C++ compiler (g++ or clang++) kernels are built with
  uint64_t emu_seed = 0;                // ATTNJIT_EMU_SEED: 0 runs threads in index order; else shuffles them between barriers
  int emu_threads = 0;                  // ATTNJIT_EMU_THREADS: OS threads running blocks (0: one per core)
  double emu_timeout_s = 300;           // ATTNJIT_EMU_TIMEOUT: seconds one block may run before it is called runaway
  // ATTNJIT_PROGRESS_AFTER: seconds a long CLI computation (statistics) runs silently before it
  // prints progress lines to stderr (0: at once).
  double progress_after_s = 1.0;

  // Reads the environment now. Booleans take 1/0/true/false/yes/no/on/off (any case); a variable
  // that is set but empty counts as unset. A malformed value, or a contradictory combination
  // (ATTNJIT_NO_JIT=1 with ATTNJIT_ALWAYS_COMPILE=1 or ATTNJIT_DISABLE_CACHE=1), is a UserError
  // whose where() is the variable's name and whose message lists the valid values.
  static Knobs from_environment();

  // One "NAME=value" line per knob, in a fixed order, for `attnjit info`.
  std::string describe() const;
};

// The process-wide knobs, read from the environment on first use (a thread-safe static). If the
// environment is malformed, every call throws the UserError again.
const Knobs& knobs();

// Writes "attnjit: warning: <message>" (error/info/debug likewise) to stderr as one line when
// level <= knobs().log_level. Never throws: with a malformed environment it logs at the default level.
void log(LogLevel level, const std::string& message);

// A boolean environment variable spelt as the knobs' are (1/0, true/false, yes/no, on/off, in any
// case): `fallback` when unset or empty, a UserError naming the variable for any other value. For
// variables outside Knobs (the tests' own).
bool env_flag(const char* name, bool fallback);

const char* log_level_name(LogLevel level);  // "error", "warn", "info", "debug"
const char* cpu_simd_name(CpuSimd simd);     // "auto", "generic", "avx2", "avx512"

}  // namespace attnjit
