// The JSON spec format (docs/spec.md) -> UnresolvedPattern -> Pattern.
// This file checks structure (fields, types); value rules live in pattern_validate.cpp so the C++
// builder gets the same checks.
#include "compiler/pattern/spec_json.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "compiler/pattern/pattern_validate.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/nearest.hpp"
#include "compiler/support/read_file.hpp"

namespace attnjit {
namespace {

using json = nlohmann::json;

// A JSON value as an error shows it: at most 80 characters.
std::string shown(const json& j) {
  std::string value = j.dump();  // safe: parse_text() bounds the nesting depth
  if (value.size() > 80) value = value.substr(0, 77) + "...";
  return value;
}

std::string list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

const char* type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unknown value";
  }
}

[[noreturn]] void wrong_type(const json& j, const std::string& path, const std::string& expected) {
  throw UserError(path, "expected " + expected + ", got " + type_name(j) + " (" + shown(j) + ")");
}

// Rejects fields outside `allowed`, naming the nearest valid one (typos are the usual cause).
void check_fields(const json& obj, const std::string& path, const std::vector<std::string>& allowed) {
  if (!obj.is_object()) wrong_type(obj, path.empty() ? "/" : path, "an object");
  for (const auto& [key, value] : obj.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) throw unknown_field(path, key, allowed);
  }
}

int64_t get_int(const json& j, const std::string& path) {
  // Above INT64_MAX nlohmann stores an unsigned value, which get<int64_t>() would wrap to a negative one.
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    throw UserError(path, j.dump() + " is too large; the largest value accepted is " + std::to_string(INT64_MAX));
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  wrong_type(j, path, "an integer");
}

uint64_t get_u64(const json& j, const std::string& path) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) throw UserError(path, "must be >= 0, got " + j.dump());
  wrong_type(j, path, "a non-negative integer");
}

double get_number(const json& j, const std::string& path) {
  if (j.is_number()) return j.get<double>();
  wrong_type(j, path, "a number");
}

bool get_bool(const json& j, const std::string& path) {
  if (j.is_boolean()) return j.get<bool>();
  wrong_type(j, path, "true or false");
}

std::vector<int64_t> get_int_list(const json& j, const std::string& path) {
  if (!j.is_array()) wrong_type(j, path, "an array of integers");
  std::vector<int64_t> out;
  for (size_t n = 0; n < j.size(); ++n) out.push_back(get_int(j[n], path + "/" + std::to_string(n)));
  return out;
}

std::vector<std::string> get_string_list(const json& j, const std::string& path) {
  if (!j.is_array()) wrong_type(j, path, "an array of strings of '0' and '1' (one per query block)");
  std::vector<std::string> out;
  for (size_t n = 0; n < j.size(); ++n) {
    if (!j[n].is_string()) wrong_type(j[n], path + "/" + std::to_string(n), "a string of '0' and '1' (one per key block)");
    out.push_back(j[n].get<std::string>());
  }
  return out;
}

Window get_window(const json& j, const std::string& path) {
  if (!j.is_array() || j.size() != 2) wrong_type(j, path, "[left, right] (two integers, -1 = unbounded)");
  return Window{get_int(j[0], path + "/0"), get_int(j[1], path + "/1")};
}

std::vector<Layout::BlockPair> get_pairs(const json& j, const std::string& path) {
  if (!j.is_array()) wrong_type(j, path, "an array of [query_block, key_block] pairs");
  std::vector<Layout::BlockPair> out;
  for (size_t n = 0; n < j.size(); ++n) {
    const std::string p = path + "/" + std::to_string(n);
    if (!j[n].is_array() || j[n].size() != 2) wrong_type(j[n], p, "a [query_block, key_block] pair");
    out.emplace_back(get_int(j[n][0], p + "/0"), get_int(j[n][1], p + "/1"));
  }
  return out;
}

