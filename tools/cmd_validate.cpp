// attnjit validate SPEC: canonical form, hash and (with --seq) statistics.
#include <iostream>
#include <memory>

#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/knobs.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {
struct ValidateOptions {
  std::string spec;
  ShapeOptions shape;
  std::string dynamic;
  DocumentsOption cu_seqlens;
  bool full = false;
};

int run_validate(const ValidateOptions& o) {
  const Pattern p = load_spec(o.spec);
  std::cout << "spec: " << o.spec << "\nhash: " << pattern_hash(p) << "\ncanonical:\n";
  std::istringstream lines(canonical_for_people(p, o.full));
  for (std::string line; std::getline(lines, line);) std::cout << "  " << line << "\n";
  if (!o.shape.has_seq()) {
    std::cout << "statistics: give --seq N (and --heads-q H) to count attended pairs\n";
    return 0;
  }
  const Shape s = o.shape.shape();
  check_pattern_fits(p, s);
  check_blocks_inside_sequence(p, s.q_offset + s.seq_q, s.k_offset + s.seq_k);
  if (p.has_dynamic_layout() && o.dynamic.empty()) {
    std::cout << "statistics: the pattern has a dynamic layout; give --dynamic FILE to count attended pairs\n";
    return 0;
  }
  const std::optional<DynamicLayout> dyn = dynamic_table_for(p, s, o.dynamic);
  const std::optional<std::vector<int64_t>> docs = documents_for(p, s, o.cu_seqlens, dyn.has_value());
  Progress progress("statistics", std::cerr, knobs().progress_after_s);
  const PatternStats st = pattern_stats(MaskContext{p, s, dyn ? &*dyn : nullptr, docs ? &*docs : nullptr}, &progress);
  progress.done();
  std::cout << "statistics (seq_q=" << s.seq_q << " seq_k=" << s.seq_k << " heads_q=" << s.heads_q
            << " q_offset=" << s.q_offset << " k_offset=" << s.k_offset;
  if (docs) std::cout << " documents=" << docs->size() - 1;
  std::cout << "):\n";
  std::cout << "  branches: " << p.branches.size() << "\n";
  std::cout << "  attended pairs: " << st.attended_pairs << " (" << human_count(static_cast<double>(st.attended_pairs))
            << ", counted once per branch)\n";
  std::cout << "  distinct pairs: " << st.distinct_pairs << " (" << human_count(static_cast<double>(st.distinct_pairs))
            << ", counted once however many branches attend them)\n";
  std::cout << "  density: " << st.density * 100.0 << "% of heads_q * seq_q * seq_k (counted once per branch)\n";
  std::cout << "  distinct density: " << st.distinct_density * 100.0 << "% of heads_q * seq_q * seq_k\n";
  for (size_t b = 0; b < st.pairs_per_branch.size(); ++b)
    std::cout << "  branch " << b << ": " << st.pairs_per_branch[b] << " pairs\n";
  std::cout << "  empty rows: " << st.empty_rows << " of " << s.heads_q * s.seq_q << " (head, query row) pairs\n";
  return 0;
}
}  // namespace

void register_validate(CLI::App& app, int& rc) {
  auto o = std::make_shared<ValidateOptions>();
  CLI::App* sub = app.add_subcommand("validate", "check a spec; print its canonical form, hash and statistics");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  o->shape.add_to(sub, false);
  sub->add_option("--dynamic", o->dynamic, "CSR table for a dynamic layout (JSON)");
  add_cu_seqlens_option(sub, o->cu_seqlens);
  sub->add_flag("--full", o->full, "print every block of long explicit lists (default: the first 16 of each)");
  sub->callback([o, &rc] { rc = guarded([&] { return run_validate(*o); }); });
}

}  // namespace attnjit::cli
