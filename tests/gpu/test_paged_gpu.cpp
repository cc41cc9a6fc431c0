// The paged forward (PagedAttention; templates/fwd_paged.cuh, fwd_paged_tc.cuh) planned on the host,
// against the float64 reference (tests/gpu/paged_cases.hpp): every example pattern, decode and
// chunked prefill, GQA, fp32/fp16/bf16, page sizes 1 to 256, split-KV from one split to many, every
// tile the paged kernels take, FP8 caches, non-finite values, the refusals, and the SIMT and
// tensor-core kernels' deliberately broken variants.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "compiler/codegen/codegen.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "tests/gpu/paged_cases.hpp"

namespace attnjit::gputest {

TEST_CASE("paged attention: every example pattern, decode and chunked prefill, matches the reference", "[gpu][emu][paged]") {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (const auto& [name, p] : example_patterns()) {
    const DType dt = i % 3 == 0 ? DType::BF16 : i % 3 == 1 ? DType::F16 : DType::F32;
    check(mixed(name + "-" + to_string(dt), p, dt, i % 2 ? 16 : 64, 0));
    ++i;
  }
}

TEST_CASE("paged attention: page sizes, splits, tiles and head dims", "[gpu][emu][paged]") {
  SKIP_WITHOUT_GPU();
  const Pattern longnet = example_patterns().at(2).second;  // bigbird, causal_local, longnet, ...
  REQUIRE(example_patterns().at(2).first == "longnet");
  for (int64_t page : {1, 7, 256}) check(mixed("page " + std::to_string(page), longnet, DType::BF16, page, 0));
  for (int32_t splits : {1, 2, 5, 64}) check(mixed("splits " + std::to_string(splits), longnet, DType::BF16, 16, splits));
  for (const auto& [tq, tk] : std::vector<std::pair<int, int>>{{1, 16}, {8, 32}, {16, 64}, {64, 32}}) {
    PagedCase c = mixed("tile " + std::to_string(tq) + "x" + std::to_string(tk), longnet, DType::F16, 16, 3);
    c.config.tile_q = tq, c.config.tile_k = tk;
    check(c);
  }
  // 36: rows of 72 bytes, no 16-byte loads (AjPagedParams::vec16 off).
  for (const auto& [d, dv] : std::vector<std::pair<int64_t, int64_t>>{{32, 32}, {128, 128}, {256, 256}, {64, 32}, {40, 72}, {36, 36}}) {
    PagedCase c = mixed("head dims " + std::to_string(d) + "/" + std::to_string(dv), longnet, DType::BF16, 16, 2);
    c.head_dim = d, c.head_dim_v = dv;
    c.heads_q = 4, c.heads_kv = 4;
    check(c);
  }
  PagedCase sm61 = mixed("sm_61", longnet, DType::F16, 16, 0);
  sm61.arch = 61;
  check(sm61);
}

TEST_CASE("paged attention: FP8 e4m3 caches with per-head scales match the reference on their values", "[gpu][emu][paged][fp8]") {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, p] : example_patterns()) {
    for (const DType dt : {DType::BF16, DType::F16, DType::F32}) {
      PagedCase c = mixed(name + " fp8 caches, " + to_string(dt) + " queries", p, dt, 16, dt == DType::F32 ? 1 : 3);
      c.fp8 = true;
      if (dt == DType::F16) c.head_dim = c.head_dim_v = 40;  // rows of 40 bytes: element loads
      check(c);
      if (target() == Target::Emu && dt != DType::F32) {  // sm_89 and newer decode by cvt (a GPU: its own arch)
        c.name += ", sm_90";
        c.arch = 90;
        c.head_dim = c.head_dim_v = 64;  // aligned rows: the codes 8 to a read
        check(c);
      }
    }
  }
  PagedCase nan = mixed("fp8 caches, a NaN code in V", example_patterns().at(4).second, DType::BF16, 16, 2);
  nan.fp8 = true;
  nan.v_values = {{3, 4490, 0, 5, std::numeric_limits<float>::quiet_NaN()}};
  check(nan);
}

TEST_CASE("paged attention: plan() and run() over a workspace give forward()'s answer", "[gpu][emu][paged][graph]") {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, p] : example_patterns()) {
    PagedCase c = mixed(name + " plan/run", p, DType::BF16, 16, name == "bigbird" ? 3 : 0);
    c.mode = PagedCase::Mode::PlanRun;
    c.fp8 = name == "longnet";
    check(c);
  }
}

