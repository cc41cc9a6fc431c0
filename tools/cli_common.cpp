#include "tools/cli_common.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "compiler/jit/jit.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/support/parse_int.hpp"
#include "compiler/support/read_file.hpp"
#include "emulator/bank_profile.hpp"

namespace attnjit::cli {

// A given size must be at least `min`: 0 or a negative value is never read as "not given"
// (seq_k, heads_kv and head_dim_v use 0 internally for that).
CLI::Validator at_least(int64_t min) {
  return CLI::Validator(
      [min](std::string& v) {
        if (parse_int(v, min, INT64_MAX)) return std::string();
        return "must be an integer >= " + std::to_string(min) + ", got " + v;
      },
      ">=" + std::to_string(min));
}

CLI::Validator in_range(int64_t min, int64_t max) {
  const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max, range](std::string& v) {
        if (parse_int(v, min, max)) return std::string();
        return "must be an integer in " + range + ", got " + v;
      },
      range);
}

void ShapeOptions::add_to(CLI::App* app, bool with_dims) {
  app->add_option("--seq,--seq-q", seq_q, "query sequence length")->check(at_least(1));
  app->add_option("--seq-k", seq_k, "key sequence length (default: --seq)")->check(at_least(1));
  app->add_option("--heads-q", heads_q, "query heads")->capture_default_str()->check(at_least(1));
  app->add_option("--heads-kv", heads_kv, "key/value heads (default: --heads-q)")->check(at_least(1));
  app->add_option("--q-offset", q_offset, "global position of query row 0")->capture_default_str()->check(at_least(0));
  app->add_option("--k-offset", k_offset, "global position of key row 0")->capture_default_str()->check(at_least(0));
  if (with_dims) {
    app->add_option("--batch", batch, "batch size")->capture_default_str()->check(at_least(1));
    app->add_option("--head-dim", head_dim, "head dimension of q and k")->capture_default_str()->check(at_least(1));
    app->add_option("--head-dim-v", head_dim_v, "head dimension of v (default: --head-dim)")->check(at_least(1));
  }
}

Shape ShapeOptions::shape() const {
  Shape s;
  s.batch = batch;
  s.seq_q = seq_q;
  s.seq_k = seq_k > 0 ? seq_k : seq_q;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv > 0 ? heads_kv : heads_q;
  s.head_dim = head_dim;
  s.head_dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  s.q_offset = q_offset;
  s.k_offset = k_offset;
  return s;
}

void DeviceOptions::add_to(CLI::App* app, const std::string& kernels) {
  app->add_option("--device", device,
                  "where to run: cpu (reference or plan executor), cuda (GPU 0; gpu is the same), or emu (" + kernels +
                      " in the CPU emulator)")
      ->transform([](std::string v) { return v == "gpu" ? std::string("cuda") : v; }, "gpu is cuda")
      ->check(CLI::IsMember({"cpu", "cuda", "emu"}))
      ->capture_default_str();
  arch_option = app->add_option("--arch", arch, "with --device emu: the GPU arch to emulate (sm_75, sm_80, ...)")
                    ->capture_default_str();
  executor_option = app->add_option("--executor", executor,
                                    "with --device cpu: the float64 reference, or the plan executor (float32, tile by tile)")
                        ->check(CLI::IsMember({"reference", "plan"}))
                        ->capture_default_str();
  tile_option = app->add_option("--tile", tile, "with --device cpu --executor plan: the plan's tile")->capture_default_str();
  threads_option = app->add_option("--threads", threads, "with --device cpu: the executor's threads (0: all)");
  app->add_flag("--banks", banks,
                "with --device emu: count the shared-memory wavefronts of every access the kernels make (32 banks of "
                "4 bytes) and print the sites, the most bank-conflicted first");
}

void DeviceOptions::start_bank_profile() const {
  if (!banks) return;
  emu::clear_bank_profile();
  emu::set_bank_profile(true);
}

void DeviceOptions::print_bank_profile() const {
  if (!banks) return;
  emu::set_bank_profile(false);
  const std::string report = emu::bank_report(emu::bank_profile());
  std::cout << (report.empty() ? std::string("  no shared-memory access by threads was counted (TMA copies and wgmma operands are not)\n") : report);
}

