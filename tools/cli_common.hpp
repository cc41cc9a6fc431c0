// Pieces shared by the `attnjit` subcommands: shape options, loading inputs, error reporting.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/cache/kernel_cache.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"
#include "attnjit/attnjit.hpp"

namespace attnjit::cli {

// A CLI11 check: an integer >= min (a negative size or limit is an error, never "not given").
CLI::Validator at_least(int64_t min);
// The same for an integer in [min, max].
CLI::Validator in_range(int64_t min, int64_t max);

// --seq/--seq-q, --seq-k, --heads-q, --heads-kv, --q-offset, --k-offset (and optionally batch and head dims).
struct ShapeOptions {
  int64_t seq_q = 0, seq_k = 0, heads_q = 8, heads_kv = 0, q_offset = 0, k_offset = 0;
  int64_t batch = 1, head_dim = kDefaultHeadDim, head_dim_v = 0;
  void add_to(CLI::App* app, bool with_dims);
  bool has_seq() const { return seq_q > 0; }
  Shape shape() const;  // seq_k defaults to seq_q, heads_kv to heads_q, head_dim_v to head_dim
};

// Reads a dynamic layout table: JSON {"heads": 1, "row_offsets": [...], "col_indices": [...]}.
DynamicLayout load_dynamic_layout(const std::string& path);
// The same from the file's text; errors name `source`.
DynamicLayout parse_dynamic_layout(const std::string& text, const std::string& source);

// The dynamic table for a call: read from `path` and checked against the pattern and shape, or
// nothing when the pattern has no dynamic layout. A missing table for a dynamic pattern is an error.
std::optional<DynamicLayout> dynamic_table_for(const Pattern& p, const Shape& s, const std::string& path);

// --cu-seqlens 0,37,37,101,150: packed documents (run, mask, validate, grad). Given empty, it is
// an error, not "no documents".
struct DocumentsOption {
  std::string text;
  bool given = false;
};
void add_cu_seqlens_option(CLI::App* app, DocumentsOption& option);
// The documents of a call: parsed and checked against the pattern and shape (check_documents), or
// nothing when the option was not given.
std::optional<std::vector<int64_t>> documents_for(const Pattern& p, const Shape& s, const DocumentsOption& option,
                                                  bool has_dynamic_table);

// The subcommand's spec file (load_spec_file), remembered so that errors found later in the spec,
// once the shape is known ("/branches/0/heads/0: ..."), name the file as the parse errors do.
Pattern load_spec(const std::string& path);

// The canonical text as validate and dump print it: lists of explicit blocks cut to their first 16
// pairs unless `full`, with a line saying how many blocks were left out.
std::string canonical_for_people(const Pattern& p, bool full);

// Runs a subcommand body; a UserError (or any other error) prints "error: ..." and exits 1.
int guarded(const std::function<int()>& body);

// Output files of one call, as (option, path) with empty paths not given: two that name the same
// file are an error (the second would overwrite the first).
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

// Where run and grad compute, and the options only some devices read: --device cpu|cuda|emu (the
// API's names; "gpu" is read as "cuda"), --executor and --threads (the cpu device's executors),
// --tile (the plan executor's), --arch (the emulated arch) and --dtype (fp16/bf16: what the kernels
// read; each command registers it with its own help). check() makes an option given where nothing
// reads it an error naming where it applies, since it would otherwise be ignored.
struct DeviceOptions {
  std::string device = "cpu", executor = "reference", tile = "64x64", dtype = "fp32", arch = "sm_80";
  unsigned threads = 0;
  bool banks = false;
  CLI::Option *executor_option = nullptr, *arch_option = nullptr, *tile_option = nullptr, *threads_option = nullptr;
  // `kernels`: what --device cuda|emu runs ("the GPU kernel"), for the help text.
  void add_to(CLI::App* app, const std::string& kernels);
  void check() const;
  // --banks: the emulator's shared-memory bank profile (emulator/bank_profile.hpp) from before the
  // run to its report.
  void start_bank_profile() const;
  void print_bank_profile() const;
  bool kernel() const { return device != "cpu"; }
};

// Host memory a call's tensors need: above `max_bytes` (0: the machine's physical memory) a
// UserError naming --max-bytes, the estimate and what it counts (`tensors`).
void check_host_memory(double bytes, int64_t max_bytes, const std::string& tensors);

std::string human_count(double n);

// "batch=1 seq_q=... head_dim_v=..." for the one-line summaries of run and grad.
std::string shape_summary(const Shape& s);

}  // namespace attnjit::cli

namespace attnjit::cli {

// --head-dim, --head-dim-v, --dtype, --arch (comma list), --kernel-tile, --stages: which kernels.
struct KernelOptions {
  int head_dim = kDefaultHeadDim, head_dim_v = 0, stages = 0;
  std::string dtype = "bf16", archs = "sm_80", tile = "default";
  bool random_in_kernel = false;  // random layouts left to the kernels (KernelRequest::random_in_kernel)
  void add_to(CLI::App* app, bool with_head_dim);
  std::vector<KernelRequest> requests() const;  // one per arch, at these options' head dims
  std::vector<KernelRequest> requests(const Shape& s) const;  // one per arch, at s's head dims
};

// "sm_80" -> Device::emu(80), "sm_90a" -> Device::emu(90, true); an arch no GPU has is an error.
Device emu_device(const std::string& arch);

}  // namespace attnjit::cli
