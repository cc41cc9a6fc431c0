// Random valid patterns and shapes for property tests: small sizes so structure (segments,
// dilations, blocks, offsets) shows up many times inside one short sequence.
#pragma once

#include <optional>
#include <random>

#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"

namespace attnjit::testing {

struct RandomCase {
  Pattern pattern;
  Shape shape;
  std::optional<DynamicLayout> dynamic;
};

class CaseGenerator {
public:
  explicit CaseGenerator(uint64_t seed) : rng_(seed) {}

  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng_); }

  Shape random_shape() {
    Shape s;
    s.batch = uniform(1, 2);
    s.heads_kv = uniform(1, 3);
    s.heads_q = s.heads_kv * uniform(1, 3);
    s.seq_q = uniform(1, 70);
    s.seq_k = coin(0.7) ? s.seq_q : uniform(1, 70);
    s.q_offset = coin(0.5) ? 0 : uniform(0, 60);
    s.k_offset = coin(0.5) ? 0 : uniform(0, 60);
    s.head_dim = uniform(1, 8);
    s.head_dim_v = coin(0.7) ? s.head_dim : uniform(1, 8);
    return s;
  }

  // A layout whose explicit blocks stay inside the shape's sequences.
  Layout random_layout(const Shape& s, int depth = 0) {
    const int64_t bq = uniform(1, 12), bk = coin(0.6) ? bq : uniform(1, 12);
    const int64_t qblocks = (s.q_offset + s.seq_q + bq - 1) / bq, kblocks = (s.k_offset + s.seq_k + bk - 1) / bk;
    switch (uniform(0, depth < 2 ? 8 : 6)) {
      case 0: return layouts::local(uniform(0, 3), bq, bk);
      case 1: return layouts::global({uniform(0, qblocks), uniform(0, kblocks)}, bq, bk);
      case 2: { const int64_t st = uniform(1, 4); return layouts::strided(st, uniform(0, st - 1), bq, bk); }
      case 3: return layouts::offsets({uniform(-3, 3), uniform(-3, 3)}, bq, bk);
      case 4: return layouts::random(std::uniform_real_distribution<double>(0, 1)(rng_), rng_(), bq, bk);
      case 5: return layouts::explicit_blocks(random_pairs(qblocks, kblocks), bq, bk);
      case 6: {
        std::vector<std::vector<Layout::BlockPair>> ph;
        for (int64_t h = 0; h < s.heads_q; ++h) ph.push_back(random_pairs(qblocks, kblocks));
        return layouts::explicit_per_head(ph, bq, bk);
      }
      default: {
        std::vector<Layout> kids;
        for (int64_t n = uniform(1, 3); n > 0; --n) kids.push_back(random_layout(s, depth + 1));
        return coin() ? layouts::union_of(kids, bq, bk) : layouts::intersect_of(kids, bq, bk);
      }
    }
  }

  BranchSpec random_branch(const Shape& s, bool allow_heads) {
    BranchSpec b;
    const bool full = coin(0.2);
    const int64_t w = uniform(1, 40);
    if (full) b.full(); else b.segment(w);
    const int64_t r = uniform(1, full ? 6 : std::min<int64_t>(w, 6));
    b.dilation(r);
    switch (uniform(0, 4)) {
      case 0: b.offset(OffsetRule::HeadMod); break;
      case 1: b.offset(OffsetRule::HeadBlock); break;
      case 2: b.offset(OffsetRule::Group); break;
      case 3: b.offset(OffsetRule::Torchscale); break;
      default: b.offset(uniform(0, r - 1)); break;
    }
    if (allow_heads && coin(0.2)) {
      std::vector<int64_t> heads;
      for (int64_t h = 0; h < s.heads_q; ++h)
        if (coin()) heads.push_back(h);
      if (heads.empty()) heads.push_back(uniform(0, s.heads_q - 1));
      b.heads(heads);
    }
    if (coin(0.3)) b.causal(coin());
    if (coin(0.25)) b.window(coin() ? -1 : uniform(0, 20), coin() ? -1 : uniform(0, 20));
    if (coin(0.3)) b.layout(random_layout(s));
    return b;
  }

  RandomCase next() {
    RandomCase c;
    c.shape = random_shape();
    PatternBuilder pb;
    const bool groups = coin(0.3);
    if (groups) {
      pb.combine(Combine::HeadGroups).group_scale(coin(0.7) ? GroupScale::Mean : GroupScale::None);
    }
    if (coin(0.3)) pb.causal();
    if (coin(0.2)) pb.window(uniform(-1, 15), uniform(-1, 15));
    if (coin(0.2)) pb.layout(random_layout(c.shape));
    if (coin(0.2)) pb.scale(0.05 + std::uniform_real_distribution<double>(0, 1)(rng_));
    const int64_t branches = groups ? uniform(1, c.shape.heads_q) : uniform(1, 4);
    const int64_t dynamic_branch = coin(0.12) ? uniform(0, branches - 1) : -1;
    for (int64_t b = 0; b < branches; ++b) {
      BranchSpec spec = random_branch(c.shape, !groups);
      if (b == dynamic_branch) {
        const int64_t bq = uniform(1, 12), bk = uniform(1, 12);
        // Mostly the table alone; sometimes joined with another layout, any kind and blocks (a
        // table on the device is then sought through the whole layout, and full tiles are the
        // other layout's).
        const int64_t form = uniform(0, 7);
        if (form == 4) spec.layout(layouts::union_of({layouts::dynamic(bq, bk), layouts::local(uniform(0, 1), bq, bk)}, bq, bk));
        else if (form == 5) spec.layout(layouts::intersect_of({layouts::dynamic(bq, bk), layouts::strided(2, uniform(0, 1), bq, bk)}, bq, bk));
        else if (form == 6) spec.layout(layouts::union_of({layouts::dynamic(bq, bk), random_layout(c.shape)}, bq, bk));
        else if (form == 7) spec.layout(layouts::intersect_of({layouts::dynamic(bq, bk), random_layout(c.shape)}, bq, bk));
        else spec.layout(layouts::dynamic(bq, bk));
        c.dynamic = random_table(c.shape, bq, bk);
      }
      pb.branch(spec);
    }
    c.pattern = pb.build();
    return c;
  }

  // For a pattern with a translation period: the case's shape moved by 1..3 periods (the same mask
  // in local rows) and moved by one position (often another mask: the comparison can fail).
  struct Shifted {
    int64_t period = 0;
    Shape moved, by_one;
  };
  std::optional<Shifted> shifted(const RandomCase& c) {
    const std::optional<int64_t> period = translation_period(c.pattern);
    if (!period) return std::nullopt;
    Shifted out{*period, c.shape, c.shape};
    const int64_t m = uniform(1, 3);
    out.moved.q_offset += m * *period, out.moved.k_offset += m * *period;
    ++out.by_one.q_offset, ++out.by_one.k_offset;
    return out;
  }

  // A valid CSR table for a dynamic layout with blocks bq x bk.
  DynamicLayout random_table(const Shape& s, int64_t bq, int64_t bk) {
    DynamicLayout d;
    d.heads = coin() ? 1 : s.heads_q;
    const int64_t qblocks = (s.q_offset + s.seq_q + bq - 1) / bq, kblocks = (s.k_offset + s.seq_k + bk - 1) / bk;
    d.row_offsets.push_back(0);
    for (int64_t r = 0; r < d.heads * qblocks; ++r) {
      for (int64_t kb = 0; kb < kblocks; ++kb)
        if (coin(0.4)) d.col_indices.push_back(static_cast<int32_t>(kb));
      d.row_offsets.push_back(static_cast<int64_t>(d.col_indices.size()));
    }
    return d;
  }

private:
  std::vector<Layout::BlockPair> random_pairs(int64_t qblocks, int64_t kblocks) {
    std::vector<Layout::BlockPair> out;
    for (int64_t n = uniform(0, 6); n > 0; --n) out.emplace_back(uniform(0, qblocks - 1), uniform(0, kblocks - 1));
    return out;
  }

  std::mt19937_64 rng_;
};

// Dense float inputs in [-1, 1) of the shape, seeded.
inline std::vector<float> random_tensor(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> t(n);
  for (float& x : t) x = u(rng);
  return t;
}

}  // namespace attnjit::testing
