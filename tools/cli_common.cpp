#include "tools/cli_common.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compiler/error.hpp"

namespace attnjit::cli {

void ShapeOptions::add_to(CLI::App* app, bool with_dims) {
  app->add_option("--seq,--seq-q", seq_q, "query sequence length");
  app->add_option("--seq-k", seq_k, "key sequence length (default: --seq)");
  app->add_option("--heads-q,--heads", heads_q, "query heads")->capture_default_str();
  app->add_option("--heads-kv", heads_kv, "key/value heads (default: --heads-q)");
  app->add_option("--q-offset", q_offset, "global position of query row 0")->capture_default_str();
  app->add_option("--k-offset", k_offset, "global position of key row 0")->capture_default_str();
  if (with_dims) {
    app->add_option("--batch", batch, "batch size")->capture_default_str();
    app->add_option("--head-dim", head_dim, "head dimension of q and k")->capture_default_str();
    app->add_option("--head-dim-v", head_dim_v, "head dimension of v (default: --head-dim)");
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

DynamicLayout load_dynamic_layout(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError(path, "cannot open the dynamic layout file; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError(path, std::string("invalid JSON: ") + e.what());
  }
  const char* shape_hint = "expected {\"heads\": 1, \"row_offsets\": [...], \"col_indices\": [...]}";
  if (!j.is_object() || !j.contains("row_offsets") || !j.contains("col_indices")) throw UserError(path, shape_hint);
  DynamicLayout d;
  try {
    d.heads = j.value("heads", int64_t{1});
    d.row_offsets = j["row_offsets"].get<std::vector<int64_t>>();
    d.col_indices = j["col_indices"].get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception&) {
    throw UserError(path, std::string(shape_hint) + ", all integers");
  }
  if (d.row_offsets.empty()) throw UserError(path, "row_offsets is empty; it needs heads * query_blocks + 1 entries");
  if (d.heads < 1) throw UserError(path, "heads must be >= 1");
  return d;
}

int guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory; try a smaller shape\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
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

}  // namespace attnjit::cli
