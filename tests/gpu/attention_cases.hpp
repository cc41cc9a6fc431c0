// The harness of the GPU forward suite (tests/gpu/test_attention_gpu.cpp): cases (a pattern, a
// shape, a dtype, a memory layout, the device's arch and kernel configuration), their generators
// (the examples, random patterns, every autotuner configuration), and check_cases(), which
// prepares them in parallel and runs each against the float64 reference on the device under test
// (tests/gpu/test_target.hpp). Outputs are poisoned (0xFF = NaN) first, so unwritten rows show;
// bytes outside the output views must stay poisoned. fp16/bf16 inputs are rounded on the host and
// the reference sees the rounded values.
//
// Knobs: ATTNJIT_GPU_TEST_REPORT=FILE appends one JSON line per case (tests/device/device_check.sh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/codegen.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "tests/gpu/test_target.hpp"

namespace attnjit::gputest {

// The environment variable `name` as a number, or `fallback` when unset or empty.
double env_number(const char* name, double fallback);
// How many cases a sweep takes: the environment's `name` where set, else `full` under
// ATTNJIT_TEST_SWEEP=1 (the ctest entries labelled "sweep"; on a GPU, where cases are cheap, the
// GPU tests ask for `full` themselves), else `ci`, the part that fits a CI run.
int sweep_count(const char* name, int ci, int full);
// Why there is no GPU to test ("" when there is one, or when the target runs on the host).
std::string no_gpu_reason();

#define SKIP_WITHOUT_GPU() \
  if (const std::string why_ = ::attnjit::gputest::no_gpu_reason(); !why_.empty()) { WARN("SKIPPED: no CUDA driver/GPU: " + why_); return; }

// ---- memory of the device under test: device memory, or host memory in CPU mode ------------

class Buf {
public:
  explicit Buf(size_t bytes) : bytes_(bytes) {
    if (on_host()) host_.reset(static_cast<unsigned char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256)));
    else {
      shared_context(0).make_current();  // a test's first allocation may come before any runtime call
      dev_ = DeviceBuffer(bytes);
    }
  }
  void* data() const { return on_host() ? static_cast<void*>(host_.get()) : reinterpret_cast<void*>(dev_.get()); }
  // Landed when it returns: a copy from pageable memory on the legacy stream may return before its
  // bytes arrive, and a non-blocking stream's work is not ordered after it.
  void upload(const std::vector<unsigned char>& b) {
    if (on_host()) {
      std::memcpy(host_.get(), b.data(), b.size());
    } else {
      copy_to_device(dev_.get(), b.data(), b.size());
      synchronize(nullptr, "an upload");
    }
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> b(bytes_);
    if (on_host()) std::memcpy(b.data(), host_.get(), bytes_); else copy_to_host(b.data(), dev_.get(), bytes_);
    return b;
  }
  void poison(CUstream s) {  // 0xFF bytes: NaN in fp32, fp16 and bf16; ordered on s alone
    if (on_host()) std::memset(host_.get(), 0xFF, bytes_); else memset_d8_async(dev_.get(), 0xFF, bytes_, s);
  }

private:
  struct Free { void operator()(unsigned char* p) const { std::free(p); } };
  size_t bytes_;
  DeviceBuffer dev_;
  std::unique_ptr<unsigned char, Free> host_;
};

// A DynamicLayout copied where the device under test reads it, as a DeviceDynamicLayout with a
// zeroed problem counter.
struct DeviceTable {
  Buf rows, cols, errors;
  DeviceDynamicLayout layout;
  explicit DeviceTable(const DynamicLayout& d)
      : rows(d.row_offsets.size() * 8), cols(std::max<size_t>(d.col_indices.size(), 1) * 4), errors(4) {
    auto bytes = [](const auto& v) {
      std::vector<unsigned char> b(v.size() * sizeof(v[0]));
      if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
      return b;
    };
    rows.upload(bytes(d.row_offsets));
    cols.upload(bytes(d.col_indices));
    errors.upload(std::vector<unsigned char>(4, 0));
    layout.row_offsets = static_cast<const int64_t*>(rows.data());
    layout.col_indices = static_cast<const int32_t*>(cols.data());
    layout.rows = static_cast<int64_t>(d.row_offsets.size()) - 1;
    layout.entries = static_cast<int64_t>(d.col_indices.size());
    layout.heads = d.heads;
    layout.errors = static_cast<int32_t*>(errors.data());
  }
  int32_t problems() const {
    const std::vector<unsigned char> b = errors.download();
    int32_t n;
    std::memcpy(&n, b.data(), 4);
    return n;
  }
};

// "" when two byte strings are equal, else where they first differ (what a CHECK prints: Catch's
// own expansion of two megabyte vectors takes minutes).
std::string byte_difference(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want);

constexpr size_t kGuard = 256;  // poisoned bytes after every output; they must stay poisoned

enum class Mem { BSHD, BHSD, Padded };  // Padded: [B, S, H, D] with 16 spare bytes after each head row
const char* to_string(Mem m);

// A tensor on the device under test: `values` (BSHD contiguous) stored in `dt` and layout `m`;
// without values, an output, poisoned. Elements outside the view (padding, guard) are 0xFF.
struct Tensor {
  TensorView view;
  size_t bytes;
  Buf buf;
  Tensor(const std::vector<float>* values, std::vector<int64_t> shape, DType dt, Mem m);
  static TensorView make_view(std::vector<int64_t> shape, DType dt, Mem m);
};

// ---- cases --------------------------------------------------------------------------------------

