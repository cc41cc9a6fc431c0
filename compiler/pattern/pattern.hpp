// The Pattern: attnjit's validated semantic IR (docs/spec.md).
//
// A Pattern is what a spec means, with every default resolved: each branch carries its own causal
// flag, window, layout and offset rule, so two specs that mean the same thing build equal Patterns
// and print the same canonical text. Patterns are built by parse_spec() (JSON) or PatternBuilder.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../support/types.hpp"  // kDefaultHeadDim; beside this folder, as it is installed too

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

constexpr int kSpecVersion = 1;
constexpr int64_t kDefaultBlock = 128;
constexpr size_t kMaxBranches = 64;  // branch sets are 64-bit masks in the lowering

enum class Combine { Softmax, HeadGroups };
enum class GroupScale { Mean, None };
// Offset of head h of Hq under a dilation r: HeadMod h mod r (the LongNet paper), HeadBlock
// floor(h*r/Hq), Torchscale floor(h / ceil(Hq/r)) (torchscale pads the heads to a multiple of r),
// Group the branch index mod r, Fixed a constant.
enum class OffsetRule { HeadMod, HeadBlock, Group, Fixed, Torchscale };

struct Offset {
  OffsetRule rule = OffsetRule::HeadMod;
  int64_t value = 0;  // only for OffsetRule::Fixed
  bool operator==(const Offset&) const = default;
};

// Token window around the query position: key p_k is allowed iff
// p_q - left <= p_k <= p_q + right; -1 means unbounded on that side.
struct Window {
  int64_t left = -1;
  int64_t right = -1;
  bool unbounded() const { return left < 0 && right < 0; }
  bool operator==(const Window&) const = default;
};

// One node of the block-sparse layout algebra. Blocks are on global positions:
// query block qb = floor(p_q / bq), key block kb = floor(p_k / bk).
struct Layout {
  enum class Kind { Local, Global, Strided, Offsets, Random, Explicit, Union, Intersect, Dynamic };
  using BlockPair = std::pair<int64_t, int64_t>;  // (qb, kb)

  Kind kind = Kind::Local;
  int64_t bq = kDefaultBlock;
  int64_t bk = kDefaultBlock;
  int64_t local = 0;                        // Local: |kb - qb| <= local
  std::vector<int64_t> blocks;              // Global: block indices; Offsets: kb - qb values (sorted, unique)
  int64_t stride = 1, phase = 0;            // Strided: kb % stride == phase
  double density = 0.0;                     // Random
  uint64_t seed = 0;                        // Random
  int64_t head_base = 0;                    // Random: head h hashes as head_base + h (a slice of the heads)
  std::vector<BlockPair> explicit_blocks;   // Explicit (shared by all heads), sorted, unique
  std::vector<std::vector<BlockPair>> per_head;  // Explicit per query head, each sorted, unique
  // Explicit, written as "bitmap" / "per_head_bitmap": names those fields in errors. Not part of
  // the meaning (a bitmap and the same blocks as pairs are equal and hash equally).
  bool from_bitmap = false;
  std::vector<Layout> children;             // Union / Intersect
  std::string path;                         // JSON pointer of this node in the spec, for errors

  bool operator==(const Layout& o) const;  // semantic equality (ignores path)
};

struct Branch {
  std::optional<int64_t> segment;  // nullopt: the whole sequence is one segment
  int64_t dilation = 1;
  Offset offset;
  std::optional<std::vector<int64_t>> heads;  // query heads this branch applies to (sorted, unique)
  bool causal = false;
  Window window;
  std::optional<Layout> layout;
  std::string path;  // JSON pointer ("/branches/2"), for errors found once a shape is known

  bool operator==(const Branch& o) const;
};

struct Pattern {
  Combine combine = Combine::Softmax;
  GroupScale group_scale = GroupScale::Mean;
  std::optional<double> scale;  // nullopt: 1/sqrt(head_dim)
  std::vector<Branch> branches;

  bool operator==(const Pattern& o) const;
  bool has_dynamic_layout() const;
  bool has_layout_kind(Layout::Kind kind) const;  // some branch's layout has a node of this kind
};

// Does the layout have a node of this kind (itself or a descendant)?
bool layout_has_kind(const Layout& l, Layout::Kind kind);