TEST_CASE("paged attention: run() captured in a CUDA graph replays each step's plan()", "[gpu][paged][graph]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: CUDA graphs need a GPU"); return; }
  shared_context(0).make_current();
  for (const auto& [name, p] : example_patterns()) {
    PagedCase c = mixed(name + " graph", p, DType::BF16, 16, 0);
    c.mode = PagedCase::Mode::Graph;
    check(c);
  }
}

TEST_CASE("paged attention: a plan above the workspace's capacity is refused, naming the count", "[gpu][emu][paged][graph][errors]") {
  SKIP_WITHOUT_GPU();
  Runtime rt(options_for(device_for(80)));
  PagedAttention pa = rt.prepare_paged(example_patterns().at(1).second, PagedProblem{2, 1, 32, 32, DType::F32, std::nullopt});
  Buf qb(3 * 2 * 32 * 4), kb(8 * 8 * 32 * 4), vb(8 * 8 * 32 * 4), ob(3 * 2 * 32 * 4), tb(3 * 2 * 4);
  std::vector<unsigned char> t(24);
  const int32_t pages[6] = {0, 1, 2, 3, 4, 5};
  std::memcpy(t.data(), pages, 24);
  tb.upload(t);
  PagedCall c;
  c.q = TensorView::contiguous(qb.data(), DType::F32, {3, 2, 32});
  c.k_cache = TensorView::contiguous(kb.data(), DType::F32, {8, 8, 1, 32});
  c.v_cache = TensorView::contiguous(vb.data(), DType::F32, {8, 8, 1, 32});
  c.block_table = static_cast<const int32_t*>(tb.data());
  c.block_table_stride = 2;
  c.kv_lens = {5, 16, 9};
  c.o = TensorView::contiguous(ob.data(), DType::F32, {3, 2, 32});
  const PagedCapacity need = pa.needs(c);
  CHECK(need.requests == 3);
  CHECK(need.items >= 3);
  for (const auto& [field, cap] : std::vector<std::pair<std::string, PagedCapacity>>{
           {"requests", PagedCapacity{2, need.items, need.spans, need.entries, 1}},
           {"items", PagedCapacity{3, need.items - 1, need.spans, need.entries, 1}},
           {"spans", PagedCapacity{3, need.items, need.spans - 1, need.entries, 1}}}) {
    Buf ws(pa.workspace_bytes(cap));
    try {
      pa.plan(c, ws.data(), cap);
      FAIL("not refused: " << field);
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find("PagedCapacity." + field) != std::string::npos);
    }
  }
  Buf ws(pa.workspace_bytes(need));
  CHECK_THROWS_WITH(pa.plan(c, nullptr, need), Catch::Contains("workspace"));
  PagedCapacity bad = need;
  bad.splits = 0;
  CHECK_THROWS_WITH(pa.plan(c, ws.data(), bad), Catch::Contains("PagedCapacity.splits"));
  // A capacity past the kernels' 32-bit counts, whose workspace size would wrap, or below zero is
  // refused before any byte is laid out.
  for (const auto& [field, cap] : std::vector<std::pair<std::string, PagedCapacity>>{
           {"requests", PagedCapacity{int64_t{1} << 62, need.items, need.spans, need.entries, 1}},
           {"items", PagedCapacity{3, int64_t{INT32_MAX} + 1, need.spans, need.entries, 1}},
           {"spans", PagedCapacity{3, need.items, -1, need.entries, 1}},
           {"entries", PagedCapacity{3, need.items, need.spans, int64_t{1} << 40, 1}},
           {"splits", PagedCapacity{3, need.items, need.spans, need.entries, 65}}}) {
    INFO(field);
    CHECK_THROWS_WITH(pa.workspace_bytes(cap), Catch::Contains("PagedCapacity." + field));
    CHECK_THROWS_WITH(pa.plan(c, ws.data(), cap), Catch::Contains("PagedCapacity." + field));
  }
}

