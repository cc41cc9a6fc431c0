// The plan of one call over a paged KV cache (decode, chunked prefill, speculative decoding): each
// request's queries sit at the end of its cached tokens, so request b with n_b queries and kv_len_b
// tokens is the call (seq_q = n_b, seq_k = kv_len_b, q_offset = kv_len_b - n_b) of the ordinary
// planner, and the paged plan is those plans concatenated: one table of work items, each naming
// its request. The key tiles are the request's plan's, so a kernel walking them reads only the
// tokens (and pages) the pattern attends; which page holds a token is the block table's business,
// read by the kernel (templates/fwd_paged.cuh).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/plan/plan.hpp"

namespace attnjit {

struct PagedRequest {
  int64_t queries = 0;  // n_b: the request's last n_b tokens are its queries
  int64_t kv_len = 0;   // cached tokens, the queries' own included
};

struct PagedPlan {
  // The concatenated tables: `tables.items[i]` belongs to request `item_request[i]`, its rows are
  // the request's query indices (0 .. n_b - 1), its key rows the request's token positions.
  // `tables.shape` describes no single call: seq_q is the total of queries, seq_k the longest cache.
  Plan tables;
  std::vector<int32_t> item_request;
  // Heads per item: `tables.items[i]` stands for heads head .. head + item_heads[i] - 1 of one kv
  // group, each with the item's rows (GQA: heads whose rows and key tiles are the same share an
  // item while heads x rows fit tile_q, so the kernel reads each K/V tile once for all of them).
  std::vector<int32_t> item_heads;
  std::vector<int64_t> q_start;  // per request: its first row of the packed queries
  std::vector<int64_t> q_pos;    // per request: the position of its first query (kv_len - n)
  std::vector<PagedRequest> requests;
  // Each request's own plan (null for a request with no queries; requests of the same (queries,
  // kv_len) share one): what the CPU device's executor runs.
  std::vector<std::shared_ptr<const Plan>> request_plans;
  // Most key tiles any item visits: more splits than this leave blocks with nothing to do.
  int64_t max_item_tiles = 0;
};

// Lowers a call. The pattern must not have a dynamic layout (no table describes positions of a
// paged cache); a request with n_b > kv_len_b is a UserError naming it; requests with no queries
// get no items.
PagedPlan lower_paged_plan(const Pattern& p, int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t head_dim_v,
                           const std::vector<PagedRequest>& requests, const TileConfig& tiles);

// How many blocks share each item's key tiles (split-KV): enough items x splits to fill
// `target_blocks`, at most the longest item's tiles and at most 64; 1 for a plan with no items.
int32_t paged_splits(const PagedPlan& plan, int64_t target_blocks);

// Planning on the device (templates/plan_paged.cuh, from lengths in device memory): the query
// heads in classes that plan alike. A class is consecutive heads of one kv group with the same
// branches and offsets and no layout that depends on the head (random, per-head lists), at most
// `tile_q` heads; they share each work item. `offsets[b]` is the class's offset in branch b, -1
// where b does not apply to its heads.
struct PagedHeadClass {
  int32_t head = 0, heads = 1;
  std::vector<int64_t> offsets;
};
std::vector<PagedHeadClass> paged_head_classes(const Pattern& p, int64_t heads_q, int64_t heads_kv, int32_t tile_q);

// Readable text: the requests, then the concatenated tables (print_plan's, first `max_items` items).
std::string print_paged_plan(const PagedPlan& plan, int64_t max_items);

}  // namespace attnjit
