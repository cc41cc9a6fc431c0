// The paged forward planned on the device (PagedCall::device_kv_lens; templates/plan_paged.cuh)
// against the float64 reference (tests/gpu/paged_cases.hpp): every example, decode, speculative and
// chunked prefill, tiles, page sizes and classes of heads, wrong lengths, the planner's tables
// against the host plan's, a CUDA graph's replay, and the planner's deliberately broken variants.
#include <catch2/catch.hpp>

#include <cstring>

#include "compiler/codegen/codegen.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/plan/paged_plan.hpp"
#include "runtime/kernel_params.hpp"
#include "tests/gpu/paged_cases.hpp"

namespace attnjit::gputest {

TEST_CASE("paged attention planned on the device: every example, decode, speculative and chunked prefill", "[gpu][emu][paged][device-plan]") {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (const auto& [name, p] : example_patterns()) {
    const DType dt = i % 3 == 0 ? DType::BF16 : i % 3 == 1 ? DType::F16 : DType::F32;
    PagedCase m = mixed(name + " mixed, planned on the device", p, dt, i % 2 ? 16 : 64, 0);
    m.mode = i % 2 ? PagedCase::Mode::DeviceForward : PagedCase::Mode::DeviceRun;
    check(m);
    PagedCase d = decode(name + " decode, planned on the device", p, dt, i % 2 ? 64 : 16, i % 3 == 2 ? 4 : 0);
    d.mode = i % 2 ? PagedCase::Mode::DeviceRun : PagedCase::Mode::DeviceForward;
    d.fp8 = name == "longnet";
    check(d);
    ++i;
  }
}

TEST_CASE("paged attention planned on the device: tiles, page sizes and head classes", "[gpu][emu][paged][device-plan]") {
  SKIP_WITHOUT_GPU();
  const Pattern longnet = example_patterns().at(2).second;
  for (const auto& [tq, tk] : std::vector<std::pair<int, int>>{{1, 16}, {4, 32}, {64, 32}}) {
    PagedCase c = mixed("tile " + std::to_string(tq) + "x" + std::to_string(tk), longnet, DType::BF16, 7, 2);
    c.config.tile_q = tq, c.config.tile_k = tk;
    c.mode = PagedCase::Mode::DeviceRun;
    check(c);
  }
  // 16 query heads over 2: classes of up to tile_q heads where offsets agree (none for LongNet's
  // rates, all 8 for the window's), and page size 1.
  for (const auto& [name, p] : std::vector<std::pair<std::string, Pattern>>{{"longnet", longnet}, {"window", example_patterns().at(4).second}}) {
    PagedCase c = decode(name + " 16:2 heads, page size 1", p, DType::F16, 1, 0);
    c.heads_q = 16;
    c.mode = PagedCase::Mode::DeviceForward;
    check(c);
    // GQA 16:1 (a class of 16 heads fills the tensor cores' 16 rows) and a chunk of 128 queries.
    PagedCase g = mixed(name + " 16:1 heads, 128 queries", p, DType::BF16, 16, 0);
    g.heads_q = 16, g.heads_kv = 1;
    g.kv_lens = {1, 2100, 700};
    g.queries = {1, 1, 128};
    for (const PagedCase::Mode mode : {PagedCase::Mode::Forward, PagedCase::Mode::DeviceRun}) {
      g.mode = mode;
      check(g);
    }
  }
}

TEST_CASE("paged attention planned on the device: wrong lengths make their request's rows NaN, counted (CPU: refused)", "[gpu][emu][paged][device-plan][errors]") {
  SKIP_WITHOUT_GPU();
  const Pattern causal = example_patterns().at(1).second;
  // Request 2 has 4 queries: fewer cached tokens than that, a negative length, more than its table.
  for (const int64_t wrong : {int64_t{2}, int64_t{-5}, int64_t{1} << 30}) {
    PagedCase c = mixed("kv_len " + std::to_string(wrong) + " for 4 queries", causal, DType::BF16, 16, wrong == 2 ? 3 : 0);
    c.mode = wrong == 2 ? PagedCase::Mode::DeviceRun : PagedCase::Mode::DeviceForward;
    c.bad_length_request = 2;
    c.bad_length = wrong;
    INFO(c.name);
    if (target() == Target::Cpu) {  // its memory is the host's: the lengths are checked, the call refused by name
      CHECK_THROWS_WITH(run_paged(c), Catch::Contains("request 2") || Catch::Contains("kv_lens[2]"));
      continue;
    }
    const PagedResult r = run_paged(c);
    CHECK(r.mismatches == 0);
    CHECK(r.errors == 1);
  }
}

TEST_CASE("paged attention planned on the device: a decode step visits the host plan's key tiles", "[emu][paged][device-plan]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the device planner's tables are read back in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  for (const auto& [name, p] : example_patterns()) {
    INFO(name);
    PagedCase c = decode(name + " tables", p, DType::BF16, 16, 0);
    c.mode = PagedCase::Mode::DeviceRun;
    std::vector<unsigned char> bytes;
    PagedCapacity cap;
    c.workspace_out = &bytes, c.capacity_out = &cap;
    CHECK(run_paged(c).mismatches == 0);
    KernelRequest k;
    k.head_dim = int(c.head_dim), k.head_dim_v = int(c.head_dim_v);
    const KernelConfig kc = resolve_paged_config(k);
    const PagedWorkspace w = paged_workspace(cap, kc.tile_q, c.head_dim_v);
    int32_t items = 0;
    std::memcpy(&items, bytes.data() + w.header, 4);
    // Tiles visited per (request, head): the device plan's items against the host's.
    auto at = [&](size_t offset, size_t i, auto type) {
      decltype(type) v;
      std::memcpy(&v, bytes.data() + offset + i * sizeof(v), sizeof(v));
      return v;
    };
    int64_t device_tiles = 0;
    for (int32_t i = 0; i < items; ++i) {
      const DeviceItem it = at(w.items, size_t(i), DeviceItem{});
      for (int s = it.span_begin; s < it.span_end; ++s) {
        const DeviceSpan sp = at(w.spans, size_t(s), DeviceSpan{});
        device_tiles += int64_t(sp.tile_end - sp.tile_begin) * at(w.item_heads, size_t(i), int32_t{});
      }
    }
    std::vector<PagedRequest> requests;
    for (size_t b = 0; b < c.kv_lens.size(); ++b) requests.push_back({c.queries[b], c.kv_lens[b]});
    const PagedPlan host = lower_paged_plan(p, c.heads_q, c.heads_kv, c.head_dim, c.head_dim_v, requests, {kc.tile_q, kc.tile_k});
    int64_t host_tiles = 0;
    for (size_t i = 0; i < host.tables.items.size(); ++i) {
      const WorkItem& it = host.tables.items[i];
      for (int64_t s = it.span_begin; s < it.span_end; ++s)
        host_tiles += span_tile_count(host.tables, host.tables.spans[size_t(s)]) * host.item_heads[i];
    }
    // A layout's tiles are the band's on the device (the forward seeks through the layout), the
    // layout's own in the host's plan.
    if (pattern_has_layout(p)) {
      CHECK(device_tiles >= host_tiles);
    } else {
      CHECK(device_tiles == host_tiles);
    }
    CHECK(host_tiles > 0);
  }
}