TEST_CASE("paged attention: a NaN or inf in V reaches only the rows that attend its key", "[gpu][emu][paged]") {
  SKIP_WITHOUT_GPU();
  const Pattern window = example_patterns().at(4).second;
  REQUIRE(example_patterns().at(4).first == "sliding_window");
  for (int32_t splits : {1, 4}) {
    PagedCase c = mixed("non-finite V, splits " + std::to_string(splits), window, DType::F32, 16, splits);
    const float inf = std::numeric_limits<float>::infinity();
    c.v_values = {{3, 4490, 0, 5, std::numeric_limits<float>::quiet_NaN()}, {3, 10, 1, 0, inf}, {5, 299, 1, 3, -inf}};
    check(c);
  }
}

// Decode and chunked prefill with splits, in bf16 and fp32, planned on the host and on the device,
// small enough for compute-sanitizer.
TEST_CASE("paged attention: a small subset for compute-sanitizer", "[gpu][paged][sanitize]") {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, p] : example_patterns()) {
    if (name != "longnet" && name != "bigbird") continue;
    PagedCase c = mixed(name + " sanitize", p, name == "longnet" ? DType::BF16 : DType::F32, 16, 3);
    c.kv_lens = {1, 70, 2100, 300, 9, 300};
    check(c);
    c.name += " planned on the device";  // the planner kernel too
    c.mode = PagedCase::Mode::DeviceRun;
    check(c);
  }
}

TEST_CASE("paged attention: with a counter, keys on a page outside the cache are counted and skipped", "[gpu][emu][paged][errors]") {
  SKIP_WITHOUT_GPU();
  if (target() == Target::Cpu) { WARN("SKIPPED on the CPU device: it refuses a bad table on the host"); return; }
  for (int32_t splits : {1, 3}) {
    PagedCase c = mixed("a bad page, counted, splits " + std::to_string(splits), example_patterns().at(4).second, DType::BF16, 16, splits);
    c.bad_page_request = 5;  // 300 tokens, 37 queries: its first 16 tokens are in the window of every query
    const PagedResult r = run_paged(c);
    CHECK(r.mismatches == 0);
    CHECK(r.errors > 0);
  }
}

