// Packed documents (cu_seqlens): a packed call equals each document run as a call of its own, on
// the reference, the plan executor and the emulator, forward and backward; the plan never visits a
// tile across two documents; every malformed list is a clear error.
#include <catch2/catch.hpp>
#include <cmath>

#include "attnjit/attnjit.hpp"
#include "compiler/support/error.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/pattern/pattern_stats.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "attnjit/reference.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;
using attnjit::testing::random_tensor;

namespace {

// A random pattern without a dynamic layout on one packed sequence, and its cu_seqlens (empty
// documents included now and then).
struct DocCase {
  Pattern pattern;
  Shape shape;
  std::vector<int64_t> cu;
};

DocCase next_doc_case(CaseGenerator& gen) {
  for (;;) {
    testing::RandomCase c = gen.next();
    if (c.dynamic) continue;
    Shape s = c.shape;
    s.batch = 1;
    s.seq_k = s.seq_q;
    s.q_offset = s.k_offset = 0;
    std::vector<int64_t> cu{0};
    while (cu.back() < s.seq_q) cu.push_back(std::min(s.seq_q, cu.back() + (gen.coin(0.15) ? 0 : gen.uniform(1, 40))));
    return DocCase{c.pattern, s, cu};
  }
}

// Rows [from, from + n) of a [1, S, H, D] tensor.
template <class T>
std::vector<T> rows_of(const std::vector<T>& x, int64_t from, int64_t n, int64_t width) {
  return std::vector<T>(x.begin() + from * width, x.begin() + (from + n) * width);
}

int64_t document_of(const std::vector<int64_t>& cu, int64_t row) {
  return std::upper_bound(cu.begin(), cu.end(), row) - cu.begin() - 1;
}

}  // namespace

TEST_CASE("documents: the packed reference equals each document run alone, forward and backward", "[documents][property]") {
  CaseGenerator gen(9191);
  for (int n = 0; n < 120; ++n) {
    const DocCase c = next_doc_case(gen);
    const Shape& s = c.shape;
    INFO("case " << n << "\n" << canonical_text(c.pattern) << "cu_seqlens size " << c.cu.size());
    const int64_t wq = s.heads_q * s.head_dim, wk = s.heads_kv * s.head_dim, wv = s.heads_kv * s.head_dim_v,
                  wo = s.heads_q * s.head_dim_v;
    const auto q = random_tensor(size_t(s.seq_q * wq), 3 * n), k = random_tensor(size_t(s.seq_k * wk), 3 * n + 1),
               v = random_tensor(size_t(s.seq_k * wv), 3 * n + 2), dout = random_tensor(size_t(s.seq_q * wo), 3 * n + 7);
    const ReferenceOutput packed = reference_attention(c.pattern, s, q.data(), k.data(), v.data(), nullptr, 1, &c.cu);
    const ReferenceGradients gpacked =
        reference_attention_backward(c.pattern, s, q.data(), k.data(), v.data(), dout.data(), nullptr, 1, &c.cu);
    for (size_t d = 0; d + 1 < c.cu.size(); ++d) {
      const int64_t from = c.cu[d], len = c.cu[d + 1] - c.cu[d];
      if (len == 0) continue;
      Shape ds = s;
      ds.seq_q = ds.seq_k = len;
      const auto dq = rows_of(q, from, len, wq), dk = rows_of(k, from, len, wk), dv = rows_of(v, from, len, wv),
                 ddo = rows_of(dout, from, len, wo);
      const ReferenceOutput alone = reference_attention(c.pattern, ds, dq.data(), dk.data(), dv.data(), nullptr, 1);
      const ReferenceGradients galone =
          reference_attention_backward(c.pattern, ds, dq.data(), dk.data(), dv.data(), ddo.data(), nullptr, 1);
      INFO("document " << d << " rows " << from << ".." << from + len);
      for (int64_t i = 0; i < len * wo; ++i) REQUIRE(packed.o[size_t(from * wo + i)] == alone.o[size_t(i)]);
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t i = 0; i < len; ++i) REQUIRE(packed.lse[size_t(h * s.seq_q + from + i)] == alone.lse[size_t(h * len + i)]);
      for (int64_t i = 0; i < len * wq; ++i) REQUIRE(gpacked.dq[size_t(from * wq + i)] == Approx(galone.dq[size_t(i)]).margin(1e-12));
      for (int64_t i = 0; i < len * wk; ++i) REQUIRE(gpacked.dk[size_t(from * wk + i)] == Approx(galone.dk[size_t(i)]).margin(1e-12));
      for (int64_t i = 0; i < len * wv; ++i) REQUIRE(gpacked.dv[size_t(from * wv + i)] == Approx(galone.dv[size_t(i)]).margin(1e-12));
    }
  }
}