// The blocks an explicit layout's field lists, counted without storing them: `depth` 1 for a list
// for every head, 2 for a list per head; a bitmap's '1' characters, or a list's entries. Values of
// the wrong type count nothing here (they are reported when the field is read).
uint64_t count_listed_blocks(const json& j, int depth, bool bitmap) {
  if (!j.is_array()) return 0;
  uint64_t n = 0;
  if (depth > 1) {
    for (const json& h : j) n += count_listed_blocks(h, depth - 1, bitmap);
    return n;
  }
  if (!bitmap) return j.size();
  for (const json& row : j)
    if (row.is_string()) {
      const std::string& text = row.get_ref<const std::string&>();
      n += static_cast<uint64_t>(std::count(text.begin(), text.end(), '1'));
    }
  return n;
}

const std::vector<std::string> kGenerators = {"local", "global", "strided", "offsets", "random",
                                              "explicit", "union", "intersect", "dynamic", "hierarchical"};

// A layout's "block": an integer (square blocks) or [query_block, key_block].
std::pair<int64_t, int64_t> get_block(const json& b, const std::string& path) {
  if (b.is_array() && b.size() == 2) return {get_int(b[0], path + "/0"), get_int(b[1], path + "/1")};
  if (b.is_number_integer()) return {get_int(b, path), get_int(b, path)};
  wrong_type(b, path, "an integer or [query_block, key_block]");
}

