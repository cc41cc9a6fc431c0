// The dynamic-layout CSR reader (tools/cli_common.*: parse_dynamic_layout) and its check against a
// pattern and shape (compiler/pattern/mask.*: check_dynamic_layout): any text is either a table or a
// UserError. A table that passes the check is what the mask uses: every (head, query, key) is
// attended exactly when its key block is listed in its query block's row.
#include <algorithm>

#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "fuzz/fuzz_support.hpp"
#include "tools/cli_common.hpp"

using namespace attnjit;
using attnjit::fuzz::require;

namespace {

constexpr int64_t kBq = 4, kBk = 2, kKeyBlocks = 6;

const Pattern& dynamic_pattern() {
  static const Pattern p = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"block": [4, 2], "dynamic": true}}]})");
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  DynamicLayout d;
  try {
    d = cli::parse_dynamic_layout(fuzz::text_of(data, size), "<fuzz>");
  } catch (const UserError&) {
    return 0;
  }
  require(d.heads >= 1 && !d.row_offsets.empty(), "a table has heads >= 1 and row offsets");

  // The shape the table describes (one table shared by three query heads, or one per head), so most tables reach
  // the checks past the row count; keys: six blocks of two.
  const int64_t rows = static_cast<int64_t>(d.row_offsets.size()) - 1;
  const int64_t heads_q = d.heads == 1 ? 3 : std::min<int64_t>(d.heads, 64);
  const int64_t rows_per_head = d.heads == 1 ? rows : rows / heads_q;
  if (rows_per_head < 1) return 0;
  Shape s;
  s.heads_q = s.heads_kv = heads_q;
  s.seq_q = rows_per_head * kBq - (rows % 2);  // an odd row count: the last query block is partial
  s.seq_k = kKeyBlocks * kBk;
  try {
    check_dynamic_layout(dynamic_pattern(), s, d, "<fuzz>");
  } catch (const UserError&) {
    return 0;
  }
  if (s.heads_q * s.seq_q * s.seq_k > (1 << 16)) return 0;  // keep an execution short
  const MaskContext c{dynamic_pattern(), s, &d};
  for (int64_t h = 0; h < s.heads_q; ++h) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      const int64_t row = (d.heads == 1 ? 0 : h * rows_per_head) + i / kBq;
      const auto begin = d.col_indices.begin() + d.row_offsets[row], end = d.col_indices.begin() + d.row_offsets[row + 1];
      for (int64_t j = 0; j < s.seq_k; ++j) {
        const bool listed = std::find(begin, end, static_cast<int32_t>(j / kBk)) != end;
        require(attend_count(c, h, i, j) == (listed ? 1 : 0), "the mask follows the table at head " + std::to_string(h) +
                                                                   ", row " + std::to_string(i) + ", key " + std::to_string(j));
      }
    }
  }
  return 0;
}