struct Case {
  std::string name;
  Pattern pattern;
  Shape shape;
  DType dtype = DType::BF16;
  Mem mem = Mem::BSHD;
  bool lse = true, own_stream = false;
  int arch = 80;         // emu: the arch whose kernel runs (75: the SIMT path for fp16 too)
  bool sm90a = false;    // emu: with arch 90, the arch-specific kernels (the Hopper forward)
  bool tma = true;       // the Hopper forward's TMA kernel where tensor maps describe the keys (else cp.async)
  KernelConfig config;   // zeros: the default (or the tuning database's choice on a GPU)
  std::optional<DynamicLayout> dynamic;
  bool device_table = false;  // the table as a DeviceDynamicLayout (device memory; host memory on emu/cpu)
  // A device table with problems instead: the kernels must count `table_problems` and answer as
  // over `dynamic` (the table without them); where the problems leave the answer unspecified
  // (rows out of order), only its finiteness and the bytes outside the outputs are checked.
  std::optional<DynamicLayout> raw_table;
  int32_t table_problems = 0;
  bool answer_unspecified = false;
  // Random layouts decided in the kernels at any size (RuntimeOptions::random_in_kernel_above = 0):
  // the plan visits every tile the band allows and the kernels seek through the layout.
  bool random_in_kernel = false;
  uint64_t seed = 0;
  unsigned ref_threads = 1;
  float input_scale = 1.0f;  // q and k times this: large scores test the softmax's running maximum
  // Added to element 0 of key j's K rows: key_ramp * j (and q's element 0 made positive): scores
  // that rise along the keys, so rows' maxima grow tile after tile.
  float key_ramp = 0.0f;
  bool lazy_rescale = false;  // RuntimeOptions::lazy_rescale
  bool poly_exp2 = false;     // RuntimeOptions::poly_exp2
  int persistent_blocks = 0;  // RuntimeOptions::persistent_blocks
  // V elements set after the inputs are drawn ([B, S, H, Dv] contiguous index, value): a NaN or an
  // inf the reference confines to the rows that attend its key. Where the reference's output is
  // NaN the device's must be NaN; where it is infinite, the same infinity.
  std::vector<std::pair<size_t, float>> v_values;
  // ForwardOptions::rows_with_work_only: a row that attends nothing may keep its poison (every byte
  // 0xFF, in O and the LSE) or hold (0, -inf); every other row must match. At least one row must
  // keep its poison, or the option did nothing.
  bool rows_with_work_only = false;
};

RuntimeOptions options_for(Device d);

// Prepares every case in parallel (reference, plan, kernel compile), then runs them one by one.
void check_cases(const std::string& suite, const std::vector<Case>& cases);

// ---- the suites ---------------------------------------------------------------------------------

// The kernel paths a forward case can take on the device under test: on a GPU its own (the
// Hopper kernels where it has them, as the runtime chooses); in the emulator the sm_80 tensor-core
// kernel in fp16 and bf16, the SIMT kernel (fp32; fp16 through sm_75; bf16 through sm_61) and the
// sm_90a kernels with and without TMA; on the CPU the plan executor.
struct Path {
  const char* name;
  DType dtype;
  int arch;
  bool sm90a, tma;
};
std::vector<Path> forward_paths();

// Every pattern of examples/ (not the precompile manifests), by file stem, sorted.
std::vector<std::pair<std::string, Pattern>> example_patterns();
Shape make_shape(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, int64_t q_off = 0, int64_t k_off = 0);
// Every example at moderate sizes (lengths times `scale`), or at small ones for compute-sanitizer.
std::vector<Case> example_cases(double scale, bool small);
// The generator's small shapes, scaled to the kernels' head dims; half of the cases without a
// dynamic table get longer sequences (still multiples of nothing in particular); half of those
// with random layouts decide them in the kernels.
std::vector<Case> random_cases(uint64_t seed, int count, bool scale_lengths);
// Small shapes for the emulator: every example at each dtype, head dims 32..256, GQA, offsets,
// three heads at least (seed_dilated has a group per branch),
// [B, H, S, D] and padded layouts, lengths that are no multiple of any tile, and the SIMT path
// for fp16 through sm_75 and for bf16 through sm_61 (Pascal: fp32 arithmetic on half storage).
// With `sm90a`, the Hopper forward's shapes instead (head dims 64, 128 and 256, fp16 and bf16).
std::vector<Case> emu_example_cases(bool sm90a = false);
// Patterns with random layouts for the kernels to decide: blocks smaller than a tile, larger than
// one, and small enough that an item spans more than four query blocks (the seek then answers
// "maybe here"); random alone and joined with local, global, offsets and intersections; causal
// and dilated branches beside a branch the plan decides.
std::vector<std::pair<std::string, Pattern>> random_in_kernel_patterns();
// Every configuration the autotuner can choose (compiler/tune/autotune.cpp's candidate_configs for
// `arch`: tensor-core tiles 64/128 x 32/64/128 with 2 or 3 stages that fit, 128-row tiles with 16
// or 32 rows per warp, SIMT tiles 16/32/64 x 16/32), plus a 4-stage pipeline and a 64-row tile of
// two 32-row warps, on a pattern with causal and dilated branches at lengths that are no multiple
// of any tile (so residue tiles leave some warps without rows). Head dim 256 has its own, smaller set; on the emulator
// fp16 also runs the SIMT candidates of sm_75, and bf16 those of sm_61. With `sm90a` (arch 90):
// the Hopper forward's candidates at head dims 64, 128 and 256.
std::vector<Case> config_cases(int64_t seq, int arch, bool sm90a = false);

}  // namespace attnjit::gputest
