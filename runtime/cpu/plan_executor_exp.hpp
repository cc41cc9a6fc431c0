// The CPU executor's exp, on Eigen's SIMD layer (runtime/cpu/plan_executor_tiles.cpp; also timed by
// bench/cpu_tile_bench.cpp). Included by files compiled once per instruction set: everything here
// has internal linkage, so each variant keeps its own code.
#pragma once

#include <Eigen/Core>

namespace {

// exp on a packet of Eigen's SIMD layer (SSE2 or AVX2+FMA, by the variant): Eigen's own float exp
// (the Cephes polynomial on x = m ln 2 + r) with its exponent scaling replaced by the fast one
// Eigen provides (pldexp_fast: 2^m by integer addition, about 7x cheaper than the generic scaling,
// which guards against overflow and denormals). The polynomial runs on the argument clamped to
// [-87.3, 88.3]; below -87.3 (the true result < 1.2e-38, subnormal or 0 in float) the result is
// exactly 0, as the kernels' flushed ex2 gives: a weight of 1.2e-38 would reach O through a V of
// 1e38, and a -inf score (a key of inf in a tile without a mask) would weigh an inf key in dQ.
// Above 88.3 (an LSE from the caller smaller than the scores) the result saturates. NaN propagates.
using Packet = Eigen::internal::packet_traits<float>::type;

inline Packet exp_packet(Packet x) {
  namespace ei = Eigen::internal;
  const Packet lo = ei::pset1<Packet>(-87.3f);
  const Packet under = ei::pcmp_lt(x, lo);  // false for NaN
  x = ei::pmax(ei::pmin(x, ei::pset1<Packet>(88.3f)), lo);
  const Packet m = ei::pfloor(ei::pmadd(x, ei::pset1<Packet>(1.44269504088896341f), ei::pset1<Packet>(0.5f)));
  Packet r = ei::pmadd(m, ei::pset1<Packet>(-0.693359375f), x);
  r = ei::pmadd(m, ei::pset1<Packet>(2.12194440e-4f), r);
  const Packet r2 = ei::pmul(r, r), r3 = ei::pmul(r2, r);
  Packet y = ei::pmadd(ei::pset1<Packet>(1.9875691500e-4f), r, ei::pset1<Packet>(1.3981999507e-3f));
  Packet y1 = ei::pmadd(ei::pset1<Packet>(4.1665795894e-2f), r, ei::pset1<Packet>(1.6666665459e-1f));
  const Packet y2 = ei::padd(r, ei::pset1<Packet>(1.0f));
  y = ei::pmadd(y, r, ei::pset1<Packet>(8.3334519073e-3f));
  y1 = ei::pmadd(y1, r, ei::pset1<Packet>(5.0000001201e-1f));
  y = ei::pmadd(y, r3, y1);
  y = ei::pmadd(y, r2, y2);
  return ei::pselect(under, ei::pset1<Packet>(0.0f), ei::pldexp_fast_impl<Packet>::run(y, m));
}

// row[c] = exp(scale * row[c] - shift) for c < n, and 0 where `keep` (when given) is 0, selected:
// a shift that is NaN (the LSE of a row that attended a NaN) must not reach the pairs the row
// masks. In one pass; returns the sum of the results.
inline float exp_row(float* row, const float* keep, Eigen::Index n, float scale, float shift) {
  namespace ei = Eigen::internal;
  constexpr Eigen::Index W = ei::unpacket_traits<Packet>::size;
  const Packet vscale = ei::pset1<Packet>(scale), vshift = ei::pset1<Packet>(-shift);
  Packet acc = ei::pset1<Packet>(0.0f);
  Eigen::Index c = 0;
  for (; c + W <= n; c += W) {
    Packet e = exp_packet(ei::pmadd(ei::ploadu<Packet>(row + c), vscale, vshift));
    if (keep) e = ei::pselect(ei::pcmp_eq(ei::ploadu<Packet>(keep + c), ei::pset1<Packet>(0.0f)), ei::pset1<Packet>(0.0f), e);
    ei::pstoreu(row + c, e);
    acc = ei::padd(acc, e);
  }
  float sum = ei::predux(acc);
  for (; c < n; ++c) {  // the tail, with the packet code on one lane
    float e = ei::pfirst(exp_packet(ei::pset1<Packet>(row[c] * scale - shift)));
    if (keep && keep[c] == 0.0f) e = 0.0f;
    row[c] = e;
    sum += e;
  }
  return sum;
}

}  // namespace
