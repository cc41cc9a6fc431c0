// The paged forward's test harness (tests/gpu/paged_cases.hpp).
#include "tests/gpu/paged_cases.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "attnjit/reference.hpp"
#include "compiler/support/half.hpp"
#include "tests/unit/template_mutation.hpp"

namespace attnjit::gputest {

Device device_for(int arch) {
  switch (target()) {
    case Target::Gpu: return Device::cuda(0);
    case Target::Emu: return Device::emu(arch);
    case Target::Cpu: return Device::cpu();
  }
  return Device::cpu();
}

namespace {

// Values as stored (rounded to the dtype) and their bytes.
float rounded(float x, DType dt) {
  if (dt == DType::E4M3) return e4m3_to_float(float_to_e4m3(x));
  return dt == DType::F16 ? half_to_float(float_to_half(x)) : dt == DType::BF16 ? bfloat16_to_float(float_to_bfloat16(x)) : x;
}
std::vector<unsigned char> bytes_of(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> b(v.size() * dtype_bytes(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::E4M3) {
      b[i] = float_to_e4m3(v[i]);
    } else if (dt == DType::F32) {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dt == DType::F16 ? float_to_half(v[i]) : float_to_bfloat16(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}
float value_at(const std::vector<unsigned char>& b, size_t i, DType dt) {
  if (dt == DType::F32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return dt == DType::F16 ? half_to_float(h) : bfloat16_to_float(h);
}


}  // namespace

PagedResult run_paged(const PagedCase& c) {
  const size_t batch = c.kv_lens.size();
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Pages: each request's, then three spare, all in a shuffled order.
  int64_t pages = 3, max_pages = 1;
  for (int64_t L : c.kv_lens) {
    pages += (L + c.page_size - 1) / c.page_size;
    max_pages = std::max(max_pages, (L + c.page_size - 1) / c.page_size);
  }
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(batch * size_t(max_pages), -1);
  const int64_t hkv = c.heads_kv, d = c.head_dim, dv = c.head_dim_v;
  // FP8 caches: values of e4m3 (about +-2), each kv head's K and V times a scale of its own.
  const DType kvdt = c.fp8 ? DType::E4M3 : c.dtype;
  const float spread = c.fp8 ? 2.0f : 1.0f;
  std::vector<float> k_scale(size_t(hkv), 1.0f), v_scale(size_t(hkv), 1.0f);
  if (c.fp8) {
    std::uniform_real_distribution<float> scales(0.25f, 2.0f);
    for (int64_t h = 0; h < hkv; ++h) k_scale[h] = scales(rng), v_scale[h] = scales(rng);
  }
  std::vector<float> kc(size_t(pages * c.page_size * hkv * d), nan), vc(size_t(pages * c.page_size * hkv * dv), nan);
  // Each request's tokens contiguous [L, Hkv, D] for the reference.
  std::vector<std::vector<float>> ks(batch), vs(batch), qs(batch);
  size_t next = 0;
  int64_t total_q = 0;
  for (size_t b = 0; b < batch; ++b) {
    const int64_t L = c.kv_lens[b];
    ks[b].resize(size_t(L * hkv * d));
    vs[b].resize(size_t(L * hkv * dv));
    for (int64_t j = 0; j * c.page_size < L; ++j) table[b * max_pages + j] = order[next++];
    for (int64_t pos = 0; pos < L; ++pos) {
      const int64_t slot = table[b * max_pages + pos / c.page_size] * c.page_size + pos % c.page_size;
      for (int64_t h = 0; h < hkv; ++h) {
        for (int64_t x = 0; x < d; ++x) {
          kc[(slot * hkv + h) * d + x] = rounded(spread * uni(rng), kvdt);
          ks[b][(pos * hkv + h) * d + x] = kc[(slot * hkv + h) * d + x] * k_scale[h];
        }
        for (int64_t x = 0; x < dv; ++x) {
          vc[(slot * hkv + h) * dv + x] = rounded(spread * uni(rng), kvdt);
          vs[b][(pos * hkv + h) * dv + x] = vc[(slot * hkv + h) * dv + x] * v_scale[h];
        }
      }
    }
    for (const auto& [rb, pos, h, x, val] : c.v_values) {
      if (size_t(rb) != b) continue;
      const int64_t slot = table[b * max_pages + pos / c.page_size] * c.page_size + pos % c.page_size;
      vc[(slot * hkv + h) * dv + x] = val;
      vs[b][(pos * hkv + h) * dv + x] = val * v_scale[h];
    }
    qs[b].resize(size_t(c.queries[b] * c.heads_q * d));
    for (float& x : qs[b]) x = rounded(uni(rng), c.dtype);
    total_q += c.queries[b];
  }
  std::vector<float> q;
  std::vector<int64_t> cu{0};
  for (size_t b = 0; b < batch; ++b) {
    q.insert(q.end(), qs[b].begin(), qs[b].end());
    cu.push_back(cu.back() + c.queries[b]);
  }

  const size_t eb = size_t(dtype_bytes(c.dtype)), kvb = size_t(dtype_bytes(kvdt));
  Buf qb(std::max<size_t>(q.size() * eb, 16)), kb(kc.size() * kvb), vb(vc.size() * kvb), tb(table.size() * 4);
  Buf ksb(size_t(hkv) * 4), vsb(size_t(hkv) * 4);
  auto float_bytes = [](const std::vector<float>& f) {
    std::vector<unsigned char> b(f.size() * 4);
    std::memcpy(b.data(), f.data(), b.size());
    return b;
  };
  ksb.upload(float_bytes(k_scale));
  vsb.upload(float_bytes(v_scale));
  Buf ob(std::max<size_t>(size_t(total_q * c.heads_q * dv) * eb, 16)), lb(std::max<size_t>(size_t(total_q * c.heads_q) * 4, 16));
  qb.upload(bytes_of(q, c.dtype));
  kb.upload(bytes_of(kc, kvdt));
  vb.upload(bytes_of(vc, kvdt));
  if (c.bad_page_request >= 0) table[size_t(c.bad_page_request) * max_pages] = int32_t(pages + 5);
  std::vector<unsigned char> tbytes(table.size() * 4);
  std::memcpy(tbytes.data(), table.data(), tbytes.size());
  Buf eb4(4);
  eb4.upload(std::vector<unsigned char>(4, 0));
  tb.upload(tbytes);
  ob.poison(nullptr);
  lb.poison(nullptr);
  // The graph modes work on a non-blocking stream, which the legacy stream's memsets do not order.
  if (target() == Target::Gpu) synchronize(nullptr, "the poisoned outputs");

  RuntimeOptions options = options_for(device_for(c.arch));
  options.config = c.config;
  options.templates = c.templates;
  Runtime rt(options);
  PagedProblem pb{c.heads_q, c.heads_kv, d, dv, c.dtype, std::nullopt};
  if (c.fp8) pb.kv_dtype = DType::E4M3;
  PagedAttention pa = rt.prepare_paged(c.pattern, pb);
  PagedCall call;
  call.q = TensorView::contiguous(qb.data(), c.dtype, {total_q, c.heads_q, d});
  call.k_cache = TensorView::contiguous(kb.data(), kvdt, {pages, c.page_size, hkv, d});
  call.v_cache = TensorView::contiguous(vb.data(), kvdt, {pages, c.page_size, hkv, dv});
  if (c.fp8) {
    call.k_scale = static_cast<const float*>(ksb.data());
    call.v_scale = static_cast<const float*>(vsb.data());
  }
  call.block_table = static_cast<const int32_t*>(tb.data());
  call.block_table_stride = max_pages;
  call.kv_lens = c.kv_lens;
  call.cu_seqlens_q = cu;
  call.o = TensorView::contiguous(ob.data(), c.dtype, {total_q, c.heads_q, dv});
  const TensorView lse = TensorView::contiguous(lb.data(), DType::F32, {total_q, c.heads_q});
  call.lse = &lse;
  call.splits = c.splits;
  if (c.bad_page_request >= 0 || c.bad_length_request >= 0) call.errors = static_cast<int32_t*>(eb4.data());
  const bool on_device = c.mode == PagedCase::Mode::DeviceForward || c.mode == PagedCase::Mode::DeviceRun ||
                         c.mode == PagedCase::Mode::DeviceGraph;
  // Lengths on the device: int32 arrays the kernels read (the step's, or one token shorter).
  Buf lens_buf(std::max<size_t>(batch * 4, 16)), cu_buf((batch + 1) * 4);
  auto put_lengths = [&](bool shorter) {
    std::vector<int32_t> lens(batch), cu32(cu.begin(), cu.end());
    for (size_t b = 0; b < batch; ++b) {
      lens[b] = int32_t(c.kv_lens[b] - (shorter && c.kv_lens[b] > c.queries[b] ? 1 : 0));
      if (int(b) == c.bad_length_request) lens[b] = int32_t(c.bad_length);
    }
    std::vector<unsigned char> lb8(std::max<size_t>(batch * 4, 16), 0), cb8(cu32.size() * 4);
    std::memcpy(lb8.data(), lens.data(), batch * 4);
    std::memcpy(cb8.data(), cu32.data(), cb8.size());
    lens_buf.upload(lb8);
    cu_buf.upload(cb8);
  };
  if (on_device) {
    put_lengths(false);
    call.kv_lens.clear();
    call.cu_seqlens_q.clear();
    call.device_kv_lens = static_cast<const int32_t*>(lens_buf.data());
    // One query per request: the default (no cu_seqlens_q) where the call allows it.
    const bool one_each = std::all_of(c.queries.begin(), c.queries.end(), [](int64_t n) { return n == 1; });
    call.device_cu_seqlens_q = one_each ? nullptr : static_cast<const int32_t*>(cu_buf.data());
    call.requests = int64_t(batch);
  }
  if (c.mode == PagedCase::Mode::Forward || c.mode == PagedCase::Mode::DeviceForward) {
    pa.forward(call);
  } else if (on_device) {
    const PagedCapacity cap = pa.needs(call);
    Buf ws(std::max<size_t>(pa.workspace_bytes(cap), 16));
    ws.poison(nullptr);  // the planner writes what the kernels read
    if (c.mode == PagedCase::Mode::DeviceRun) {
      put_lengths(true);
      pa.run(call, ws.data(), cap);
      put_lengths(false);
      eb4.upload(std::vector<unsigned char>(4, 0));
      pa.run(call, ws.data(), cap);
      if (c.workspace_out) *c.workspace_out = ws.download(), *c.capacity_out = cap;
    } else {
      CUstream stream = create_stream();
      call.stream = stream;
      put_lengths(true);
      CapturedGraph graph(stream, [&] { pa.run(call, ws.data(), cap); });
      graph.launch(stream);
      synchronize(stream);
      put_lengths(false);
      eb4.upload(std::vector<unsigned char>(4, 0));
      graph.launch(stream);
      synchronize(stream);
    }
  } else {
    PagedCall early = call;  // a step one token shorter where its queries allow: other positions, the same buffers
    for (size_t b = 0; b < batch; ++b)
      if (early.kv_lens[b] > c.queries[b]) --early.kv_lens[b];
    PagedCapacity cap = pa.needs(call);
    cap.items += 8, cap.spans += 64, cap.entries += 64, cap.splits = std::max(cap.splits, 8);
    Buf ws(pa.workspace_bytes(cap));
    ws.upload(std::vector<unsigned char>(pa.workspace_bytes(cap), 0));
    if (c.mode == PagedCase::Mode::PlanRun) {
      pa.plan(early, ws.data(), cap);  // its tables are then overwritten by the step's
      pa.plan(call, ws.data(), cap);
      pa.run(call, ws.data(), cap);
    } else {
      CUstream stream = create_stream();
      call.stream = early.stream = stream;
      pa.plan(early, ws.data(), cap);
      CapturedGraph graph(stream, [&] { pa.run(early, ws.data(), cap); });
      graph.launch(stream);
      pa.plan(call, ws.data(), cap);
      graph.launch(stream);
      synchronize(stream);
    }
  }
  if (target() == Target::Gpu) synchronize(nullptr, "paged test");
  const std::vector<unsigned char> o = ob.download(), l = lb.download();

  PagedResult res;
  if (c.bad_page_request >= 0 || c.bad_length_request >= 0) std::memcpy(&res.errors, eb4.download().data(), 4);
  const double tol = c.dtype == DType::F32 ? 2e-5 : c.dtype == DType::F16 ? 2e-3 : 1.6e-2;
  for (size_t b = 0; b < batch; ++b) {
    const int64_t n = c.queries[b], L = c.kv_lens[b];
    if (n == 0) continue;
    if (int(b) == c.bad_length_request) {  // lengths the planner refused: every row NaN
      for (int64_t i = 0; i < n * c.heads_q * dv; ++i) {
        ++res.rows;
        if (!std::isnan(value_at(o, size_t(cu[b] * c.heads_q * dv + i), c.dtype)) && res.mismatches++ < 3)
          res.detail += "request " + std::to_string(b) + " (wrong length) has a number in its output\n";
      }
      for (int64_t i = 0; i < n * c.heads_q; ++i) {
        float got;
        std::memcpy(&got, l.data() + 4 * size_t(cu[b] * c.heads_q + i), 4);
        if (!std::isnan(got) && res.mismatches++ < 3) res.detail += "request " + std::to_string(b) + " (wrong length) has an lse\n";
      }
      continue;
    }
    // The request with a bad first page: its keys there skipped, so the reference over the tokens
    // from the second page on (k_offset keeps the positions).
    const int64_t from = int64_t(b) == c.bad_page_request ? c.page_size : 0;
    const Shape s = make_shape(1, n, L - from, c.heads_q, hkv, d, L - n, from);
    Shape sv = s;
    sv.head_dim_v = dv;
    const ReferenceOutput ref = reference_attention(c.pattern, sv, qs[b].data(), ks[b].data() + from * hkv * d,
                                                    vs[b].data() + from * hkv * dv, nullptr, 1);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < c.heads_q; ++h) {
        ++res.rows;
        bool bad = false;
        for (int64_t x = 0; x < dv; ++x) {
          const double want = ref.o[size_t((i * c.heads_q + h) * dv + x)];
          const double got = value_at(o, size_t(((cu[b] + i) * c.heads_q + h) * dv + x), c.dtype);
          if (std::isnan(want) != std::isnan(got) || (std::isinf(want) && want != got)) bad = true;
          if (std::isfinite(want)) {
            const double err = std::abs(got - want);
            if (!(err <= tol + tol * std::abs(want))) bad = true;
            if (err > res.worst || std::isnan(err)) res.worst = err;
          }
        }
        const double want = ref.lse[size_t(h * n + i)];
        float got;
        std::memcpy(&got, l.data() + 4 * size_t((cu[b] + i) * c.heads_q + h), 4);
        if (std::isnan(want) != std::isnan(got) || (std::isinf(want) && want != got) ||
            (std::isfinite(want) && !(std::abs(got - want) <= 1e-3 + 1e-5 * std::abs(want))))
          bad = true;
        if (bad && res.mismatches++ < 3)
          res.detail += "request " + std::to_string(b) + " (" + std::to_string(L) + " tokens) query " + std::to_string(i) +
                        " head " + std::to_string(h) + " differs (lse " + std::to_string(got) + ", want " +
                        std::to_string(want) + ")\n";
      }
    }
  }
  return res;
}

void check(const PagedCase& c) {
  INFO(c.name);
  const PagedResult r = run_paged(c);
  INFO(r.detail);
  CHECK(r.rows > 0);
  CHECK(r.mismatches == 0);
}

// Decode (one query per request), speculative decoding (4) and chunked prefill (a chunk of 37)
// at lengths around LongNet's segments and the block layouts' blocks, one request with no queries.
PagedCase mixed(std::string name, Pattern p, DType dt, int64_t page_size, int32_t splits) {
  PagedCase c;
  c.name = std::move(name);
  c.pattern = std::move(p);
  c.dtype = dt;
  c.page_size = page_size;
  c.kv_lens = {1, 70, 2100, 4500, 9, 300};
  c.queries = {1, 1, 4, 1, 0, 37};
  c.splits = splits;
  return c;
}

// Decode at lengths around LongNet's segments and the layouts' blocks: one query per request, no
// cu_seqlens_q, GQA 4:1 (the heads of a kv group share items where their offsets agree).
PagedCase decode(std::string name, Pattern p, DType dt, int64_t page_size, int32_t splits) {
  PagedCase c = mixed(std::move(name), std::move(p), dt, page_size, splits);
  c.kv_lens = {1, 64, 65, 2048, 2049, 4500, 300, 17};
  c.queries.assign(c.kv_lens.size(), 1);
  c.heads_q = 8, c.heads_kv = 2;
  return c;
}


namespace {

// Rows that came out wrong over `cases` run with `templates` (a fault counts one; so does a counter
// other than a case's expected_errors), and the rows checked; with `first_failure`, up to the first
// case with a wrong row (a mutant needs one: the cases after it would only compile more kernels).
std::pair<size_t, size_t> failures(std::vector<PagedCase> cases, std::shared_ptr<const TemplateSet> templates,
                                   bool first_failure = false) {
  size_t bad = 0, rows = 0;
  for (PagedCase& c : cases) {
    if (first_failure && bad > 0) break;
    c.templates = templates;
    try {
      const PagedResult r = run_paged(c);
      bad += r.mismatches + (c.expected_errors >= 0 && r.errors != c.expected_errors), rows += r.rows;
    } catch (const std::exception& e) {
      UNSCOPED_INFO("fault: " << e.what());
      ++bad;
    }
  }
  return {bad, rows};
}

}  // namespace

// The cases pass with the embedded templates, and each mutation makes some row of them fail.
void check_mutations(const std::vector<PagedCase>& cases, const std::vector<TemplateMutation>& mutations) {
  const auto clean = failures(cases, nullptr);
  CHECK(clean.first == 0);
  CHECK(clean.second > 0);
  for (const TemplateMutation& m : mutations) {
    INFO("mutation: " << m.name);
    const auto t = testing::mutated_templates(m.file, m.from, m.to);
    REQUIRE(t);  // the template changed: update the mutation
    CHECK(failures(cases, t, true).first > 0);
  }
}

// A NaN in V at a key its request's query attends, and an inf at key 299 of request 5, which only
// its last query attends (a masked non-finite V for the others); FP8 caches keep the NaN alone.
void put_non_finite_values(PagedCase& c) {
  c.v_values = {{3, 4490, 0, 5, std::numeric_limits<float>::quiet_NaN()}, {5, 299, 1, 3, -std::numeric_limits<float>::infinity()}};
  if (c.fp8) c.v_values.resize(1);  // e4m3 has no infinity
}

}  // namespace attnjit::gputest
