// The Pattern IR: the parser and the builder agree, defaults resolve as the spec says, the
// canonical text is stable, and bad values are UserErrors naming the JSON pointer.
#include <catch2/catch.hpp>

#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/nearest.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
using attnjit::testing::error_of;

TEST_CASE("the JSON parser and the builder build the same Pattern", "[pattern]") {
  const Pattern from_json = parse_spec(R"({
    "attnjit": 1, "causal": true, "window": [64, -1],
    "layout": {"block": [32, 64], "union": [{"local": 2}, {"global": [0]}, {"random": {"density": 0.25, "seed": 9}}]},
    "branches": [
      {"segment": 256, "dilation": 2},
      {"segment": "full", "dilation": 3, "offset": "head_block", "causal": false, "heads": [3, 1]},
      {"segment": 512, "dilation": 4, "offset": 1, "layout": {"explicit": {"blocks": [[1, 0], [0, 0]]}}},
      {"segment": 64, "dilation": 4, "offset": "torchscale"}
    ]})");
  const Pattern from_builder =
      PatternBuilder()
          .causal()
          .window(64, -1)
          .layout(layouts::union_of({layouts::local(2, 32, 64), layouts::global({0}, 32, 64), layouts::random(0.25, 9, 32, 64)},
                                    32, 64))
          .branch(BranchSpec().segment(256).dilation(2))
          .branch(BranchSpec().full().dilation(3).offset(OffsetRule::HeadBlock).causal(false).heads({1, 3}))
          .branch(BranchSpec().segment(512).dilation(4).offset(1).layout(layouts::explicit_blocks({{0, 0}, {1, 0}})))
          .branch(BranchSpec().segment(64).dilation(4).offset(OffsetRule::Torchscale))
          .build();
  CHECK(from_json == from_builder);
  CHECK(from_json.branches[3].offset.rule == OffsetRule::Torchscale);
  CHECK(canonical_text(from_json).find("branch 3: segment=64 dilation=4 offset=torchscale ") != std::string::npos);
  CHECK(error_of([] { parse_spec(R"({"attnjit": 1, "branches": [{"segment": 8, "dilation": 2, "offset": "torchscal"}]})"); }) ==
        "/branches/0/offset: unknown offset rule \"torchscal\"; did you mean \"torchscale\"? (valid: head_mod, head_block, "
        "torchscale, group, or an integer in [0, dilation))");
  CHECK(canonical_text(from_json) == canonical_text(from_builder));
  CHECK(pattern_hash(from_json) == pattern_hash(from_builder));
}

TEST_CASE("a bitmap layout is the explicit layout of its '1's, from JSON and from the builder", "[pattern]") {
  const Pattern bitmap = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full",
      "layout": {"explicit": {"per_head_bitmap": [["01", "", "1001"], ["1"]]}}}]})");
  const Pattern pairs = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full",
      "layout": {"explicit": {"per_head": [[[0, 1], [2, 0], [2, 3]], [[0, 0]]]}}}]})");
  const Pattern built = PatternBuilder()
                            .branch(BranchSpec().full().layout(layouts::explicit_per_head_bitmap({{"01", "", "1001"}, {"1"}})))
                            .build();
  CHECK(bitmap == pairs);
  CHECK(built == pairs);
  CHECK(pattern_hash(bitmap) == pattern_hash(pairs));
  CHECK(canonical_text(bitmap) == canonical_text(pairs));
  CHECK(blocks_from_bitmap({"110", "0", "001"}, "b") == std::vector<Layout::BlockPair>{{0, 0}, {0, 1}, {2, 2}});
  CHECK(blocks_from_bitmap({}, "b").empty());
  CHECK(error_of([] { layouts::explicit_bitmap({"10", "1-"}); }) ==
        "bitmap/1: character 1 is '-'; a bitmap row has '1' (block kept) and '0' (not kept) only");
  CHECK(error_of([] { blocks_from_bitmap({std::string("1\n")}, "b"); }) ==
        "b/0: character 1 is byte 10; a bitmap row has '1' (block kept) and '0' (not kept) only");
}