// The largest position attnjit supports, exclusive. Every global position of a call (q_offset + i,
// k_offset + j, so offset + length <= 2^62) and every length or extent a spec gives (segment,
// dilation, block sizes, block indices and distances, strides) lies below 2^62. Below it, a
// position plus an extent, or the difference of two positions, fits int64 with room to spare, so
// the mask, the plan and the executors compute positions without overflow checks. Window
// extents at or above it are farther than any two positions lie apart: they mean "unbounded" and
// are stored as -1. Checked in one place each: spec fields by resolve_and_validate
// (pattern_validate.cpp), offsets and lengths by check_shape.
constexpr int64_t kMaxPosition = int64_t{1} << 62;

// The largest size of one call (batch, sequence lengths, heads, head dims): plans and kernels count
// rows, key tiles and heads in 32 bits. A longer sequence is several calls with offsets. Checked by
// check_shape, with the element count of each tensor (below 2^62).
constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;

// The most blocks one explicit layout lists, over all its heads (2^20, 16 MiB of pairs): a larger
// layout is a dynamic one (a CSR table given at run time) or is built from generators. Checked
// when a spec is read, before its blocks are stored (a bitmap's '1's are counted first).
constexpr int64_t kExplicitBlocksCap = int64_t{1} << 20;

// Sizes of one call. Positions are global: query row i sits at q_offset + i, key row j at k_offset + j.
struct Shape {
  int64_t batch = 1;
  int64_t seq_q = 0, seq_k = 0;
  int64_t heads_q = 1, heads_kv = 1;
  int64_t head_dim = kDefaultHeadDim, head_dim_v = kDefaultHeadDim;
  int64_t q_offset = 0, k_offset = 0;
};

// The softmax scale of a call: the pattern's `scale`, or 1/sqrt(head_dim).
double softmax_scale(const Pattern& p, const Shape& s);

// Sizes in [1, kMaxSize], each tensor below 2^62 elements, offsets >= 0 with offset + length <=
// kMaxPosition, heads_kv dividing heads_q; errors name `prefix` + the field and the fix.
void check_shape(const Shape& s, const std::string& prefix);

// Checks what can only be checked once the shape is known (heads in range, enough heads for the
// head groups, one explicit list per head, GQA divisibility, lengths >= 1).
// Throws UserError naming the JSON pointer or the shape field and the fix.
void check_pattern_fits(const Pattern& p, const Shape& s);

// Explicit blocks must lie inside a whole sequence of seq_q queries and seq_k keys. Not part of
// check_pattern_fits: a call may be one chunk of a longer sequence (a ring step), and blocks
// outside the chunk are legitimate there; they simply attend nothing in it.
void check_blocks_inside_sequence(const Pattern& p, int64_t seq_q, int64_t seq_k);

// The canonical text of a pattern: stable across versions of the spec that mean the same thing,
// used by dumps, tests and cache keys. pattern_hash is the first 16 hex digits of its SHA-256.
std::string canonical_text(const Pattern& p);
std::string canonical_layout_text(const Layout& l);  // one layout node as canonical_text prints it
std::string pattern_hash(const Pattern& p);
// The canonical text for people: each list of explicit blocks longer than `max_listed` shows its
// first `max_listed` pairs, then "... N more blocks"; `not_shown` (if given) counts the blocks left
// out. Never hashed or compared: canonical_text is the contract.
std::string canonical_summary(const Pattern& p, size_t max_listed, int64_t* not_shown = nullptr);

const char* to_string(Combine c);
const char* to_string(OffsetRule r);
const char* to_string(Layout::Kind k);