TEST_CASE("paged attention: bad calls are refused by name", "[gpu][emu][paged][errors]") {
  SKIP_WITHOUT_GPU();
  Runtime rt(options_for(device_for(80)));
  PagedAttention pa = rt.prepare_paged(example_patterns().at(1).second, PagedProblem{2, 1, 32, 32, DType::F32, std::nullopt});
  Buf qb(2 * 2 * 32 * 4), kb(4 * 8 * 32 * 4), vb(4 * 8 * 32 * 4), ob(2 * 2 * 32 * 4), tb(2 * 2 * 4);
  std::vector<unsigned char> t(16);
  const int32_t pages[4] = {0, 1, 2, 3};
  std::memcpy(t.data(), pages, 16);
  tb.upload(t);
  auto base = [&] {
    PagedCall c;
    c.q = TensorView::contiguous(qb.data(), DType::F32, {2, 2, 32});
    c.k_cache = TensorView::contiguous(kb.data(), DType::F32, {4, 8, 1, 32});
    c.v_cache = TensorView::contiguous(vb.data(), DType::F32, {4, 8, 1, 32});
    c.block_table = static_cast<const int32_t*>(tb.data());
    c.block_table_stride = 2;
    c.kv_lens = {5, 16};
    c.o = TensorView::contiguous(ob.data(), DType::F32, {2, 2, 32});
    return c;
  };
  auto refused = [&](PagedCall c, const std::string& word) {
    INFO(word);
    try {
      pa.forward(c);
      FAIL("not refused");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find(word) != std::string::npos);
    }
  };
  PagedCall c = base();
  c.kv_lens = {5, 17};
  refused(c, "kv_lens[1]");  // 17 tokens need 3 pages of 8, the table has 2
  c = base();
  c.kv_lens = {-1, 3};
  refused(c, "negative");
  c = base();
  c.cu_seqlens_q = {0, 2, 2};
  c.kv_lens = {1, 3};
  refused(c, "request 0");  // two queries, one cached token
  c = base();
  c.cu_seqlens_q = {0, 1};
  refused(c, "cu_seqlens_q");
  c = base();
  c.q = TensorView::contiguous(qb.data(), DType::F32, {2, 2, 16});
  refused(c, "q");
  c = base();
  c.k_cache = TensorView::contiguous(kb.data(), DType::F16, {4, 8, 1, 32});
  refused(c, "k_cache");
  c = base();
  c.splits = 65;
  refused(c, "splits");
  c = base();
  const float one = 1.0f;
  c.k_scale = &one;
  refused(c, "k_scale");  // fp32 caches take no scales
  try {
    rt.prepare_paged(example_patterns().at(1).second, PagedProblem{2, 1, 32, 32, DType::F32, DType::F16});
    FAIL("not refused");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("kv_dtype") != std::string::npos);
  }
  if (on_host()) {  // a GPU reads the table on the device: a bad page makes its rows NaN instead
    const int32_t bad[4] = {0, 1, 7, 3};
    std::memcpy(t.data(), bad, 16);
    tb.upload(t);
    refused(base(), "block_table[1, 0]");
  }
  // Lengths on the device: given twice, a request count that is not the queries', a workspace
  // smaller than needs(), and plan() for such a call, each refused by name.
  Buf lb(16);
  const int32_t lens[2] = {5, 16};
  std::vector<unsigned char> lbytes(16, 0);
  std::memcpy(lbytes.data(), lens, 8);
  lb.upload(lbytes);
  auto on_device = [&] {
    PagedCall d = base();
    d.kv_lens.clear();
    d.device_kv_lens = static_cast<const int32_t*>(lb.data());
    d.requests = 2;
    return d;
  };
  c = on_device();
  c.kv_lens = {5, 16};
  refused(c, "not both");
  c = on_device();
  c.requests = 3;
  refused(c, "queries for 3 requests");
  if (target() != Target::Cpu) {  // the CPU device reads the lengths and takes its own path
    c = on_device();
    PagedCapacity cap = pa.needs(c);
    CHECK(cap.items == 2 * 1);  // two queries, one class of heads (the two heads of the kv head)
    Buf ws(pa.workspace_bytes(cap));
    try {
      pa.plan(c, ws.data(), cap);
      FAIL("not refused");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find("call run() alone") != std::string::npos);
    }
    PagedCapacity small = cap;
    small.items = 1;
    try {
      pa.run(c, ws.data(), small);
      FAIL("not refused");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find("PagedCapacity.items") != std::string::npos);
    }
  }
  // FP8 inputs are forward only: their output dtype is bf16 or fp16.
  try {
    rt.prepare(example_patterns().at(1).second, Problem{1, 8, 8, 2, 1, 32, 32, DType::E4M3, DType::F32});
    FAIL("not refused");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("bf16 or fp16") != std::string::npos);
  }
  // A pattern with a dynamic layout has no table for a paged cache.
  const Pattern dynamic = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"dynamic": true}}]})");
  try {
    rt.prepare_paged(dynamic, PagedProblem{2, 1, 32, 32, DType::F32, std::nullopt});
    FAIL("not refused");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("dynamic layout") != std::string::npos);
  }
}