TEST_CASE("explicit layouts hold at most kExplicitBlocksCap blocks, and long lists print cut short for people", "[pattern]") {
  // At the cap: fine, from the builder and from a bitmap.
  std::vector<Layout::BlockPair> pairs;
  for (int64_t n = 0; n < kExplicitBlocksCap; ++n) pairs.emplace_back(n / 1024, n % 1024);
  const Pattern at_cap = PatternBuilder().branch(BranchSpec().full().layout(layouts::explicit_blocks(pairs, 1, 1))).build();
  CHECK(at_cap.branches[0].layout->explicit_blocks.size() == size_t(kExplicitBlocksCap));
  // One more: refused, over all heads, before a bitmap's blocks are stored.
  pairs.emplace_back(5000, 0);
  CHECK_THAT(error_of([&] { PatternBuilder().branch(BranchSpec().full().layout(layouts::explicit_blocks(pairs, 1, 1))).build(); }),
             Catch::StartsWith("/branches/0/layout/explicit/blocks: lists 1048577 blocks; an explicit layout lists at most 1048576 (2^20)"));
  const std::string row(size_t(kExplicitBlocksCap) + 1, '1');
  CHECK_THAT(error_of([&] { blocks_from_bitmap({row}, "b"); }), Catch::StartsWith("b: lists 1048577 blocks"));
  const std::string half(size_t(kExplicitBlocksCap) / 2 + 1, '1');
  CHECK_THAT(error_of([&] { PatternBuilder().branch(BranchSpec().full().layout(layouts::explicit_per_head_bitmap({{half}, {half}}))).build(); }),
             Catch::StartsWith("/branches/0/layout/explicit/per_head_bitmap: lists 1048578 blocks"));
  CHECK_THAT(error_of([&] { parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"explicit": {"bitmap": [")" + row + R"("]}}}]})"); }),
             Catch::StartsWith("/branches/0/layout/explicit/bitmap: lists 1048577 blocks"));

  // canonical_summary: the first pairs of each long list and the count left out; the canonical
  // text (and so the hash) keeps every pair.
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().full().layout(layouts::explicit_per_head({{{0, 0}, {0, 1}, {0, 2}}, {{1, 1}}}, 8, 8)))
                        .build();
  int64_t not_shown = -1;
  const std::string summary = canonical_summary(p, 2, &not_shown);
  CHECK(not_shown == 1);
  CHECK_THAT(summary, Catch::Contains("layout=explicit<8x8>(per_head=[(0,0),(0,1), ... 1 more blocks],[(1,1)])"));
  CHECK_THAT(canonical_text(p), Catch::Contains("layout=explicit<8x8>(per_head=[(0,0),(0,1),(0,2)],[(1,1)])"));
  CHECK(canonical_summary(p, 3, &not_shown) == canonical_text(p));
  CHECK(not_shown == 0);
}

TEST_CASE("a hierarchical layout is the union of its levels, from JSON and from the builder", "[pattern]") {
  const Pattern from_json = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full",
      "layout": {"block": 32, "hierarchical": [{"window": 2}, {"stride": 4, "block": [64, 16]}]}}]})");
  const Pattern as_union = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full",
      "layout": {"block": 32, "union": [{"intersect": [{"local": 2}, {"strided": {"stride": 1}}]},
                                        {"block": [64, 16], "strided": {"stride": 4}}]}}]})");
  const Pattern built =
      PatternBuilder()
          .branch(BranchSpec().full().layout(layouts::hierarchical({{2, 1, 32, 32}, {-1, 4, 64, 16}}, 32, 32)))
          .build();
  CHECK(from_json == as_union);
  CHECK(built == as_union);
  CHECK(pattern_hash(from_json) == pattern_hash(as_union));
  CHECK(error_of([] { layouts::hierarchical({}); }) ==
        "hierarchical: needs at least one level {\"window\": w, \"stride\": s, \"block\": b}");
  CHECK(error_of([] { layouts::hierarchical({{-3, 1}}); }) ==
        "hierarchical/0/window: must be -1 (unbounded) or a block distance >= 0, got -3");
}