Layout parse_layout(const json& j, const std::string& path, std::pair<int64_t, int64_t> inherited_block) {
  std::vector<std::string> allowed = kGenerators;
  allowed.insert(allowed.begin(), "block");
  check_fields(j, path, allowed);
  Layout l;
  l.path = path;
  std::tie(l.bq, l.bk) = inherited_block;
  if (j.contains("block")) std::tie(l.bq, l.bk) = get_block(j["block"], path + "/block");
  std::vector<std::string> present;
  for (const auto& g : kGenerators)
    if (j.contains(g)) present.push_back(g);
  if (present.empty()) throw UserError(path, "a layout needs one generator: " + list(kGenerators));
  if (present.size() > 1) {
    throw UserError(path, "has both \"" + present[0] + "\" and \"" + present[1] +
                              "\"; a layout has exactly one generator, combine several with \"union\" or \"intersect\"");
  }
  const std::string& g = present[0];
  const std::string gp = path + "/" + g;
  const json& v = j[g];
  if (g == "local") {
    l.kind = Layout::Kind::Local;
    l.local = get_int(v, gp);
  } else if (g == "global" || g == "offsets") {
    l.kind = g == "global" ? Layout::Kind::Global : Layout::Kind::Offsets;
    l.blocks = get_int_list(v, gp);
  } else if (g == "strided") {
    l.kind = Layout::Kind::Strided;
    check_fields(v, gp, {"stride", "phase"});
    if (!v.contains("stride")) throw UserError(gp, "needs \"stride\" (key block kb is kept iff kb % stride == phase)");
    l.stride = get_int(v["stride"], gp + "/stride");
    if (v.contains("phase")) l.phase = get_int(v["phase"], gp + "/phase");
  } else if (g == "random") {
    l.kind = Layout::Kind::Random;
    check_fields(v, gp, {"density", "seed", "head_base"});
    if (!v.contains("density")) throw UserError(gp, "needs \"density\" (the fraction of blocks kept, in [0, 1])");
    l.density = get_number(v["density"], gp + "/density");
    if (v.contains("seed")) l.seed = get_u64(v["seed"], gp + "/seed");
    if (v.contains("head_base")) l.head_base = get_int(v["head_base"], gp + "/head_base");
  } else if (g == "explicit") {
    l.kind = Layout::Kind::Explicit;
    check_fields(v, gp, {"blocks", "per_head", "bitmap", "per_head_bitmap"});
    const int given = int(v.contains("blocks")) + int(v.contains("per_head")) + int(v.contains("bitmap")) +
                      int(v.contains("per_head_bitmap"));
    if (given != 1) {
      throw UserError(gp, "give exactly one of \"blocks\" (for every head), \"per_head\" (a list per query head), "
                          "\"bitmap\" (rows of '0'/'1', for every head) or \"per_head_bitmap\" (a bitmap per query head)");
    }
    // The blocks are counted before any is stored: a spec may list millions.
    const std::string field = v.contains("bitmap") ? "bitmap" : v.contains("per_head_bitmap") ? "per_head_bitmap"
                              : v.contains("blocks")   ? "blocks" : "per_head";
    check_explicit_block_count(count_listed_blocks(v[field], field == "bitmap" || field == "blocks" ? 1 : 2,
                                                   field == "bitmap" || field == "per_head_bitmap"),
                               gp + "/" + field);
    if (v.contains("bitmap")) {
      l.explicit_blocks = blocks_from_bitmap(get_string_list(v["bitmap"], gp + "/bitmap"), gp + "/bitmap");
      l.from_bitmap = true;
    } else if (v.contains("per_head_bitmap")) {
      const json& ph = v["per_head_bitmap"];
      const std::string pp = gp + "/per_head_bitmap";
      if (!ph.is_array()) wrong_type(ph, pp, "an array with one bitmap (an array of strings) per query head");
      for (size_t h = 0; h < ph.size(); ++h) {
        const std::string hp = pp + "/" + std::to_string(h);
        l.per_head.push_back(blocks_from_bitmap(get_string_list(ph[h], hp), hp));
      }
      if (l.per_head.empty()) throw UserError(pp, "needs one bitmap per query head");
      l.from_bitmap = true;
    } else if (v.contains("blocks")) {
      l.explicit_blocks = get_pairs(v["blocks"], gp + "/blocks");
    } else {
      const json& ph = v["per_head"];
      if (!ph.is_array()) wrong_type(ph, gp + "/per_head", "an array with one list of pairs per query head");
      for (size_t h = 0; h < ph.size(); ++h) l.per_head.push_back(get_pairs(ph[h], gp + "/per_head/" + std::to_string(h)));
      if (l.per_head.empty()) throw UserError(gp + "/per_head", "needs one list of blocks per query head");
    }
  } else if (g == "union" || g == "intersect") {
    l.kind = g == "union" ? Layout::Kind::Union : Layout::Kind::Intersect;
    if (!v.is_array()) wrong_type(v, gp, "an array of layouts");
    for (size_t n = 0; n < v.size(); ++n) l.children.push_back(parse_layout(v[n], gp + "/" + std::to_string(n), {l.bq, l.bk}));
  } else if (g == "hierarchical") {
    if (!v.is_array()) wrong_type(v, gp, "an array of levels {\"window\": w, \"stride\": s, \"block\": b}");
    std::vector<layouts::HierarchyLevel> levels;
    for (size_t n = 0; n < v.size(); ++n) {
      const json& lv = v[n];
      const std::string lp = gp + "/" + std::to_string(n);
      check_fields(lv, lp, {"window", "stride", "block"});
      layouts::HierarchyLevel h;
      h.bq = l.bq, h.bk = l.bk;  // default: the layout's block
      if (lv.contains("window")) h.window = get_int(lv["window"], lp + "/window");
      if (lv.contains("stride")) h.stride = get_int(lv["stride"], lp + "/stride");
      if (lv.contains("block")) std::tie(h.bq, h.bk) = get_block(lv["block"], lp + "/block");
      levels.push_back(h);
    }
    const std::string keep_path = l.path;
    l = layouts::hierarchical(levels, l.bq, l.bk, gp);
    l.path = keep_path;
  } else {  // dynamic
    l.kind = Layout::Kind::Dynamic;
    if (!get_bool(v, gp)) throw UserError(gp, "must be true (the layout is supplied at run time); remove the layout for none");
  }
  return l;
}