TEST_CASE("documents: the plan never visits a tile across documents, runs as the packed reference, and validate counts each document alone", "[documents][plan][property]") {
  CaseGenerator gen(9292);
  for (int n = 0; n < 150; ++n) {
    const DocCase c = next_doc_case(gen);
    const Shape& s = c.shape;
    const TileConfig tiles{int32_t(8 << (n % 3)), int32_t(8 << (n % 2))};
    // Every other case packed (a pair several branches attend computed once, weighted): each
    // document's weights keep their runs at even offsets (the kernels read two at a time).
    const BranchPacking packing = n % 4 < 2 ? BranchPacking::Packed : BranchPacking::Separate;
    INFO("case " << n << " tiles " << tiles.tile_q << "x" << tiles.tile_k << (n % 4 < 2 ? " packed" : "") << "\n"
                 << canonical_text(c.pattern));
    const Plan plan = lower_to_plan(c.pattern, s, tiles, nullptr, &c.cu, RandomLayouts::InPlan, packing);
    for (const KeySpan& span : plan.spans)
      if (span.weighted()) REQUIRE(span.weight_begin % 2 == 0);
    REQUIRE(plan.documents == c.cu);
    REQUIRE(plan.doc_base.size() == size_t(s.seq_q));
    for (int64_t r = 0; r < s.seq_q; ++r) REQUIRE(plan.doc_base[size_t(r)] == c.cu[size_t(document_of(c.cu, r))]);
    for (const WorkItem& item : plan.items) {
      if (item.rows.count == 0) continue;
      const int64_t doc = document_of(c.cu, item.rows.at(0));
      for (int64_t r = 0; r < item.rows.count; ++r) REQUIRE(document_of(c.cu, item.rows.at(r)) == doc);
      for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
        const KeySpan& span = plan.spans[size_t(sp)];
        for_each_visited_tile(plan, span, [&](int32_t t, bool) {
          const RowMap keys = tile_keys(span, t, tiles.tile_k);
          for (int64_t j = 0; j < keys.count; ++j) REQUIRE(document_of(c.cu, keys.at(j)) == doc);
        });
      }
    }
    // The plan executor on it equals the packed reference.
    const auto q = random_tensor(size_t(s.seq_q * s.heads_q * s.head_dim), n),
               k = random_tensor(size_t(s.seq_k * s.heads_kv * s.head_dim), n + 1),
               v = random_tensor(size_t(s.seq_k * s.heads_kv * s.head_dim_v), n + 2);
    const ReferenceOutput want = reference_attention(c.pattern, s, q.data(), k.data(), v.data(), nullptr, 1, &c.cu);
    const ExecutorOutput got = execute_plan(plan, c.pattern, q.data(), k.data(), v.data(), nullptr, {.threads = 1});
    for (size_t i = 0; i < want.o.size(); ++i) REQUIRE(got.o[i] == Approx(want.o[i]).margin(1e-5));
    for (size_t i = 0; i < want.lse.size(); ++i) {
      if (std::isinf(want.lse[i])) REQUIRE(std::isinf(got.lse[i]));
      else REQUIRE(got.lse[i] == Approx(want.lse[i]).margin(1e-5));
    }
    // validate's statistics with documents: the sum over the documents alone.
    PatternStats alone;
    for (size_t d = 0; d + 1 < c.cu.size(); ++d) {
      Shape ds = s;
      ds.seq_q = ds.seq_k = c.cu[d + 1] - c.cu[d];
      if (ds.seq_q == 0) continue;
      const PatternStats one = pattern_stats(MaskContext{c.pattern, ds});
      alone.attended_pairs += one.attended_pairs, alone.distinct_pairs += one.distinct_pairs, alone.empty_rows += one.empty_rows;
    }
    const PatternStats st = pattern_stats(MaskContext{c.pattern, s, nullptr, &c.cu});
    REQUIRE(st.attended_pairs == alone.attended_pairs);
    REQUIRE(st.distinct_pairs == alone.distinct_pairs);
    REQUIRE(st.empty_rows == alone.empty_rows);
  }
}