TEST_CASE("defaults resolve: pattern-level masks, offsets per combine rule", "[pattern]") {
  const Pattern p = parse_spec(R"({"attnjit": 1, "causal": true, "window": [8, 0],
    "branches": [{"segment": 16, "dilation": 2}, {"segment": 16, "causal": false, "window": [-1, -1]}]})");
  CHECK(p.branches[0].causal);
  CHECK(p.branches[0].window == Window{8, 0});
  CHECK(p.branches[0].offset.rule == OffsetRule::HeadMod);
  CHECK_FALSE(p.branches[1].causal);
  CHECK(p.branches[1].window.unbounded());
  CHECK(p.branches[1].offset == Offset{OffsetRule::Fixed, 0});  // dilation 1: every position is selected
  CHECK_FALSE(p.scale.has_value());

  const Pattern g = parse_spec(R"({"attnjit": 1, "combine": "head_groups",
    "branches": [{"segment": 8, "dilation": 2}, {"segment": 8, "dilation": 2}, {"segment": 8, "dilation": 2, "offset": "head_mod"}]})");
  CHECK(g.group_scale == GroupScale::Mean);
  CHECK(g.branches[0].offset == Offset{OffsetRule::Fixed, 0});
  CHECK(g.branches[1].offset == Offset{OffsetRule::Fixed, 1});
  CHECK(g.branches[2].offset.rule == OffsetRule::HeadMod);
}

TEST_CASE("layout children inherit the block size, a branch layout replaces the pattern's", "[pattern]") {
  const Pattern p = parse_spec(R"({"attnjit": 1, "layout": {"block": 64, "union": [{"local": 1}, {"block": [8, 16], "global": [2]}]},
    "branches": [{"segment": "full"}, {"segment": "full", "layout": {"strided": {"stride": 4}}}]})");
  const Layout& u = *p.branches[0].layout;  // children in canonical order: global<8x16> before local<64x64>
  REQUIRE(u.children.size() == 2);
  CHECK(u.children[1].kind == Layout::Kind::Local);
  CHECK(u.children[1].bq == 64);
  CHECK(u.children[1].bk == 64);
  CHECK(u.children[0].kind == Layout::Kind::Global);
  CHECK(u.children[0].bq == 8);
  CHECK(u.children[0].bk == 16);
  const Layout& s = *p.branches[1].layout;
  CHECK(s.kind == Layout::Kind::Strided);
  CHECK(s.bq == kDefaultBlock);
  CHECK(s.phase == 0);
}

TEST_CASE("canonical text is pinned", "[pattern][golden]") {
  const Pattern p = parse_spec(R"({"attnjit": 1, "combine": "head_groups", "group_scale": "none", "scale": 0.125,
    "branches": [{"segment": 2048, "dilation": 1}, {"segment": 4096, "dilation": 2, "window": [100, 0],
      "layout": {"block": [64, 128], "intersect": [{"offsets": [0, -1]}, {"random": {"density": 0.025, "seed": 7}}]}}]})");
  CHECK(canonical_text(p) ==
        "attnjit-pattern v1\n"
        "combine head_groups group_scale none\n"
        "scale 0.125\n"
        "branch 0: segment=2048 dilation=1 offset=0 heads=all causal=false window=[-1,-1] layout=none\n"
        "branch 1: segment=4096 dilation=2 offset=1 heads=all causal=false window=[100,0] "
        "layout=intersect<64x128>(offsets<64x128>(-1,0),random<64x128>(density=0.025,seed=7))\n");
  // The hash is the first 16 hex digits of the SHA-256 of that text; it changes when the meaning does.
  CHECK(pattern_hash(p).size() == 16);
  const Pattern q = parse_spec(R"({"attnjit": 1, "combine": "head_groups", "group_scale": "none", "scale": 0.125,
    "branches": [{"segment": 2048, "dilation": 1}, {"segment": 4096, "dilation": 2, "window": [101, 0],
      "layout": {"block": [64, 128], "intersect": [{"offsets": [0, -1]}, {"random": {"density": 0.025, "seed": 7}}]}}]})");
  CHECK(pattern_hash(p) != pattern_hash(q));
}