// Deliberately broken paged kernels: each must fail the check the unmutated kernel passes (two
// examples, decode and chunked prefill, one split and several, a NaN and an inf in V).
TEST_CASE("paged attention: every deliberately broken SIMT paged kernel fails in the emulator", "[emu][paged][mutation]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the mutations run in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  const Pattern longnet = example_patterns().at(2).second, window = example_patterns().at(4).second;
  std::vector<PagedCase> cases;
  for (const Pattern* p : {&longnet, &window}) {
    for (int32_t splits : {1, 3}) {
      PagedCase c = mixed("mutation", *p, splits == 1 ? DType::F32 : DType::BF16, 16, splits);
      c.config.tile_k = 32;  // the SIMT kernel (fwd_paged.cuh), where tensor cores would take bf16
      if (p == &window && splits == 1) c.head_dim = c.head_dim_v = 36;  // rows of 144 bytes for fp32: 16-byte loads
      if (p == &window && splits == 3) c.head_dim = c.head_dim_v = 36;  // 72 bytes for bf16: one element at a time
      if (p == &longnet && splits == 3) c.fp8 = true;  // FP8 caches (16-byte loads of 16 codes)
      if (p == &window && splits == 3) c.mode = PagedCase::Mode::PlanRun;  // a graph's launch, in the emulator
      if (p == &window && splits == 1) c.bad_page_request = 5;            // a bad page, counted and skipped
      put_non_finite_values(c);
      cases.push_back(c);
    }
  }
  const char* f = "fwd_paged.cuh";
  check_mutations(cases, {
      {"the running sum not rescaled", f, "      l[j] = l[j] * rescale + sum;", "      l[j] = l[j] + sum;"},
      {"a masked key weighted instead of skipped", f, "        if (pc == -1.0f) continue;\n", "\n"},
      {"the mask not asked on partial tiles", f, "          if (!t.full) ok = aj_keys_allowed", "          if (false) ok = aj_keys_allowed"},
      {"queries at their request's row, not its position", f, "  out.pos = q_pos + local;", "  out.pos = local;"},
      {"every row of a packed item taken as its first head's", f, "  out.head = item.head + h;", "  out.head = item.head;"},
      {"the token's slot one past its own", f, "s.slot = (int)(pos % pp.page_size);", "s.slot = (int)((pos + 1) % pp.page_size);"},
      {"the page of the tile's first key for every key", f, "pos / pp.page_size]", "t.first / pp.page_size]"},
      {"no barrier between the slots' lookup and the copies", f,
       "    aj_syncthreads();  // the keys' slots are in place, the previous tile no longer read (and Q in place)\n", "\n"},
      {"every split takes every tile", f, "    if (n % splits != split) continue;\n", "\n"},
      {"a graph's launch: blocks past the step's plan run", f, "  return aj_block_idx_x() < pp.header[0] && aj_block_idx_y() < splits;",
       "  return true;"},
      {"the merge weighs every split alike", f, "        const float w = aj_ex2(v - top);", "        const float w = 1.0f;"},
      {"16-byte loads: each vector stored one vector along", f, "aj_st_f32x4(dst + r * PITCH + d + i,",
       "aj_st_f32x4(dst + r * PITCH + (d + kVec) % D + i,"},
      {"element loads: each element read from its neighbour", f, "      val = row ? aj_kv_load(row + d) * scale : bad;",
       "      val = row ? aj_kv_load(row + (d + 1) % D) * scale : bad;"},
      {"a counted bad page's keys attended, not skipped", f, "        bool ok = c < t.count && !sh.skip[c];", "        bool ok = c < t.count;"},
      {"fp8: the scale not applied", f, "        for (int i = 0; i < kVec; ++i) val[i] = aj_kv_load(e + i) * scale;",
       "        for (int i = 0; i < kVec; ++i) val[i] = aj_kv_load(e + i);"},
      // The e4m3 decode is common.cuh's (the FP8 forward's too).
      {"fp8: the exponent bias one off", "common.cuh", "((e + 120u) << 23)", "((e + 121u) << 23)"},
      {"fp8: subnormals read as zero", "common.cuh", "const float f = (float)m * 0.001953125f;", "const float f = 0.0f;"},
      {"fp8: the scales of the first kv head for every head", f, "pp.k_scale ? pp.k_scale[kvh] : 1.0f", "pp.k_scale ? pp.k_scale[0] : 1.0f"},
      {"no warp barrier before the probabilities are read", f, "      aj_syncwarp();  // the warp's probabilities are in place\n", "\n"},
  });
}

