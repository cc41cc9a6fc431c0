// The spec reader and validator (compiler/pattern/spec_json.*, compiler/pattern/pattern_validate.*): any text is
// either a Pattern or a UserError. A Pattern that validated prints canonically, hashes, equals
// itself, and on a small shape it fits, counts each branch's keys as its pairwise definition does.
#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace attnjit;
using attnjit::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Pattern p;
  try {
    p = parse_spec(fuzz::text_of(data, size), "<fuzz>");
  } catch (const UserError&) {
    return 0;
  }
  const std::string canonical = canonical_text(p);
  require(!canonical.empty() && pattern_hash(p).size() == 16, "canonical text and a 16-digit hash");
  require(p == p, "a pattern equals itself");
  const Pattern copy = p;
  require(canonical_text(copy) == canonical && pattern_hash(copy) == pattern_hash(p), "a copy prints the same");

  // The mask on a small shape, offsets included; a dynamic layout needs a table (fuzz_dynamic_layout).
  if (p.has_dynamic_layout()) return 0;
  Shape s;
  s.seq_q = 13, s.seq_k = 11, s.heads_q = 4, s.heads_kv = 2, s.q_offset = 5, s.k_offset = 2;
  try {
    check_pattern_fits(p, s);
  } catch (const UserError&) {
    return 0;
  }
  const MaskContext c{p, s};
  for (size_t b = 0; b < p.branches.size(); ++b) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      for (int64_t i = 0; i < s.seq_q; ++i) {
        int64_t pairwise = 0;
        for (int64_t j = 0; j < s.seq_k; ++j) pairwise += branch_attends(c, b, h, i, j) ? 1 : 0;
        int64_t listed = 0;
        for_each_branch_key(c, b, h, i, [&](int64_t j) {
          require(j >= 0 && j < s.seq_k && branch_attends(c, b, h, i, j), "for_each_branch_key lists an attended key");
          ++listed;
        });
        require(listed == pairwise && branch_key_count(c, b, h, i) == pairwise,
                "branch " + std::to_string(b) + " head " + std::to_string(h) + " row " + std::to_string(i) +
                    ": the key count equals the pairwise definition");
      }
    }
  }
  return 0;
}