TEST_CASE("bad values name the JSON pointer, from JSON and from the builder alike", "[pattern][errors]") {
  CHECK_THAT(error_of([] { parse_spec(R"({"attnjit": 1, "branches": [{"segment": 4, "dilation": 8}]})"); }),
             Catch::StartsWith("/branches/0/dilation: dilation 8 is larger than the segment 4"));
  CHECK_THAT(error_of([] { PatternBuilder().branch(BranchSpec().segment(4).dilation(8)).build(); }),
             Catch::StartsWith("/branches/0/dilation: dilation 8 is larger than the segment 4"));
  CHECK_THAT(error_of([] { PatternBuilder().branch(BranchSpec().segment(8).dilation(2).offset(2)).build(); }),
             Catch::StartsWith("/branches/0/offset"));
  CHECK_THAT(error_of([] { PatternBuilder().build(); }), Catch::StartsWith("/branches"));
  CHECK_THAT(error_of([] { PatternBuilder().branch(BranchSpec().full().layout(layouts::local(1, 0, 4))).build(); }),
             Catch::StartsWith("/branches/0/layout/block"));
  CHECK_THAT(error_of([] { parse_spec(R"({"attnjit": 1, "branches": [{"segment": 8, "dilaton": 2}]})"); }),
             Catch::Contains("did you mean \"dilation\""));
  // A word near no valid one gets the list alone, not a misleading suggestion.
  const std::string far = error_of([] { parse_spec(R"({"attnjit": 1, "branches": [{"segment": 8, "qqqqqqqq": 2}]})"); });
  CHECK_THAT(far, Catch::StartsWith("/branches/0/qqqqqqqq: unknown field \"qqqqqqqq\" (valid here:"));
  CHECK_THAT(far, !Catch::Contains("did you mean"));
  CHECK_THAT(error_of([] { parse_spec(R"({"attnjit": 1, "branches": [{"segment": 8}], "combine": "mean"})"); }),
             Catch::StartsWith("/combine: unknown combine rule \"mean\" (valid: softmax, head_groups)"));
  CHECK(did_you_mean("backwards", {"backward", "tiles"}) == "; did you mean \"backward\"?");
  CHECK(did_you_mean("foo", {"backward", "tiles"}).empty());
  CHECK(did_you_mean("locl", {"local", "window"}) == "; did you mean \"local\"?");
  CHECK(did_you_mean("xy", {"local", "ab"}) == "");  // two edits from "ab": more than a third of 2 letters
  CHECK_THAT(error_of([] { parse_spec("{\"attnjit\": 1,\n \"branches\": [}", "s.json"); }),
             Catch::Contains("line 2, column"));
}

TEST_CASE("shape checks: heads, groups, explicit blocks, GQA", "[pattern][errors]") {
  const Pattern p = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "heads": [0, 5],
    "layout": {"block": 16, "explicit": {"blocks": [[3, 0]]}}}]})");
  Shape s;
  s.seq_q = s.seq_k = 64;
  s.heads_q = s.heads_kv = 8;
  CHECK_NOTHROW(check_pattern_fits(p, s));
  s.heads_q = s.heads_kv = 4;
  CHECK_THAT(error_of([&] { check_pattern_fits(p, s); }), Catch::StartsWith("/branches/0/heads/1: head 5 is out of range"));
  s.heads_q = s.heads_kv = 8;
  // 3 query blocks of 16: block 3 is past the end of a whole sequence of 48...
  CHECK_THAT(error_of([&] { check_blocks_inside_sequence(p, 48, 64); }),
             Catch::StartsWith("/branches/0/layout/explicit/blocks: block [3, 0] lies outside the sequence"));
  CHECK_NOTHROW(check_blocks_inside_sequence(p, 64, 64));
  // ...but a chunk of 48 rows is a legitimate call: the block attends nothing in it.
  s.seq_q = 48;
  CHECK_NOTHROW(check_pattern_fits(p, s));
  s.heads_kv = 3;
  CHECK_THAT(error_of([&] { check_pattern_fits(p, s); }), Catch::StartsWith("heads_kv: 3 does not divide heads_q 8"));
  const Pattern g = parse_spec(R"({"attnjit": 1, "combine": "head_groups", "branches": [{"segment": 4}, {"segment": 8}, {"segment": 16}]})");
  Shape two;
  two.seq_q = two.seq_k = 4;
  two.heads_q = two.heads_kv = 2;
  CHECK_THAT(error_of([&] { check_pattern_fits(g, two); }), Catch::Contains("3 branches and 2 query heads"));
}
