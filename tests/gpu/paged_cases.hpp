// The paged forward's test harness (PagedAttention), shared by tests/gpu/test_paged_gpu.cpp (calls
// planned on the host, the kernels' mutations) and tests/gpu/test_paged_device_plan_gpu.cpp (calls
// planned on the device): a case is requests of K/V rows scattered into shuffled pages with NaN in
// every slot no request owns, run on the device under test (tests/gpu/test_target.hpp) and checked
// against the float64 reference on each request's gathered tokens.
#pragma once

#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/gpu/attention_cases.hpp"

namespace attnjit::gputest {

struct PagedCase {
  std::string name;
  Pattern pattern;
  int64_t heads_q = 6, heads_kv = 2, head_dim = 64, head_dim_v = 64;
  DType dtype = DType::BF16;
  int64_t page_size = 16;
  std::vector<int64_t> kv_lens, queries;  // per request
  int32_t splits = 0;
  int arch = 80;
  KernelConfig config;
  uint64_t seed = 1;
  std::shared_ptr<const TemplateSet> templates;  // a deliberately broken kernel (null: the embedded templates)
  bool fp8 = false;  // FP8 e4m3 caches with a random scale per kv head for K and for V
  // How the call runs: forward(); plan() and run() over a workspace whose capacity exceeds the plan
  // (blocks past it return); or (a GPU) run() captured once in a CUDA graph and replayed after the
  // plan() of a step one token shorter, then after plan() of this call.
  // With lengths on the device (PagedCall::device_kv_lens, planned by the _plan kernel): forward();
  // run() over a workspace of needs() after a run() of the step one token shorter; or (a GPU) that
  // run() captured once and replayed after each step's lengths are copied into the same buffers.
  enum class Mode { Forward, PlanRun, Graph, DeviceForward, DeviceRun, DeviceGraph } mode = Mode::Forward;
  // Lengths on the device: one request's kv_len replaced by this (its rows then NaN, counted).
  int bad_length_request = -1;
  int64_t bad_length = 0;
  // The mutation tests: the counter's value a run must end with (-1: not checked).
  int expected_errors = -1;
  // DeviceRun: the workspace after the run (the device planner's tables) and its capacity.
  std::vector<unsigned char>* workspace_out = nullptr;
  PagedCapacity* capacity_out = nullptr;
  // A request whose first page index is past the cache, with an error counter: its keys there are
  // counted and skipped (its rows only finite), every other request's rows exact.
  int bad_page_request = -1;
  // V elements of one request's token set to a value (request, position, kv head, dim, value).
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, float>> v_values;
};

struct PagedResult {
  size_t rows = 0, mismatches = 0;
  double worst = 0;
  int32_t errors = 0;  // the counter's value (bad_page_request)
  std::string detail;  // the first few differences, a line each
};

Device device_for(int arch);
// Runs the case and checks every row of every request against the reference.
PagedResult run_paged(const PagedCase& c);
// run_paged with every row right, and some rows checked.
void check(const PagedCase& c);

// Decode (one query per request), speculative decoding (4) and chunked prefill (a chunk of 37)
// at lengths around LongNet's segments and the block layouts' blocks, one request with no queries.
PagedCase mixed(std::string name, Pattern p, DType dt, int64_t page_size, int32_t splits);
// Decode at lengths around LongNet's segments and the layouts' blocks: one query per request, no
// cu_seqlens_q, GQA 4:1 (the heads of a kv group share items where their offsets agree).
PagedCase decode(std::string name, Pattern p, DType dt, int64_t page_size, int32_t splits);

// A deliberately broken kernel: `from` replaced by `to` in the template `file`.
struct TemplateMutation {
  const char* name;
  const char* file;
  const char* from;
  const char* to;
};
// The cases pass with the embedded templates, and each mutation makes some row of them fail.
void check_mutations(const std::vector<PagedCase>& cases, const std::vector<TemplateMutation>& mutations);
// A NaN in V at a key its request's query attends, and an inf at key 299 of request 5, which only
// its last query attends (a masked non-finite V for the others); FP8 caches keep the NaN alone.
void put_non_finite_values(PagedCase& c);

}  // namespace attnjit::gputest