Offset parse_offset(const json& j, const std::string& path) {
  if (j.is_number_integer()) return Offset{OffsetRule::Fixed, j.get<int64_t>()};
  if (!j.is_string()) wrong_type(j, path, "\"head_mod\", \"head_block\", \"torchscale\", \"group\" or an integer");
  const std::string s = j.get<std::string>();
  if (s == "head_mod") return Offset{OffsetRule::HeadMod, 0};
  if (s == "head_block") return Offset{OffsetRule::HeadBlock, 0};
  if (s == "torchscale") return Offset{OffsetRule::Torchscale, 0};
  if (s == "group") return Offset{OffsetRule::Group, 0};
  throw UserError(path, "unknown offset rule \"" + printable(s) + "\"" +
                            did_you_mean(s, {"head_mod", "head_block", "torchscale", "group"}) +
                            " (valid: head_mod, head_block, torchscale, group, or an integer in [0, dilation))");
}

UnresolvedBranch parse_branch(const json& j, const std::string& path) {
  check_fields(j, path, {"segment", "dilation", "offset", "heads", "causal", "window", "layout"});
  UnresolvedBranch b;
  if (!j.contains("segment")) throw UserError(path, "needs \"segment\": a positive integer or \"full\"");
  const json& seg = j["segment"];
  if (seg.is_string()) {
    if (seg.get<std::string>() != "full") throw UserError(path + "/segment", "expected a positive integer or \"full\", got " + shown(seg));
  } else {
    b.segment = get_int(seg, path + "/segment");
  }
  if (j.contains("dilation")) b.dilation = get_int(j["dilation"], path + "/dilation");
  if (j.contains("offset")) b.offset = parse_offset(j["offset"], path + "/offset");
  if (j.contains("heads")) b.heads = get_int_list(j["heads"], path + "/heads");
  if (j.contains("causal")) b.causal = get_bool(j["causal"], path + "/causal");
  if (j.contains("window")) b.window = get_window(j["window"], path + "/window");
  if (j.contains("layout")) b.layout = parse_layout(j["layout"], path + "/layout", {kDefaultBlock, kDefaultBlock});
  return b;
}

// Rejects a field given twice in one object: nlohmann keeps the last one silently, which hides
// copy-paste and merge mistakes. Tracks the JSON pointer of the current value for the message.
// Also bounds the nesting depth: dump(), the layout parser and the printers recurse, and a
// pathological spec ([[[[...]]]] 100000 deep) would otherwise overflow the stack.
class DuplicateKeyCheck {
public:
  static constexpr int kMaxDepth = 200;

  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if (event == E::object_start || event == E::array_start || event == E::value) {
      if (!stack_.empty() && !stack_.back().object) ++stack_.back().index;
    }
    if (depth > kMaxDepth) {
      throw UserError(pointer(), "nests deeper than " + std::to_string(kMaxDepth) +
                                     " levels; no spec needs that, check how it was generated");
    }
    if (event == E::object_start || event == E::array_start) stack_.push_back(Frame{event == E::object_start, {}, {}, 0});
    if (event == E::object_end || event == E::array_end) stack_.pop_back();
    if (event == E::key) {
      Frame& f = stack_.back();
      f.key = parsed.get<std::string>();
      if (!f.keys.insert(f.key).second) {
        throw UserError(pointer(), "field \"" + printable(f.key) + "\" is given twice in the same object; keep one "
                                   "(JSON readers disagree on which one wins)");
      }
    }
    return true;
  }

  // The pointer of the value being read when the parser stopped inside it (a number too large,
  // say): as pointer(), but the element an array was about to start counts too.
  std::string pending_pointer() const {
    std::string p;
    for (size_t n = 0; n < stack_.size(); ++n) {
      const Frame& f = stack_[n];
      const bool last = n + 1 == stack_.size();
      p += "/" + (f.object ? printable(f.key) : std::to_string(last ? f.index : f.index - 1));
    }
    return p;
  }