void add_cu_seqlens_option(CLI::App* app, DocumentsOption& option) {
  app->add_option_function<std::string>(
      "--cu-seqlens",
      [&option](const std::string& text) {
        option.text = text;
        option.given = true;
      },
      "packed documents: cumulative lengths 0,e1,...,seq (batch 1, seq_q == seq_k, no offsets); each "
      "document attends only itself, with positions restarting at 0");
}

std::optional<std::vector<int64_t>> documents_for(const Pattern& p, const Shape& s, const DocumentsOption& option,
                                                  bool has_dynamic_table) {
  if (!option.given) return std::nullopt;
  std::vector<int64_t> cu = parse_cu_seqlens(option.text, "--cu-seqlens");
  check_documents(p, s, cu, has_dynamic_table, "--cu-seqlens");
  return cu;
}

namespace {
std::string& spec_path() {
  static std::string path;
  return path;
}

// Is `where` a JSON pointer into a spec ("/branches/0/heads/0")? Its first step is a spec field.
bool spec_pointer(const std::string& where) {
  if (where.empty() || where[0] != '/') return false;
  const std::string first = where.substr(1, where.find_first_of("/:", 1) - 1);
  for (const char* field : {"attnjit", "description", "combine", "group_scale", "causal", "window", "scale", "layout", "branches"})
    if (first == field) return true;
  return false;
}
}  // namespace

std::string canonical_for_people(const Pattern& p, bool full) {
  if (full) return canonical_text(p);
  int64_t not_shown = 0;
  std::string text = canonical_summary(p, 16, &not_shown);
  if (not_shown > 0) {
    text += "(" + std::to_string(not_shown) + " explicit blocks not shown; --full prints every one, the hash covers them all)\n";
  }
  return text;
}

Pattern load_spec(const std::string& path) {
  Pattern p = load_spec_file(path);
  spec_path() = path;
  return p;
}

DynamicLayout load_dynamic_layout(const std::string& path) {
  return parse_dynamic_layout(read_small_file(path, "dynamic layout file"), path);
}

DynamicLayout parse_dynamic_layout(const std::string& text, const std::string& path) {
  // nlohmann's reader takes a NUL byte for the end of its input and ignores the rest.
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    throw UserError(path, "a NUL byte (0x00) at offset " + std::to_string(nul) +
                              "; JSON text has none, so this is not a dynamic layout table (a binary file, or one cut short and padded)");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number past a double's range
    std::string msg = e.what();  // drop nlohmann's "[json.exception.parse_error.101] " prefix
    const size_t close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
    throw UserError(path, "invalid JSON: " + msg);
  }
  const char* shape_hint = "expected {\"heads\": 1, \"row_offsets\": [...], \"col_indices\": [...]}";
  if (!j.is_object() || !j.contains("row_offsets") || !j.contains("col_indices")) throw UserError(path, shape_hint);
  for (const auto& [key, value] : j.items()) {
    if (key != "heads" && key != "row_offsets" && key != "col_indices") {
      throw UserError(path + ": /" + printable(key), "unknown field \"" + printable(key) + "\"; valid fields are heads, row_offsets, col_indices");
    }
  }
  // nlohmann's get<> would truncate 2.5 to 2 and wrap 2^32 to 0: check each number first.
  // Only scalars are printed: dump() of a deeply nested value would recurse without bound.
  auto shown = [](const nlohmann::json& v) { return v.is_primitive() ? v.dump() : std::string("an ") + v.type_name(); };
  auto integers = [&](const char* key, int64_t max) {
    const nlohmann::json& a = j[key];
    if (!a.is_array()) throw UserError(path + ": /" + key, "expected an array of integers, got " + shown(a));
    std::vector<int64_t> out;
    for (size_t n = 0; n < a.size(); ++n) {
      // Non-negative integers are stored unsigned by nlohmann.
      if (!a[n].is_number_unsigned() || a[n].get<uint64_t>() > static_cast<uint64_t>(max)) {
        throw UserError(path + ": /" + key + "/" + std::to_string(n),
                        "expected an integer in [0, " + std::to_string(max) + "], got " + shown(a[n]));
      }
      out.push_back(a[n].get<int64_t>());
    }
    return out;
  };
  DynamicLayout d;
  if (j.contains("heads")) {
    if (!j["heads"].is_number_integer()) throw UserError(path + ": /heads", "expected an integer, got " + shown(j["heads"]));
    d.heads = j["heads"].get<int64_t>();
  }
  d.row_offsets = integers("row_offsets", INT64_MAX);
  for (int64_t kb : integers("col_indices", INT32_MAX)) d.col_indices.push_back(static_cast<int32_t>(kb));
  if (d.row_offsets.empty()) throw UserError(path, "row_offsets is empty; it needs heads * query_blocks + 1 entries");
  if (d.heads < 1) throw UserError(path, "heads must be >= 1");
  return d;
}

