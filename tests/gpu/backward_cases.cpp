// The GPU backward suites' harness (backward_cases.hpp).
#include "tests/gpu/backward_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <tuple>

#include "compiler/support/half.hpp"
#include "tests/gpu/test_target.hpp"
#include "tests/unit/random_patterns.hpp"

namespace attnjit::gradtest {

namespace {

std::vector<uint8_t> float_bytes(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() * 4);
  if (!x.empty()) std::memcpy(out.data(), x.data(), out.size());
  return out;
}
std::vector<float> bytes_float(const std::vector<uint8_t>& b) {
  std::vector<float> out(b.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), b.data(), out.size() * 4);
  return out;
}

}  // namespace

bool on_gpu() { return gputest::target() == gputest::Target::Gpu; }

std::vector<uint8_t> encode(const std::vector<float>& x, DType dt) {
  std::vector<uint8_t> out(x.size() * size_t(dtype_bytes(dt)));
  for (size_t n = 0; n < x.size(); ++n) {
    if (dt == DType::F32) std::memcpy(&out[4 * n], &x[n], 4);
    else {
      const uint16_t h = dt == DType::F16 ? float_to_half(x[n]) : float_to_bfloat16(x[n]);
      std::memcpy(&out[2 * n], &h, 2);
    }
  }
  return out;
}
std::vector<float> decode(const std::vector<uint8_t>& b, DType dt) {
  std::vector<float> out(b.size() / size_t(dtype_bytes(dt)));
  for (size_t n = 0; n < out.size(); ++n) {
    if (dt == DType::F32) std::memcpy(&out[n], &b[4 * n], 4);
    else {
      uint16_t h;
      std::memcpy(&h, &b[2 * n], 2);
      out[n] = dt == DType::F16 ? half_to_float(h) : bfloat16_to_float(h);
    }
  }
  return out;
}
std::vector<float> rounded(std::vector<float> x, DType dt) { return decode(encode(x, dt), dt); }