private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;    // objects: the current field
    size_t index = 0;   // arrays: the number of elements started
  };
  std::string pointer() const {
    std::string p;
    for (const Frame& f : stack_) p += "/" + (f.object ? printable(f.key) : std::to_string(f.index - 1));
    return p;
  }
  std::vector<Frame> stack_;
};

// nlohmann's message without its "[json.exception.parse_error.101] " prefix, and the input it quotes
// ("last read: '<text>'", "number overflow parsing '<text>'") cut short: it may be 100,000 digits.
std::string json_message(const json::exception& e) {
  std::string msg = e.what();
  const size_t close = msg.find("] ");
  if (close != std::string::npos) msg = msg.substr(close + 2);
  const size_t open = msg.find('\''), end = msg.rfind('\'');
  if (open != std::string::npos && end > open) {
    msg = msg.substr(0, open + 1) + printable(msg.substr(open + 1, end - open - 1)) + msg.substr(end);
  }
  return msg;
}

json parse_text(const std::string& text, const std::string& source) {
  // nlohmann's reader takes a NUL byte for the end of its input and ignores the rest.
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    throw UserError(source, "a NUL byte (0x00) at offset " + std::to_string(nul) +
                                "; JSON text has none, so this is not a spec (a binary file, or one cut short and padded)");
  }
  DuplicateKeyCheck check;  // by reference: after a failure it knows where the parser was
  try {
    return json::parse(text, std::ref(check));
  } catch (const json::parse_error& e) {
    throw UserError(source, "invalid JSON: " + json_message(e));
  } catch (const json::exception& e) {
    // A number past a double's range (out_of_range.406, "1e309"): no line and column, so the field.
    const std::string where = check.pending_pointer();
    throw UserError(source, "invalid JSON: " + json_message(e) + (where.empty() ? "" : " at " + where) +
                                "; use a number of magnitude below 1.8e308");
  }
}

}  // namespace

Pattern parse_spec(const std::string& text, const std::string& source) {
  const json j = parse_text(text, source);
  check_fields(j, "", {"attnjit", "description", "combine", "group_scale", "causal", "window", "scale", "layout", "branches"});
  if (!j.contains("attnjit")) throw UserError("/attnjit", "missing; add \"attnjit\": 1 (the spec format version)");
  if (!j["attnjit"].is_number_integer()) wrong_type(j["attnjit"], "/attnjit", "the integer " + std::to_string(kSpecVersion));
  if (j["attnjit"].get<int64_t>() != kSpecVersion) {
    throw UserError("/attnjit", "unsupported spec version " + j["attnjit"].dump() + "; this attnjit reads version " +
                                    std::to_string(kSpecVersion));
  }
  UnresolvedPattern u;
  if (j.contains("description") && !j["description"].is_string()) wrong_type(j["description"], "/description", "a string");
  if (j.contains("combine")) {
    const json& c = j["combine"];
    if (!c.is_string()) wrong_type(c, "/combine", "\"softmax\" or \"head_groups\"");
    const std::string s = c.get<std::string>();
    if (s == "softmax") u.combine = Combine::Softmax;
    else if (s == "head_groups") u.combine = Combine::HeadGroups;
    else
      throw UserError("/combine", "unknown combine rule \"" + printable(s) + "\"" + did_you_mean(s, {"softmax", "head_groups"}) +
                                      " (valid: softmax, head_groups)");
  }
  if (j.contains("group_scale")) {
    const json& g = j["group_scale"];
    if (!g.is_string() || (g != "mean" && g != "none")) wrong_type(g, "/group_scale", "\"mean\" or \"none\"");
    u.group_scale = g == "mean" ? GroupScale::Mean : GroupScale::None;
    if (u.combine != Combine::HeadGroups) {
      throw UserError("/group_scale", "applies only with \"combine\": \"head_groups\" (it scales the sum of the "
                                      "groups); remove it, or set combine to head_groups");
    }
  }
  if (j.contains("causal")) u.causal = get_bool(j["causal"], "/causal");
  if (j.contains("window")) u.window = get_window(j["window"], "/window");
  if (j.contains("scale")) u.scale = get_number(j["scale"], "/scale");
  if (j.contains("layout")) u.layout = parse_layout(j["layout"], "/layout", {kDefaultBlock, kDefaultBlock});
  if (!j.contains("branches")) throw UserError("/branches", "missing; add e.g. \"branches\": [{\"segment\": \"full\"}]");
  const json& br = j["branches"];
  if (!br.is_array()) wrong_type(br, "/branches", "an array of branches");
  for (size_t n = 0; n < br.size(); ++n) u.branches.push_back(parse_branch(br[n], "/branches/" + std::to_string(n)));
  return resolve_and_validate(std::move(u));
}