TEST_CASE("paged attention on tensor cores: every deliberately broken kernel fails in the emulator", "[emu][paged][mutation]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the mutations run in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  const Pattern longnet = example_patterns().at(2).second, window = example_patterns().at(4).second;
  std::vector<PagedCase> cases;
  for (const Pattern* p : {&longnet, &window}) {
    for (int n = 0; n < 3; ++n) {
      PagedCase c = mixed("tensor-core mutation", *p, n == 1 ? DType::F16 : DType::BF16, 16, n == 0 ? 1 : 3);
      KernelRequest k;
      k.head_dim = int(c.head_dim), k.head_dim_v = int(c.head_dim_v), k.dtype = c.dtype, k.arch = c.arch;
      REQUIRE(choose_paged_path(k) == KernelPath::Sm80);
      c.fp8 = n == 2;
      if (p == &window && n == 2) c.arch = 90;  // FP8 decoded by cvt (sm_89 and newer); LongNet's in software
      if (p == &window && n == 0) c.bad_page_request = 5;  // a bad page, counted and skipped
      if (p == &longnet && n == 1) c.mode = PagedCase::Mode::DeviceRun;
      put_non_finite_values(c);
      cases.push_back(c);
    }
  }
  const char* f = "fwd_paged_tc.cuh";
  check_mutations(cases, {
      {"the running sum not rescaled", f, "      l[h] = l[h] * rescale[h] + sum[h];", "      l[h] = l[h] + sum[h];"},
      {"the output not rescaled", f, "      acc[j][0] *= rescale[0], acc[j][1] *= rescale[0];", "      acc[j][0] *= 1.0f, acc[j][1] *= rescale[0];"},
      {"the mask not asked on partial tiles", f, "        if (ok && !t.full) ok = aj_keys_allowed", "        if (false) ok = aj_keys_allowed"},
      {"a masked non-finite V multiplied by P = 0", f, "    if (aj_warp_any(bad)) {", "    if (false) {"},
      {"the warps' results merged with equal weights", f, "sh.m[w][r] == AJ_NEG_INF ? 0.0f : aj_ex2(sh.m[w][r] - top);",
       "sh.m[w][r] == AJ_NEG_INF ? 0.0f : 1.0f;"},
      {"fp8: K's scale not applied", f, "p.scale_log2 * (pp.k_scale ? pp.k_scale[kvh] : 1.0f);", "p.scale_log2;"},
      {"fp8: V's scale not applied", f, "const float v_scale = pp.v_scale ? pp.v_scale[kvh] : 1.0f;", "const float v_scale = 1.0f;"},
      {"every warp on the first 16 keys", f, "  const int k0 = warp * AJ_PT_KEYS;", "  const int k0 = 0;"},
      {"P's second register from the wrong columns", f, "    pa[1] = aj_pack2(s[0][2], s[0][3]);", "    pa[1] = aj_pack2(s[0][0], s[0][1]);"},
      {"Q's fragments from the wrong columns", f, "&sh.q[lane % 16][ks * 16 + (lane / 16) * 8]", "&sh.q[lane % 16][ks * 16]"},
      {"no barrier before the next tile overwrites K and V", f, "    aj_syncwarp();  // the warp's keys of the previous tile are no longer read\n", "\n"},
      {"the copies not waited for", f, "  aj_cp_async_commit();\n  aj_cp_async_wait<0>();\n", "  aj_cp_async_commit();\n"},
      {"no barrier between the slots' lookup and the copies", f, "  aj_syncwarp();  // the keys' slots are in place\n", "\n"},
      {"the copies not waited for by the other lanes", f, "  aj_syncwarp();  // every lane's copies are in place\n", "\n"},
      {"each warp's keys looked up at the tile's first", f, "aj_paged_slot(pp, req, t, k0 + lane)", "aj_paged_slot(pp, req, t, lane)"},
      {"fp8: the codes of a pair swapped", f, "lo = (aj_kv_elem)(raw >> (16 * i)), hi = (aj_kv_elem)(raw >> (16 * i + 8));",
       "lo = (aj_kv_elem)(raw >> (16 * i + 8)), hi = (aj_kv_elem)(raw >> (16 * i));"},
      {"the warps' outputs: the second row's pairs over the first's", f, "aj_st_f32x2(&sh.o[warp][g + 8][8 * j + 2 * quad]",
       "aj_st_f32x2(&sh.o[warp][g][8 * j + 2 * quad]"},
      {"P's copy: the first row's pairs into the second", f, "aj_st_f32x2(&sh.p[warp][g][8 * j + 2 * quad]", "aj_st_f32x2(&sh.p[warp][g + 8][8 * j + 2 * quad]"},
      {"fp8 by cvt: the pairs of a chunk in reverse order", f, "aj_cvt_f16x2_e4m3x2((aj_u16)(raw >> (16 * i)))",
       "aj_cvt_f16x2_e4m3x2((aj_u16)(raw >> (16 * (3 - i))))"},
      {"fp8 by cvt, bf16: the halves of a pair swapped", f,
       "aj_cvt_bf16x2(aj_cvt_f32_f16((aj_u16)(w[i] >> 16)), aj_cvt_f32_f16((aj_u16)w[i]))",
       "aj_cvt_bf16x2(aj_cvt_f32_f16((aj_u16)w[i]), aj_cvt_f32_f16((aj_u16)(w[i] >> 16)))"},
      {"a counted bad page's keys attended", f, "c < t.count && !sh.skip[c];", "c < t.count;"},
  });
}


}  // namespace attnjit::gputest