namespace {

// The runtime on `device` with ForwardOptions::cu_seqlens against the packed reference, forward
// and backward, fp32.
void check_runtime_documents(const Device& device, int cases, uint64_t seed) {
  CaseGenerator gen(seed);
  RuntimeOptions ro;
  ro.device = device;
  Runtime rt(ro);
  for (int n = 0; n < cases; ++n) {
    DocCase c = next_doc_case(gen);
    Shape& s = c.shape;
    if (device.kind == DeviceKind::EMU) s.head_dim = s.head_dim_v = 16;
    INFO("case " << n << "\n" << canonical_text(c.pattern));
    const auto q = random_tensor(size_t(s.seq_q * s.heads_q * s.head_dim), 5 * n),
               k = random_tensor(size_t(s.seq_k * s.heads_kv * s.head_dim), 5 * n + 1),
               v = random_tensor(size_t(s.seq_k * s.heads_kv * s.head_dim_v), 5 * n + 2),
               dout = random_tensor(size_t(s.seq_q * s.heads_q * s.head_dim_v), 5 * n + 3);
    const ReferenceOutput want = reference_attention(c.pattern, s, q.data(), k.data(), v.data(), nullptr, 1, &c.cu);
    const ReferenceGradients gwant =
        reference_attention_backward(c.pattern, s, q.data(), k.data(), v.data(), dout.data(), nullptr, 1, &c.cu);
    std::vector<float> o(size_t(s.seq_q * s.heads_q * s.head_dim_v)), lse(size_t(s.heads_q * s.seq_q)), dq(q.size()),
        dk(k.size()), dv(v.size());
    auto view = [&](const std::vector<float>& x, int64_t seq, int64_t heads, int64_t d) {
      return TensorView::contiguous(const_cast<float*>(x.data()), DType::F32, {1, seq, heads, d});
    };
    const TensorView lv = TensorView::contiguous(lse.data(), DType::F32, {1, s.heads_q, s.seq_q});
    Attention op = rt.prepare(c.pattern, Problem{1, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, DType::F32, {}});
    ForwardOptions fo;
    fo.cu_seqlens = &c.cu;
    const TensorView tq = view(q, s.seq_q, s.heads_q, s.head_dim), tk = view(k, s.seq_k, s.heads_kv, s.head_dim),
                     tv = view(v, s.seq_k, s.heads_kv, s.head_dim_v), to = view(o, s.seq_q, s.heads_q, s.head_dim_v);
    op.forward(tq, tk, tv, to, &lv, fo);
    for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == Approx(want.o[i]).margin(2e-5));
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(want.lse[i])) REQUIRE(std::isinf(lse[i]));
      else REQUIRE(lse[i] == Approx(want.lse[i]).margin(2e-5));
    }
    op.backward(tq, tk, tv, to, lv, view(dout, s.seq_q, s.heads_q, s.head_dim_v), view(dq, s.seq_q, s.heads_q, s.head_dim),
                view(dk, s.seq_k, s.heads_kv, s.head_dim), view(dv, s.seq_k, s.heads_kv, s.head_dim_v), fo);
    for (size_t i = 0; i < dq.size(); ++i) REQUIRE(dq[i] == Approx(gwant.dq[i]).margin(1e-4));
    for (size_t i = 0; i < dk.size(); ++i) REQUIRE(dk[i] == Approx(gwant.dk[i]).margin(1e-4));
    for (size_t i = 0; i < dv.size(); ++i) REQUIRE(dv[i] == Approx(gwant.dv[i]).margin(1e-4));
  }
}

}  // namespace

TEST_CASE("documents: the CPU device with cu_seqlens equals the packed reference, forward and backward", "[documents][runtime][property]") {
  check_runtime_documents(Device::cpu(), 60, 9393);
}

TEST_CASE("documents: the emulated kernels with cu_seqlens equal the packed reference, forward and backward", "[documents][emu][property]") {
  check_runtime_documents(Device::emu(80), 12, 9494);
}