namespace {

json layout_json(const Layout& l) {
  json j;
  j["block"] = json::array({l.bq, l.bk});
  auto pairs = [](const std::vector<Layout::BlockPair>& v) {
    json a = json::array();
    for (const auto& [qb, kb] : v) a.push_back(json::array({qb, kb}));
    return a;
  };
  switch (l.kind) {
    case Layout::Kind::Local: j["local"] = l.local; break;
    case Layout::Kind::Global: j["global"] = l.blocks; break;
    case Layout::Kind::Offsets: j["offsets"] = l.blocks; break;
    case Layout::Kind::Strided: j["strided"] = {{"stride", l.stride}, {"phase", l.phase}}; break;
    case Layout::Kind::Random:
      j["random"] = {{"density", l.density}, {"seed", l.seed}};
      if (l.head_base) j["random"]["head_base"] = l.head_base;
      break;
    case Layout::Kind::Explicit:
      if (l.per_head.empty()) {
        j["explicit"] = {{"blocks", pairs(l.explicit_blocks)}};
      } else {
        json ph = json::array();
        for (const auto& h : l.per_head) ph.push_back(pairs(h));
        j["explicit"] = {{"per_head", ph}};
      }
      break;
    case Layout::Kind::Union:
    case Layout::Kind::Intersect: {
      json c = json::array();
      for (const Layout& child : l.children) c.push_back(layout_json(child));
      j[l.kind == Layout::Kind::Union ? "union" : "intersect"] = c;
      break;
    }
    case Layout::Kind::Dynamic: j["dynamic"] = true; break;
  }
  return j;
}

}  // namespace

std::string spec_json_text(const Pattern& p) {
  json j;
  j["attnjit"] = kSpecVersion;
  j["combine"] = p.combine == Combine::Softmax ? "softmax" : "head_groups";
  if (p.combine == Combine::HeadGroups) j["group_scale"] = p.group_scale == GroupScale::Mean ? "mean" : "none";
  if (p.scale) j["scale"] = *p.scale;
  json branches = json::array();
  for (const Branch& b : p.branches) {
    json br;
    br["segment"] = b.segment ? json(*b.segment) : json("full");
    br["dilation"] = b.dilation;
    // Under head_groups a "group" offset is resolved to the branch index mod r when the pattern is
    // built, so every offset is written as the rule or the integer it is.
    br["offset"] = b.offset.rule == OffsetRule::Fixed ? json(b.offset.value) : json(to_string(b.offset.rule));
    if (b.heads) br["heads"] = *b.heads;
    br["causal"] = b.causal;
    br["window"] = json::array({b.window.left, b.window.right});
    if (b.layout) br["layout"] = layout_json(*b.layout);
    branches.push_back(br);
  }
  j["branches"] = branches;
  return j.dump();
}

Pattern load_spec_file(const std::string& path) {
  const std::string text = read_small_file(path, "spec file");
  try {
    return parse_spec(text, path);
  } catch (const UserError& e) {
    if (e.where() == path) throw;
    throw UserError(path + ": " + e.where(), e.message());
  }
}

}  // namespace attnjit
