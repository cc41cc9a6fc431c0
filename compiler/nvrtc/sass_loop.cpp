#include "compiler/nvrtc/sass_loop.hpp"

#include <map>
#include <regex>
#include <sstream>
#include <vector>

namespace attnjit {
namespace {

struct Instruction {
  std::string op;    // the opcode with its modifiers, without a predicate ("HMMA.16816.F32.BF16")
  std::string text;  // the whole instruction
};

// m16n8k16-equivalents (in multiply-adds) of one MMA per warp: HMMA 1, the FP8 QMMA.16832 2, a
// warpgroup's HGMMA.64xNx16 N / 8 and QGMMA.64xNx32 N / 4.
int mma_weight(const std::string& op) {
  if (op.rfind("HMMA", 0) == 0) return 1;
  if (op.rfind("QMMA.16832", 0) == 0) return 2;
  static const std::regex gmma(R"(^([HQ])GMMA\.64x(\d+)x(16|32))");
  std::smatch m;
  return std::regex_search(op, m, gmma) ? std::stoi(m[2]) / 8 * (m[3] == "32" ? 2 : 1) : 0;
}

bool is_local_access(const std::string& op) {
  const std::string base = op.substr(0, op.find('.'));
  return base == "LDL" || base == "STL";
}

}  // namespace

std::optional<SassLoop> find_main_loop(const std::string& sass) {
  static const std::regex line_re(R"(^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);)");
  static const std::regex label_re(R"(^\s*\.(L_x_\d+):)");
  static const std::regex predicate_re(R"(^@!?U?P\w+\s+)");
  static const std::regex target_re(R"(\.(L_x_\d+))");
  std::vector<Instruction> ins;
  std::map<std::string, size_t> labels;  // label -> index of the instruction after it
  std::istringstream in(sass);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, line_re)) {
      const std::string text = m[2];
      const std::string bare = std::regex_replace(text, predicate_re, "", std::regex_constants::format_first_only);
      ins.push_back({bare.substr(0, bare.find(' ')), text});
    } else if (std::regex_search(line, m, label_re)) {
      labels[m[1]] = ins.size();
    }
  }
  std::optional<SassLoop> best;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].op.rfind("BRA", 0) != 0 || !std::regex_search(ins[i].text, m, target_re)) continue;
    const auto label = labels.find(m[1]);
    if (label == labels.end() || label->second > i) continue;
    SassLoop loop;
    bool exits = false;
    for (size_t k = label->second; k <= i; ++k) {
      exits = exits || ins[k].op == "EXIT";
      loop.hmma += mma_weight(ins[k].op);
      loop.local_accesses += is_local_access(ins[k].op);
    }
    loop.instructions = static_cast<int>(i - label->second + 1);
    if (exits || loop.hmma == 0) continue;
    if (!best || loop.hmma > best->hmma || (loop.hmma == best->hmma && loop.instructions < best->instructions)) best = loop;
  }
  return best;
}

}  // namespace attnjit
