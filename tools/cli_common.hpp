// Pieces shared by the `attnjit` subcommands: shape options, loading inputs, error reporting.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>

#include "compiler/cache/kernel_cache.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"
#include "attnjit/attnjit.hpp"

namespace attnjit::cli {

// A CLI11 check: an integer >= min (a negative size or limit is an error, never "not given").
CLI::Validator at_least(int64_t min);

// --seq/--seq-q, --seq-k, --heads-q, --heads-kv, --q-offset, --k-offset (and optionally batch and head dims).
struct ShapeOptions {
  int64_t seq_q = 0, seq_k = 0, heads_q = 8, heads_kv = 0, q_offset = 0, k_offset = 0;
  int64_t batch = 1, head_dim = 64, head_dim_v = 0;
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

// --cu-seqlens 0,37,37,101,150: packed documents (run, mask, validate, grad).
void add_cu_seqlens_option(CLI::App* app, std::string& text);
// The documents of a call: parsed from `text` and checked against the pattern and shape
// (check_documents), or nothing when `text` is empty.
std::optional<std::vector<int64_t>> documents_for(const Pattern& p, const Shape& s, const std::string& text,
                                                  bool has_dynamic_table);

// Runs a subcommand body; a UserError (or any other error) prints "error: ..." and exits 1.
int guarded(const std::function<int()>& body);

std::string human_count(double n);

// "batch=1 seq_q=... head_dim_v=..." for the one-line summaries of run and grad.
std::string shape_summary(const Shape& s);

}  // namespace attnjit::cli

namespace attnjit::cli {

// --head-dim, --head-dim-v, --dtype, --arch (comma list), --kernel-tile, --stages: which kernels.
struct KernelOptions {
  int head_dim = 128, head_dim_v = 0, stages = 0;
  std::string dtype = "bf16", archs = "sm_80", tile = "default";
  bool random_in_kernel = false;  // random layouts left to the kernels (KernelRequest::random_in_kernel)
  void add_to(CLI::App* app, bool with_head_dim);
  std::vector<KernelRequest> requests() const;  // one per arch
};

int parse_arch(const std::string& text);                  // "sm_80" -> 80; UserError otherwise
Device emu_device(const std::string& arch);               // "sm_80" -> Device::emu(80), "sm_90a" -> Device::emu(90, true)

}  // namespace attnjit::cli