TEST_CASE("documents: every malformed cu_seqlens is a clear error", "[documents][errors]") {
  const Pattern p = PatternBuilder().branch(BranchSpec().full().causal()).build();
  Shape s;
  s.seq_q = s.seq_k = 10;
  auto error_of = [&](const std::vector<int64_t>& cu, const Shape& shape, bool dyn = false) {
    try {
      check_documents(p, shape, cu, dyn, "cu_seqlens");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of({10}, s), Catch::Contains("at least two entries"));
  CHECK_THAT(error_of({1, 10}, s), Catch::Contains("must start at 0"));
  CHECK_THAT(error_of({0, 6, 4, 10}, s), Catch::Contains("must not decrease: entry 2 is 4 after 6"));
  CHECK_THAT(error_of({0, 4, 12}, s), Catch::Contains("must end at the sequence length 10, got 12"));
  Shape batch2 = s;
  batch2.batch = 2;
  CHECK_THAT(error_of({0, 10}, batch2), Catch::Contains("batch must be 1"));
  Shape cross = s;
  cross.seq_k = 12;
  CHECK_THAT(error_of({0, 10}, cross), Catch::Contains("seq_q == seq_k"));
  Shape offset = s;
  offset.q_offset = 3;
  CHECK_THAT(error_of({0, 10}, offset), Catch::Contains("cannot be combined with offsets"));
  CHECK_THAT(error_of({0, 10}, s, true), Catch::Contains("dynamic layout"));
  CHECK(error_of({0, 0, 4, 4, 10, 10}, s) == "no error");
  CHECK_THAT(error_of({0, 10}, s), Catch::Equals("no error"));

  CHECK(parse_cu_seqlens("0,37,37,101,150", "--cu-seqlens") == std::vector<int64_t>{0, 37, 37, 101, 150});
  for (const char* bad : {"", "0,,3", "0,-3", "0,3,", "a", "0, 3"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_cu_seqlens(bad, "--cu-seqlens"), Catch::Contains("comma-separated list"));
  }
  CHECK_THROWS_WITH(parse_cu_seqlens("", "--cu-seqlens"), Catch::Contains("is empty"));
  // An entry past any sequence length names the entry, its value and the limit.
  CHECK_THROWS_WITH(parse_cu_seqlens("0,9223372036854775807", "--cu-seqlens"),
                    Catch::Contains("entry 1 is 9223372036854775807, past the largest sequence length 2147483647"));
  CHECK_THROWS_WITH(parse_cu_seqlens("0,2147483648", "--cu-seqlens"), Catch::Contains("entry 1 is 2147483648"));
  CHECK(parse_cu_seqlens("0,2147483647", "--cu-seqlens") == std::vector<int64_t>{0, 2147483647});
  CHECK(parse_cu_seqlens("000000000000000000000,7", "--cu-seqlens") == std::vector<int64_t>{0, 7});

  // The runtime checks them before anything runs.
  Runtime rt;
  Attention op = rt.prepare(p, Problem{1, 10, 10, 1, 1, 4, 4, DType::F32, {}});
  std::vector<float> x(40), o(40);
  const TensorView t = TensorView::contiguous(x.data(), DType::F32, {1, 10, 1, 4});
  const TensorView to = TensorView::contiguous(o.data(), DType::F32, {1, 10, 1, 4});
  const std::vector<int64_t> wrong{0, 4, 9};
  ForwardOptions fo;
  fo.cu_seqlens = &wrong;
  CHECK_THROWS_WITH(op.forward(t, t, t, to, nullptr, fo), Catch::Contains("must end at the sequence length 10"));
  const std::vector<int64_t> right{0, 4, 10};
  fo.cu_seqlens = &right;
  fo.q_offset = 2;
  CHECK_THROWS_WITH(op.forward(t, t, t, to, nullptr, fo), Catch::Contains("cannot be combined with offsets"));
  // Also after a plan for these documents exists, with offsets its period cannot tell from 0.
  fo.q_offset = 0;
  CHECK_NOTHROW(op.forward(t, t, t, to, nullptr, fo));
  const std::optional<int64_t> period = translation_period(p);
  REQUIRE(period);
  fo.q_offset = fo.k_offset = *period;
  CHECK_THROWS_WITH(op.forward(t, t, t, to, nullptr, fo), Catch::Contains("cannot be combined with offsets"));
}