std::optional<DynamicLayout> dynamic_table_for(const Pattern& p, const Shape& s, const std::string& path) {
  if (path.empty()) {
    if (p.has_dynamic_layout()) throw UserError("--dynamic", "the pattern has a dynamic layout; give its CSR table with --dynamic FILE");
    return std::nullopt;
  }
  DynamicLayout d = load_dynamic_layout(path);
  check_dynamic_layout(p, s, d, path);
  return d;
}

int guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UserError& e) {
    const bool in_spec = !spec_path().empty() && spec_pointer(e.where());
    std::cerr << "error: " << (in_spec ? spec_path() + ": " : std::string()) << e.what() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory; try a smaller shape\n";
  } catch (const std::length_error&) {  // a container asked for more than it can ever hold
    std::cerr << "error: out of memory; try a smaller shape\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (size_t b = 0; b < outputs.size(); ++b) {
    for (size_t a = 0; a < b; ++a) {
      const std::string &x = outputs[a].second, &y = outputs[b].second;
      if (x.empty() || y.empty()) continue;
      std::error_code ec1, ec2;
      const bool same = std::filesystem::weakly_canonical(x, ec1) == std::filesystem::weakly_canonical(y, ec2) &&
                        !ec1 && !ec2;
      std::error_code ec3;
      if (same || x == y || std::filesystem::equivalent(x, y, ec3)) {
        throw UserError(outputs[b].first + " " + y, "is the file " + outputs[a].first + " writes too; give each output its own file");
      }
    }
  }
}

void DeviceOptions::check() const {
  if (executor_option->count() > 0 && kernel()) {
    throw UserError("--executor " + executor, "chooses how the cpu device runs; --device " + device +
                                                  " runs the generated kernel (drop --executor, or use --device cpu)");
  }
  if (threads_option->count() > 0 && kernel()) {
    throw UserError("--threads " + std::to_string(threads),
                    "applies to --device cpu (the executor's threads); " +
                        std::string(device == "emu" ? "the emulator's threads are ATTNJIT_EMU_THREADS" : "a GPU runs the kernel itself"));
  }
  if (arch_option->count() > 0 && device != "emu") {
    throw UserError("--arch " + arch, "applies to --device emu (the arch whose kernel is emulated); " +
                                          std::string(device == "cpu" ? "the cpu device runs no kernel"
                                                                      : "a gpu runs the kernel of its own arch"));
  }
  if (banks && device != "emu") {
    throw UserError("--banks", "counts the shared-memory accesses of kernels the emulator runs; use it with --device emu (" +
                                   std::string(device == "cpu" ? "the cpu device runs no kernel" : "on a GPU, Nsight Compute's "
                                                                 "l1tex shared-memory wavefront metrics say the same") + ")");
  }
  if (device == "emu") emu_device(arch);  // an arch no GPU has, before anything is read
  if (tile_option->count() > 0 && (kernel() || executor != "plan"))
    throw UserError("--tile " + tile, kernel() ? "applies to --device cpu --executor plan (the plan's tile); --device " + device +
                                                     " runs the generated kernels at their own tiles (--kernel-tile)"
                                               : std::string("applies to --executor plan (the plan's tile); the reference "
                                                             "executor has no tiles"));
  const DType d = parse_dtype(dtype);
  if (!kernel() && (d == DType::F16 || d == DType::BF16))
    throw UserError("--dtype " + dtype, "applies to --device cuda or emu (the dtype the kernels read); the cpu executors compute "
                                        "from the inputs as given (the reference in float64, the plan executor in float32)");
}