// Builds Patterns from C++ with the same defaults and checks as the JSON parser.
//   Pattern p = PatternBuilder().causal().branch(BranchSpec().segment(2048).dilation(2)).build();
class BranchSpec {
public:
  BranchSpec& segment(int64_t w) { segment_ = w; return *this; }
  BranchSpec& full() { segment_.reset(); return *this; }
  BranchSpec& dilation(int64_t r) { dilation_ = r; return *this; }
  BranchSpec& offset(OffsetRule rule) { offset_ = Offset{rule, 0}; return *this; }
  BranchSpec& offset(int64_t fixed) { offset_ = Offset{OffsetRule::Fixed, fixed}; return *this; }
  BranchSpec& heads(std::vector<int64_t> h) { heads_ = std::move(h); return *this; }
  BranchSpec& causal(bool c = true) { causal_ = c; return *this; }
  BranchSpec& window(int64_t left, int64_t right) { window_ = Window{left, right}; return *this; }
  BranchSpec& layout(Layout l) { layout_ = std::move(l); return *this; }

private:
  friend class PatternBuilder;
  std::optional<int64_t> segment_;
  int64_t dilation_ = 1;
  std::optional<Offset> offset_;
  std::optional<std::vector<int64_t>> heads_;
  std::optional<bool> causal_;
  std::optional<Window> window_;
  std::optional<Layout> layout_;
};

class PatternBuilder {
public:
  PatternBuilder& combine(Combine c) { combine_ = c; return *this; }
  PatternBuilder& group_scale(GroupScale g) { group_scale_ = g; return *this; }
  PatternBuilder& scale(double s) { scale_ = s; return *this; }
  PatternBuilder& causal(bool c = true) { causal_ = c; return *this; }
  PatternBuilder& window(int64_t left, int64_t right) { window_ = Window{left, right}; return *this; }
  PatternBuilder& layout(Layout l) { layout_ = std::move(l); return *this; }
  PatternBuilder& branch(BranchSpec b) { branches_.push_back(std::move(b)); return *this; }
  Pattern build() const;  // validates; throws UserError

private:
  Combine combine_ = Combine::Softmax;
  GroupScale group_scale_ = GroupScale::Mean;
  std::optional<double> scale_;
  bool causal_ = false;
  Window window_;
  std::optional<Layout> layout_;
  std::vector<BranchSpec> branches_;
};

// The blocks of a bitmap: character kb of row qb is '1' (block (qb, kb) kept) or '0'; blocks
// past a row's end are not kept. Any other character is a UserError at `where`/qb naming it.
// Sorted and unique, like explicit blocks.
std::vector<Layout::BlockPair> blocks_from_bitmap(const std::vector<std::string>& rows, const std::string& where);

// Layout constructors for the builder; `block` is (bq, bk).
namespace layouts {
Layout local(int64_t max_block_distance, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
Layout global(std::vector<int64_t> blocks, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
Layout strided(int64_t stride, int64_t phase, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
Layout offsets(std::vector<int64_t> kb_minus_qb, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
// head_base: head h of a call hashes as head_base + h (a call over a slice of the heads).
Layout random(double density, uint64_t seed, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock, int64_t head_base = 0);
Layout explicit_blocks(std::vector<Layout::BlockPair> blocks, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
Layout explicit_per_head(std::vector<std::vector<Layout::BlockPair>> per_head, int64_t bq = kDefaultBlock,
                         int64_t bk = kDefaultBlock);
// Explicit layouts from bitmaps (blocks_from_bitmap): one for every head, or one per query head.
Layout explicit_bitmap(const std::vector<std::string>& rows, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
Layout explicit_per_head_bitmap(const std::vector<std::vector<std::string>>& per_head, int64_t bq = kDefaultBlock,
                                int64_t bk = kDefaultBlock);
// One level of a hierarchical layout: with its blocks (bq, bk), it keeps (qb, kb) iff
// (window < 0 or |kb - qb| <= window) and kb mod stride == 0.
struct HierarchyLevel {
  int64_t window = -1;  // in blocks; -1: unbounded
  int64_t stride = 1;
  int64_t bq = kDefaultBlock, bk = kDefaultBlock;
};
// A pair is kept iff some level keeps it: the union of intersect(local(window), strided(stride, 0))
// per level (strided alone for an unbounded window), each with its level's blocks. UserError on a
// window below -1, a stride below 1 or no levels (`where` names the spec's field).
Layout hierarchical(const std::vector<HierarchyLevel>& levels, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock,
                    const std::string& where = "hierarchical");
Layout union_of(std::vector<Layout> children, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
Layout intersect_of(std::vector<Layout> children, int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
Layout dynamic(int64_t bq = kDefaultBlock, int64_t bk = kDefaultBlock);
}  // namespace layouts

}  // namespace attnjit
#pragma GCC visibility pop
