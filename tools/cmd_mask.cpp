// attnjit mask SPEC --seq-q N ... --out FILE(.npy|.svg): the mask as data or as a picture.
#include <algorithm>
#include <iostream>
#include <memory>

#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "runtime/npy.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"
#include "tools/mask_svg.hpp"

namespace attnjit::cli {

namespace {
struct MaskOptions {
  std::string spec, out, dynamic;
  DocumentsOption cu_seqlens;
  ShapeOptions shape;
  int64_t max_bytes = int64_t{1} << 30;
  int64_t max_heads = 4;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void write_mask_npy(const MaskContext& c, const MaskOptions& o) {
  const Shape& s = c.shape;
  // Check the size before allocating: a long sequence makes heads * S^2 bytes absurd quickly (past
  // int64 for the largest shapes: sizes are below 2^31, so the product is exact in 128 bits).
  const __int128 bytes = static_cast<__int128>(s.heads_q) * s.seq_q * s.seq_k;
  if (bytes > o.max_bytes) {
    const std::string shown = bytes <= INT64_MAX ? std::to_string(static_cast<int64_t>(bytes)) : "more than 2^63";
    throw UserError("--out " + o.out, "the dense mask would take " + shown +
                                          " bytes (heads_q * seq_q * seq_k), over the limit of " +
                                          std::to_string(o.max_bytes) +
                                          "; use a shorter sequence, a .svg picture, or raise --max-bytes");
  }
  if (c.pattern.branches.size() > 255) throw UserError(o.spec, "more than 255 branches do not fit a uint8 mask count");
  std::vector<uint8_t> mask(static_cast<size_t>(bytes), 0);
  for (int64_t h = 0; h < s.heads_q; ++h) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      uint8_t* row = mask.data() + (h * s.seq_q + i) * s.seq_k;
      for (size_t b = 0; b < c.pattern.branches.size(); ++b) for_each_branch_key(c, b, h, i, [&](int64_t j) { ++row[j]; });
    }
  }
  write_npy(o.out, NpyDtype::U8, {s.heads_q, s.seq_q, s.seq_k}, mask.data());
}

int run_mask(const MaskOptions& o) {
  const Pattern p = load_spec(o.spec);
  if (!o.shape.has_seq()) throw UserError("--seq-q", "is required: the mask depends on the sequence length");
  const Shape s = o.shape.shape();
  check_pattern_fits(p, s);
  check_blocks_inside_sequence(p, s.q_offset + s.seq_q, s.k_offset + s.seq_k);
  const std::optional<DynamicLayout> dyn = dynamic_table_for(p, s, o.dynamic);
  const std::optional<std::vector<int64_t>> docs = documents_for(p, s, o.cu_seqlens, dyn.has_value());
  const MaskContext c{p, s, dyn ? &*dyn : nullptr, docs ? &*docs : nullptr};
  if (ends_with(o.out, ".npy")) {
    write_mask_npy(c, o);
  } else if (ends_with(o.out, ".svg")) {
    std::vector<int64_t> heads;
    for (int64_t h = 0; h < std::min(s.heads_q, o.max_heads); ++h) heads.push_back(h);
    write_mask_svg(c, heads, o.out);
  } else {
    throw UserError("--out " + o.out, "unknown format; name the file .npy (uint8 [heads_q, seq_q, seq_k]) or .svg (a picture)");
  }
  std::cout << "wrote " << o.out << "\n";
  return 0;
}
}  // namespace

void register_mask(CLI::App& app, int& rc) {
  auto o = std::make_shared<MaskOptions>();
  CLI::App* sub = app.add_subcommand("mask", "write a pattern's mask as .npy (counts) or .svg (a picture)");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  o->shape.add_to(sub, false);
  sub->add_option("--out", o->out, "output file: .npy or .svg")->required();
  sub->add_option("--dynamic", o->dynamic, "CSR table for a dynamic layout (JSON)");
  add_cu_seqlens_option(sub, o->cu_seqlens);
  sub->add_option("--max-bytes", o->max_bytes, "largest dense .npy mask to write")->capture_default_str()->check(at_least(0));
  // At least one head: a picture of none is never what was meant.
  sub->add_option("--max-heads", o->max_heads, "heads drawn in a .svg")->capture_default_str()->check(at_least(1));
  sub->callback([o, &rc] { rc = guarded([&] { return run_mask(*o); }); });
}

}  // namespace attnjit::cli
