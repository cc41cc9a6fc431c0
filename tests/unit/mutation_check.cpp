#include "tests/unit/mutation_check.hpp"

#include <cmath>
#include <limits>

#include "attnjit/reference.hpp"
#include "emulator/emu_api.hpp"
#include "emulator/emu_module.hpp"
#include "runtime/npy.hpp"
#include "tests/unit/random_patterns.hpp"

namespace attnjit::testing {

std::string check_kernel(const std::shared_ptr<const TemplateSet>& templates, DType dt, bool backward, bool deterministic, int64_t d,
                         bool sm90a, bool tma, bool far_below, bool device_table, bool random_in_kernel, bool folded,
                         const KernelConfig& config, bool nonfinite_v, bool extreme, char nonfinite_in, bool causal, bool lazy,
                         bool poly, bool packed, int persistent) {
  const Pattern p = packed ? PatternBuilder()
                                 .branch(BranchSpec().segment(256).dilation(1).causal())
                                 .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod).causal())
                                 .branch(BranchSpec().segment(512).dilation(4).offset(OffsetRule::HeadMod).causal())
                                 .build()
                    : causal ? PatternBuilder().branch(BranchSpec().causal()).build()
                    : folded ? PatternBuilder()
                                 .branch(BranchSpec().segment(128).dilation(1).causal())
                                 .branch(BranchSpec().segment(768).dilation(12).offset(OffsetRule::HeadMod))
                                 .build()
                    : random_in_kernel ? PatternBuilder()
                                           .branch(BranchSpec().causal().layout(layouts::union_of(
                                               {layouts::local(0, 32, 32), layouts::random(0.3, 21, 32, 32)}, 32, 32)))
                                           .branch(BranchSpec().segment(128).dilation(2).layout(layouts::random(0.2, 4, 16, 16)))
                                           .build()
                    : device_table ? PatternBuilder()
                                       .branch(BranchSpec().layout(layouts::dynamic(32, 32)))
                                       .branch(BranchSpec().causal().layout(layouts::union_of(
                                           {layouts::dynamic(32, 32), layouts::local(0, 32, 32),
                                            layouts::explicit_blocks({{2, 0}, {5, 3}, {6, 1}}, 32, 32)})))
                                       .build()
                                 : PatternBuilder()
                                       .branch(BranchSpec().segment(128).dilation(1).causal())
                                       .branch(BranchSpec().segment(256).dilation(2).offset(OffsetRule::HeadMod))
                                       .build();
  Shape s;
  s.seq_q = s.seq_k = folded ? 776 : 203;  // not a multiple of any tile
  s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = d;
  const size_t nq = size_t(s.seq_q * s.heads_q * d), nk = size_t(s.seq_k * s.heads_kv * d);
  auto rounded = [&](std::vector<float> v) {
    if (dt == DType::BF16)
      for (float& x : v) x = bfloat16_to_float(float_to_bfloat16(x));
    return v;
  };
  auto shifted = [&](std::vector<float> x, float sign) {
    if (far_below)
      for (float& y : x) y = sign > 0 ? std::abs(y) + 3.5f : y - 3.5f;
    return x;
  };
  auto scaled = [&](std::vector<float> x) {
    if (extreme)
      for (float& y : x) y *= 1e11f;
    return x;
  };
  std::vector<float> q = rounded(scaled(shifted(testing::random_tensor(nq, 1), 1))),
                     k = rounded(scaled(shifted(testing::random_tensor(nk, 2), -1)));
  // Query row 150 of head 1 (which attends keys 128..150 only) and dO of row 41, head 1 (below);
  // or key 180 (which head 1's rows before 180 and head 0's odd rows before it do not attend).
  // Apart: a NaN key poisons the LSE of most rows, and with it most of dK and dV.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Past head dim 128 the columns lie in the last slice of dK and dV (dQ's too).
  const int64_t col = d > 128 ? 128 : 0;
  if (nonfinite_in == 'q') q[size_t((150 * 2 + 1) * d + col + 5)] = nan;
  if (nonfinite_in == 'k') k[size_t(180 * d + col + 7)] = nan;
  // The exact sums after a non-finite value are for such inputs only: finite ones never take them,
  // and a NaN in V never needs the two-pass dQ's (the dQ kernel selects a masked pair's dS, so only
  // rows that attend the NaN, whose D is NaN and dQ NaN anyway, see one). Rare path 1:
  // AJ_RARE_DQ_ROWS (common.cuh).
  const bool finite = !nonfinite_v && !nonfinite_in;
  const uint64_t rare_before = emu::rare_paths_taken(), dq_rows_before = emu::rare_paths_taken(1);
  auto rare_paths = [&]() -> std::string {
    const uint64_t taken = emu::rare_paths_taken() - rare_before;
    if (finite && taken > 0) return "finite inputs took a rare path (an exact sum) " + std::to_string(taken) + " times";
    if (nonfinite_in == 'v' && emu::rare_paths_taken(1) > dq_rows_before) return "a NaN in V took the two-pass dQ's exact sum";
    if ((nonfinite_in == 'q' || nonfinite_in == 'k') && dt != DType::F32 && taken == 0)
      return "the non-finite inputs never reached an exact sum";
    return "";
  };
  std::vector<float> v = rounded(testing::random_tensor(nk, 3));
  if (nonfinite_v || nonfinite_in == 'v') {  // key 100 (dim 3) and key 150 (dim 0): masked by the causal rows before them
    v[size_t(100 * d + 3)] = std::numeric_limits<float>::quiet_NaN();
    if (nonfinite_v) v[size_t(150 * d)] = std::numeric_limits<float>::infinity();
  }
  // The table: per query block, key blocks far apart (sparse rows the kernels must jump across),
  // plus one past the key blocks in every third row (a problem the kernels skip and count).
  const int64_t blocks = (s.seq_k + 31) / 32;
  std::vector<int64_t> row_offsets{0};
  std::vector<int32_t> cols;
  for (int64_t qb = 0; qb < blocks; ++qb) {
    for (int64_t kb = (qb * 3) % 4; kb < blocks; kb += 5) cols.push_back(int32_t(kb));
    if (qb % 3 == 0) cols.push_back(int32_t(blocks + qb));
    row_offsets.push_back(int64_t(cols.size()));
  }
  DynamicLayout table;
  const int64_t problems = sanitize_dynamic_table(row_offsets.data(), blocks, cols.data(), int64_t(cols.size()), blocks, table);
  int32_t counted = 0;
  const DeviceDynamicLayout in_place{row_offsets.data(), cols.data(), blocks, int64_t(cols.size()), 1, &counted};
  ForwardOptions fo;
  if (device_table) fo.device_dynamic_layout = &in_place;
  const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data(), device_table ? &table : nullptr, 1);
  auto store = [&](const std::vector<float>& x) {
    std::vector<uint16_t> h;
    for (float f : x) h.push_back(float_to_bfloat16(f));
    return h;
  };
  RuntimeOptions ro;
  ro.device = sm90a ? Device::emu(90, true) : Device::emu(80);
  ro.templates = templates;
  ro.tma = tma;
  ro.wgmma_backward = sm90a;  // the backward's dK/dV on wgmma (bwd_sm90.cuh)
  ro.lazy_rescale = lazy;
  ro.poly_exp2 = poly;
  ro.config = config;
  ro.persistent_blocks = persistent;
  if (random_in_kernel) ro.random_in_kernel_above = 0;
  Runtime rt(ro);
  std::vector<float> o(nq, NAN), lse(size_t(s.heads_q * s.seq_q), NAN);
  std::vector<uint16_t> qh = store(q), kh = store(k), vh = store(v), oh(nq, 0xFFFF);
  const bool f32 = dt == DType::F32;
  auto view = [&](void* data, int64_t seq, int64_t heads) {
    return TensorView::contiguous(data, dt, {1, seq, heads, d});
  };
  const TensorView lv = TensorView::contiguous(lse.data(), DType::F32, {1, s.heads_q, s.seq_q});
  try {
    attention(rt, p, view(f32 ? (void*)q.data() : qh.data(), s.seq_q, 2), view(f32 ? (void*)k.data() : kh.data(), s.seq_k, 1),
              view(f32 ? (void*)v.data() : vh.data(), s.seq_k, 1), view(f32 ? (void*)o.data() : oh.data(), s.seq_q, 2), &lv, fo);
  } catch (const emu::KernelFault& e) {
    return std::string("fault: ") + e.what();
  }
  if (device_table && counted != problems)
    return "the kernels counted " + std::to_string(counted) + " problems in the table, not " + std::to_string(problems);
  if (!f32)
    for (size_t i = 0; i < nq; ++i) o[i] = bfloat16_to_float(oh[i]);
  double num = 0, den = 0;
  for (size_t i = 0; i < nq; ++i) {
    if (!std::isfinite(want.o[i])) {  // a non-finite V the row attends: the same NaN or inf
      if (std::isnan(want.o[i]) ? !std::isnan(o[i]) : o[i] != want.o[i])
        return "O at element " + std::to_string(i) + " is " + std::to_string(o[i]) + ", the reference's " + std::to_string(want.o[i]);
      continue;
    }
    if (std::isnan(o[i])) return "NaN in O at element " + std::to_string(i);
    num += (o[i] - want.o[i]) * (o[i] - want.o[i]);
    den += want.o[i] * want.o[i];
  }
  const double rel = std::sqrt(num / den), tol = f32 ? 1e-5 : 2e-2;
  if (rel > tol) return "relative Frobenius error of O " + std::to_string(rel);
  for (size_t i = 0; i < lse.size(); ++i)
    if (std::isnan(want.lse[i]) ? !std::isnan(lse[i]) : !(std::abs(lse[i] - want.lse[i]) <= tol * (1 + std::abs(want.lse[i]))))
      return "LSE differs at " + std::to_string(i);
  if (!backward) return rare_paths();
  // The gradients: dO random, the forward's O and LSE as computed above, and a loss that uses the
  // LSE too (dlse random: it joins D in _pre).
  std::vector<float> dout = rounded(testing::random_tensor(nq, 4));
  if (nonfinite_in == 'q') dout[size_t((41 * 2 + 1) * d + col + 2)] = nan;
  std::vector<float> dlse = testing::random_tensor(size_t(2 * s.seq_q), 6);
  const ReferenceGradients g = reference_attention_backward(p, s, q.data(), k.data(), v.data(), dout.data(),
                                                            device_table ? &table : nullptr, 1, nullptr, dlse.data());
  const TensorView dlse_view = TensorView::contiguous(dlse.data(), DType::F32, {1, 2, s.seq_q});
  std::vector<float> dq(nq), dk(nk), dv(nk);
  std::vector<uint16_t> doh = store(dout), dqh(nq), dkh(nk), dvh(nk);
  try {
    Attention op = rt.prepare(p, Problem{1, s.seq_q, s.seq_k, 2, 1, d, d, dt, {}});
    op.backward(view(f32 ? (void*)q.data() : qh.data(), s.seq_q, 2), view(f32 ? (void*)k.data() : kh.data(), s.seq_k, 1),
                view(f32 ? (void*)v.data() : vh.data(), s.seq_k, 1), view(f32 ? (void*)o.data() : oh.data(), s.seq_q, 2), lv,
                view(f32 ? (void*)dout.data() : doh.data(), s.seq_q, 2), view(f32 ? (void*)dq.data() : dqh.data(), s.seq_q, 2),
                view(f32 ? (void*)dk.data() : dkh.data(), s.seq_k, 1), view(f32 ? (void*)dv.data() : dvh.data(), s.seq_k, 1),
                ForwardOptions{.device_dynamic_layout = device_table ? &in_place : nullptr, .deterministic = deterministic,
                               .dlse = &dlse_view});
  } catch (const emu::KernelFault& e) {
    return std::string("fault in backward: ") + e.what();
  }
  for (const auto& [name, got, half, want_g] :
       {std::tuple<const char*, std::vector<float>*, std::vector<uint16_t>*, const std::vector<double>*>{"dQ", &dq, &dqh, &g.dq},
        {"dK", &dk, &dkh, &g.dk}, {"dV", &dv, &dvh, &g.dv}}) {
    if (!f32)
      for (size_t i = 0; i < got->size(); ++i) (*got)[i] = bfloat16_to_float((*half)[i]);
    double n2 = 0, d2 = 0;
    for (size_t i = 0; i < got->size(); ++i) {
      if (!std::isfinite((*want_g)[i])) {
        if (std::isnan((*want_g)[i]) ? !std::isnan((*got)[i]) : (*got)[i] != (*want_g)[i])
          return std::string(name) + " at element " + std::to_string(i) + " differs from the reference's non-finite value";
        continue;
      }
      if (std::isnan((*got)[i])) return std::string("NaN in ") + name + " at element " + std::to_string(i);
      n2 += ((*got)[i] - (*want_g)[i]) * ((*got)[i] - (*want_g)[i]);
      d2 += (*want_g)[i] * (*want_g)[i];
    }
    const double e = std::sqrt(n2 / d2), gtol = f32 ? 1e-5 : 3e-2;
    if (e > gtol) return std::string("relative Frobenius error of ") + name + " " + std::to_string(e);
  }
  return rare_paths();
}

}  // namespace attnjit::testing