TEST_CASE("paged attention planned on the device: run() captured once replays while lengths change", "[gpu][paged][device-plan][graph]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: CUDA graphs need a GPU"); return; }
  shared_context(0).make_current();
  for (const auto& [name, p] : example_patterns()) {
    PagedCase c = decode(name + " captured decode, planned on the device", p, DType::BF16, 16, 0);
    c.mode = PagedCase::Mode::DeviceGraph;
    check(c);
    PagedCase m = mixed(name + " captured chunks, planned on the device", p, DType::BF16, 16, 3);
    m.mode = PagedCase::Mode::DeviceGraph;
    check(m);
  }
}

TEST_CASE("paged attention planned on the device: every deliberately broken planner fails in the emulator", "[emu][paged][device-plan][mutation]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the mutations run in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  const Pattern longnet = example_patterns().at(2).second, window = example_patterns().at(4).second;
  // Causal segments of 64 tokens: consecutive rows share items, and a chunk crosses a boundary.
  const Pattern segments = parse_spec(R"({"attnjit": 1, "branches": [{"segment": 64, "dilation": 1, "causal": true}]})");
  std::vector<PagedCase> cases;
  for (const Pattern* p : {&longnet, &window, &segments}) {
    for (int n = 0; n < 3; ++n) {
      PagedCase c = n == 1 ? decode("mutation", *p, DType::F32, 16, 0) : mixed("mutation", *p, DType::F32, 16, n == 0 ? 1 : 3);
      c.mode = n == 0 ? PagedCase::Mode::DeviceForward : PagedCase::Mode::DeviceRun;
      if (n == 2) c.bad_length_request = 2, c.bad_length = 3, c.expected_errors = 1;
      if (p == &segments && n != 1) c.kv_lens[5] = 340;  // queries at 303 .. 339, across 320
      cases.push_back(c);
    }
  }
  check_mutations(cases, {
      {"keys one past the step's length", "plan_paged.cuh", "seg + seg_len < kv_len ? seg + seg_len : kv_len;",
       "seg + seg_len < kv_len ? seg + seg_len : kv_len + 1;"},
      {"the band's left edge taken as full", "plan_paged.cuh", "    fb = (flo + tk - 1) / tk;\n", "    fb = 0;\n"},
      {"rows of different branches in one item", "plan_paged.cuh", "    if (sa != aj_pg_selected(b, off, c)) return false;\n", "\n"},
      {"rows of different segments in one item", "plan_paged.cuh",
       "    if (sa && aj_pg_segment_of(b, a) != aj_pg_segment_of(b, c)) return false;\n", "\n"},
      {"every class at offset 0", "plan_paged.cuh", "!aj_pg_selected(br, off, r.q_pos + i)", "!aj_pg_selected(br, 0, r.q_pos + i)"},
      {"queries one position late", "plan_paged.cuh", "r.q_pos = r.len_ok ? r.kv_len - r.queries : 0;",
       "r.q_pos = r.len_ok ? r.kv_len - r.queries + 1 : 0;"},
      {"each thread's items from its count, not the prefix", "plan_paged.cuh", "      sums[x] = run;\n", "\n"},
      {"no barrier before the prefix is read", "plan_paged.cuh", "    tiles[0] = run;  // the total, until the barrier below\n  }\n  aj_syncthreads();\n",
       "    tiles[0] = run;  // the total, until the barrier below\n  }\n"},
      {"a refused length's rows left as numbers", "fwd_paged.cuh", "  if (item.span_begin < 0) {", "  if (false) {"},
      {"a refused length attended anyway", "plan_paged.cuh", "  r.len_ok = r.kv_len >= r.queries && pages <= pp.table_stride;",
       "  r.len_ok = r.kv_len >= 0;"},
  });
}


}  // namespace attnjit::gputest