std::string check_backward(Runtime& rt, const Pattern& p, const Shape& s, DType dt, const DynamicLayout* dyn, uint64_t seed,
                           bool deterministic, std::vector<uint8_t>* bytes, bool caller_workspace, bool device_table,
                           bool in_graph, const std::vector<Poke>& pokes, bool with_dlse, bool add) {
  const size_t nq = size_t(s.batch * s.seq_q * s.heads_q * s.head_dim), nk = size_t(s.batch * s.seq_k * s.heads_kv * s.head_dim),
               nv = size_t(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), no = size_t(s.batch * s.seq_q * s.heads_q * s.head_dim_v);
  std::vector<float> q = rounded(testing::random_tensor(nq, seed), dt), k = rounded(testing::random_tensor(nk, seed + 1), dt),
                     v = rounded(testing::random_tensor(nv, seed + 2), dt), dout = rounded(testing::random_tensor(no, seed + 3), dt);
  for (const Poke& x : pokes) (x.tensor == 'q' ? q : x.tensor == 'k' ? k : x.tensor == 'v' ? v : dout).at(x.at) = x.value;
  // With `with_dlse`, a loss that uses the lse output too: its gradient, random, and NaN at the rows
  // that attend nothing (lse -inf), which must take none of it.
  std::vector<float> dlse;
  if (with_dlse) {
    dlse = testing::random_tensor(size_t(s.batch * s.heads_q * s.seq_q), seed + 4);
    const ReferenceOutput fwd = reference_attention(p, s, q.data(), k.data(), v.data(), dyn, 0);
    for (size_t i = 0; i < dlse.size(); ++i)
      dlse[i] = std::isinf(fwd.lse[i]) ? std::numeric_limits<float>::quiet_NaN() : 2.0f * dlse[i];
  }
  const ReferenceGradients want = reference_attention_backward(p, s, q.data(), k.data(), v.data(), dout.data(), dyn, 0, nullptr,
                                                               with_dlse ? dlse.data() : nullptr);
  Attention op = rt.prepare(p, Problem{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, dt, {}});
  auto make = [&](const std::vector<float>* x, size_t n) {
    auto m = std::make_unique<Mem>(n * size_t(dtype_bytes(dt)));
    if (x) m->upload(encode(*x, dt));
    return m;
  };
  auto mq = make(&q, nq), mk = make(&k, nk), mv = make(&v, nv), mdo = make(&dout, no), mo = make(nullptr, no);
  auto mdq = make(nullptr, nq), mdk = make(nullptr, nk), mdv = make(nullptr, nv);
  Mem mlse(size_t(s.batch * s.heads_q * s.seq_q) * 4);
  auto view = [&](Mem& m, DType t, std::vector<int64_t> shape) { return TensorView::contiguous(m.data(), t, std::move(shape)); };
  const std::vector<int64_t> qs{s.batch, s.seq_q, s.heads_q, s.head_dim}, ks{s.batch, s.seq_k, s.heads_kv, s.head_dim},
      vs{s.batch, s.seq_k, s.heads_kv, s.head_dim_v}, os{s.batch, s.seq_q, s.heads_q, s.head_dim_v};
  const TensorView lse = view(mlse, DType::F32, {s.batch, s.heads_q, s.seq_q});
  ForwardOptions fo;
  fo.q_offset = s.q_offset, fo.k_offset = s.k_offset, fo.dynamic_layout = dyn, fo.deterministic = deterministic;
  Mem mdlse(dlse.size() * 4 + 4);
  TensorView dlse_view;
  if (with_dlse) {
    std::vector<uint8_t> raw(dlse.size() * 4);
    std::memcpy(raw.data(), dlse.data(), raw.size());
    raw.resize(dlse.size() * 4 + 4);
    mdlse.upload(raw);
    dlse_view = view(mdlse, DType::F32, {s.batch, s.heads_q, s.seq_q});
    fo.dlse = &dlse_view;
  }
  // The table where the device reads it (DeviceDynamicLayout): the same gradients.
  std::unique_ptr<Mem> table_rows, table_cols;
  DeviceDynamicLayout on_device;
  if (device_table && dyn) {
    auto bytes_of = [](const auto& v) {
      std::vector<uint8_t> out(v.size() * sizeof(v[0]));
      if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
      return out;
    };
    table_rows = std::make_unique<Mem>(dyn->row_offsets.size() * 8);
    table_cols = std::make_unique<Mem>(std::max<size_t>(dyn->col_indices.size(), 1) * 4);
    table_rows->upload(bytes_of(dyn->row_offsets));
    table_cols->upload(bytes_of(dyn->col_indices));
    on_device.row_offsets = static_cast<const int64_t*>(table_rows->data());
    on_device.col_indices = static_cast<const int32_t*>(table_cols->data());
    on_device.rows = static_cast<int64_t>(dyn->row_offsets.size()) - 1;
    on_device.entries = static_cast<int64_t>(dyn->col_indices.size());
    on_device.heads = dyn->heads;
    fo.dynamic_layout = nullptr;
    fo.device_dynamic_layout = &on_device;
  }
  std::unique_ptr<Mem> workspace;
  if (caller_workspace && op.backward_workspace_bytes() > 0) {
    workspace = std::make_unique<Mem>(op.backward_workspace_bytes());
  }
  // backward_add: accumulators that start random, and D from the forward's O.
  const std::vector<float> init[3] = {testing::random_tensor(nq, seed + 5), testing::random_tensor(nk, seed + 6),
                                      testing::random_tensor(nv, seed + 7)};
  Mem mdelta(size_t(s.batch * s.heads_q * s.seq_q) * 4), macc[3] = {Mem(nq * 4), Mem(nk * 4), Mem(nv * 4)};
  auto run_add = [&] {
    for (int x = 0; x < 3; ++x) macc[x].upload(float_bytes(init[x]));
    const std::vector<float> o = decode(mo->download(), dt), l = bytes_float(mlse.download());
    std::vector<float> delta(size_t(s.batch * s.heads_q * s.seq_q));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t i = 0; i < s.seq_q; ++i) {
          float sum = 0.0f;
          const size_t row = size_t(((b * s.seq_q + i) * s.heads_q + h) * s.head_dim_v);
          for (int64_t c = 0; c < s.head_dim_v; ++c) sum += dout[row + size_t(c)] * o[row + size_t(c)];
          const size_t at = size_t((b * s.heads_q + h) * s.seq_q + i);
          delta[at] = with_dlse && l[at] != -std::numeric_limits<float>::infinity() ? sum - dlse[at] : sum;
        }
    mdelta.upload(float_bytes(delta));
    ForwardOptions ao = fo;
    ao.dlse = nullptr;
    op.backward_add(view(*mq, dt, qs), view(*mk, dt, ks), view(*mv, dt, vs), lse, view(*mdo, dt, os),
                    view(mdelta, DType::F32, {s.batch, s.heads_q, s.seq_q}), view(macc[0], DType::F32, qs),
                    view(macc[1], DType::F32, ks), view(macc[2], DType::F32, vs), ao);
  };
  auto run = [&] {
    op.forward(view(*mq, dt, qs), view(*mk, dt, ks), view(*mv, dt, vs), view(*mo, dt, os), &lse, fo);
    if (add) return run_add();
    if (workspace) fo.workspace = workspace->data(), fo.workspace_bytes = op.backward_workspace_bytes();
    op.backward(view(*mq, dt, qs), view(*mk, dt, ks), view(*mv, dt, vs), view(*mo, dt, os), lse, view(*mdo, dt, os),
                view(*mdq, dt, qs), view(*mdk, dt, ks), view(*mdv, dt, vs), fo);
  };
  if (in_graph) {
    CUstream stream = create_stream();
    fo.stream = stream;
    {
      CapturedGraph graph(stream, run);
      for (int replay = 0; replay < 2; ++replay) graph.launch(stream);
      synchronize(stream, "after the graph");
    }
    destroy_stream(stream);
  } else {
    run();
  }
  if (on_gpu()) synchronize(nullptr, "after backward");
  const double tol = dt == DType::F32 ? 1e-5 : 3e-2;
  int n = 0;
  for (const auto& [name, m, w] : {std::tuple<const char*, Mem*, const std::vector<double>*>{"dq", mdq.get(), &want.dq},
                                   {"dk", mdk.get(), &want.dk}, {"dv", mdv.get(), &want.dv}}) {
    const std::vector<uint8_t> raw = add ? macc[n].download() : m->download();
    if (bytes) bytes->insert(bytes->end(), raw.begin(), raw.end());
    std::vector<float> got = add ? bytes_float(raw) : decode(raw, dt);
    if (add)  // what the accumulator gained (exact up to its rounding: init is about 1)
      for (size_t i = 0; i < got.size(); ++i) got[i] -= init[n][i];
    ++n;
    double d2 = 0, w2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!std::isfinite((*w)[i])) {  // a non-finite input the reference carries here: the same NaN or inf
        if (std::isnan((*w)[i]) ? std::isnan(got[i]) : got[i] == (*w)[i]) continue;
        return std::string(name) + " at element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", the reference's " +
               std::to_string((*w)[i]);
      }
      if (std::isnan(got[i])) return std::string(name) + " is NaN at element " + std::to_string(i) + " (unwritten?)";
      d2 += (got[i] - (*w)[i]) * (got[i] - (*w)[i]);
      w2 += (*w)[i] * (*w)[i];
    }
    const double rel = w2 > 0 ? std::sqrt(d2 / w2) : std::sqrt(d2);
    if (!(rel <= tol)) return std::string(name) + ": relative Frobenius error " + std::to_string(rel) + " > " + std::to_string(tol);
  }
  return "";
}

Device device_under_test() {
  switch (gputest::target()) {
    case gputest::Target::Gpu: return Device::cuda(0);
    case gputest::Target::Emu: return Device::emu(80);
    case gputest::Target::Cpu: break;
  }
  return Device::cpu();
}

std::vector<std::pair<std::string, Pattern>> example_patterns() {
  std::vector<std::pair<std::string, Pattern>> out;
  for (const auto& e : std::filesystem::directory_iterator(ATTNJIT_EXAMPLES_DIR)) {
    if (e.path().extension() != ".json" || e.path().stem() == "manifest") continue;
    out.emplace_back(e.path().filename().string(), load_spec_file(e.path().string()));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace attnjit::gradtest