void check_host_memory(double bytes, int64_t max_bytes, const std::string& tensors) {
  double limit = static_cast<double>(max_bytes);
  if (max_bytes <= 0) limit = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (bytes <= limit) return;
  auto size = [](double b) {
    char buf[64];
    if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
    return std::string(buf);
  };
  throw UserError("--max-bytes", "the tensors of this call (" + tensors + ") take about " + size(bytes) +
                                     " of host memory, more than the " + size(limit) + " allowed (" +
                                     (max_bytes <= 0 ? std::string("default: this machine's memory") : "--max-bytes " + std::to_string(max_bytes)) +
                                     "); use a shorter sequence or fewer heads (a long sequence runs in chunks with --q-offset)");
}

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (n >= 1000.0 && u < 5) {
    n /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s" : "%.0f%s", n, units[u]);
  return buf;
}

std::string shape_summary(const Shape& s) {
  return "batch=" + std::to_string(s.batch) + " seq_q=" + std::to_string(s.seq_q) + " seq_k=" + std::to_string(s.seq_k) +
         " heads_q=" + std::to_string(s.heads_q) + " heads_kv=" + std::to_string(s.heads_kv) + " head_dim=" +
         std::to_string(s.head_dim) + " head_dim_v=" + std::to_string(s.head_dim_v);
}

}  // namespace attnjit::cli

namespace attnjit::cli {

void KernelOptions::add_to(CLI::App* app, bool with_head_dim) {
  if (with_head_dim) {
    app->add_option("--head-dim", head_dim, "head dimension of q and k")->capture_default_str();
    app->add_option("--head-dim-v", head_dim_v, "head dimension of v (default: --head-dim)");
  }
  app->add_option("--dtype", dtype, "fp16, bf16 or fp32")->capture_default_str();
  app->add_option("--arch", archs, "target archs, comma separated (sm_75, sm_80, sm_86, sm_90, sm_90a, ...)")->capture_default_str();
  app->add_option("--kernel-tile", tile, "kernel tile QxK, or QxKwN for N warps (e.g. 128x64w4), or default (compile also takes candidates: every "
                  "configuration the autotuner times)")->capture_default_str();
  app->add_option("--stages", stages, "cp.async stages (0: default)");
  app->add_flag("--random-in-kernel", random_in_kernel,
                "random layouts left to the kernels, as the emu and CUDA devices do where a plan would hash more than "
                "ATTNJIT_RANDOM_IN_KERNEL blocks (the kernels then carry the seek; plans list what the band allows)");
}

Device emu_device(const std::string& arch) {
  const ArchName a = parse_arch_name(arch);
  if (!is_gpu_arch(a.arch))
    throw UserError("--arch " + arch, "no GPU has this arch, so the emulator cannot model it; use one of " + gpu_arch_list());
  return Device::emu(a.arch, a.specific);
}

std::vector<KernelRequest> KernelOptions::requests() const {
  Shape s;
  s.head_dim = head_dim;
  s.head_dim_v = head_dim_v > 0 ? head_dim_v : head_dim;
  return requests(s);
}

std::vector<KernelRequest> KernelOptions::requests(const Shape& s) const {
  std::vector<KernelRequest> out;
  std::stringstream ss(archs);
  for (std::string a; std::getline(ss, a, ',');) {
    if (a.empty()) continue;
    const ArchName an = parse_arch_name(a);
    KernelRequest r = knob_request(s, parse_dtype(dtype), an.arch, an.specific);
    r.config = parse_kernel_tile(tile);
    r.config.stages = stages;
    r.random_in_kernel = random_in_kernel;
    out.push_back(r);
  }
  if (out.empty()) throw UserError("--arch", "name at least one arch, e.g. sm_80");
  return out;
}


}  // namespace attnjit::cli
