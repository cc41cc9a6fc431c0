// The shared-memory bank model and the process-wide profile (emulator/bank_profile.hpp).
#include "emulator/bank_profile.hpp"

#include <algorithm>
#include <atomic>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

namespace attnjit::emu {

namespace {

constexpr int kBanks = 32;

// One phase's wavefronts and ideal from the 4-byte words its accesses touch (duplicates included:
// a word several lanes share counts once).
Wavefronts phase_wavefronts(std::vector<uint32_t>& words) {
  if (words.empty()) return {};
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  int per_bank[kBanks] = {};
  int most = 0;
  for (uint32_t w : words) most = std::max(most, ++per_bank[w % kBanks]);
  return {0, uint64_t(most), (words.size() + kBanks - 1) / kBanks};
}

void add_words(std::vector<uint32_t>& words, uint32_t off, uint32_t bytes) {
  if (bytes == 0) return;
  for (uint32_t w = off / 4; w <= (off + bytes - 1) / 4; ++w) words.push_back(w);
}

std::atomic<bool> g_on{false};
std::mutex g_mutex;
std::map<std::pair<std::string, SharedOp>, Wavefronts>& sites() {
  static auto* s = new std::map<std::pair<std::string, SharedOp>, Wavefronts>;  // never destroyed
  return *s;
}

}  // namespace

const char* to_string(SharedOp op) {
  switch (op) {
    case SharedOp::Load: return "load";
    case SharedOp::Store: return "store";
    case SharedOp::CpAsync: return "cp.async";
    case SharedOp::Ldmatrix: return "ldmatrix";
    case SharedOp::Stmatrix: return "stmatrix";
  }
  return "?";
}

Wavefronts thread_access_wavefronts(const std::vector<LaneAccess>& lanes) {
  uint32_t widest = 0;
  for (const LaneAccess& a : lanes) widest = std::max(widest, a.bytes);
  const int per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
  Wavefronts out;
  out.instructions = 1;
  for (int first = 0; first < 32; first += per_phase) {
    std::vector<uint32_t> words;
    for (const LaneAccess& a : lanes)
      if (a.lane >= first && a.lane < first + per_phase) add_words(words, a.off, a.bytes);
    out += phase_wavefronts(words);
  }
  return out;
}

Wavefronts matrix_wavefronts(const uint32_t rows[][8], int num) {
  Wavefronts out;
  out.instructions = 1;
  for (int j = 0; j < num; ++j) {
    std::vector<uint32_t> words;
    for (int r = 0; r < 8; ++r) add_words(words, rows[j][r], 16);
    out += phase_wavefronts(words);
  }
  return out;
}

void set_bank_profile(bool on) { g_on = on; }
bool bank_profile_on() { return g_on; }

void clear_bank_profile() {
  std::lock_guard<std::mutex> lock(g_mutex);
  sites().clear();
}

void add_to_bank_profile(const std::vector<BankSite>& add) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const BankSite& s : add) sites()[{s.where, s.op}] += s.count;
}

std::vector<BankSite> bank_profile() {
  std::vector<BankSite> out;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [key, count] : sites()) out.push_back({key.first, key.second, count});
  }
  std::stable_sort(out.begin(), out.end(), [](const BankSite& a, const BankSite& b) {
    return a.count.wavefronts - a.count.ideal > b.count.wavefronts - b.count.ideal;
  });
  return out;
}

std::string bank_report(const std::vector<BankSite>& sites, size_t max_rows) {
  if (sites.empty()) return "";
  Wavefronts total;
  for (const BankSite& s : sites) total += s.count;
  auto ratio = [](const Wavefronts& w) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(2) << (w.ideal ? double(w.wavefronts) / double(w.ideal) : 1.0) << "x";
    return os.str();
  };
  std::ostringstream os;
  os << "shared-memory wavefronts by instruction (32 banks of 4 bytes; ideal: what the bytes need; emulator "
        "count, not a timing)\n";
  os << "  " << std::left << std::setw(9) << "op" << std::right << std::setw(12) << "warp instrs" << std::setw(13)
     << "wavefronts" << std::setw(13) << "ideal" << std::setw(9) << "ratio" << "  where\n";
  auto row = [&](const std::string& op, const Wavefronts& w, const std::string& where) {
    os << "  " << std::left << std::setw(9) << op << std::right << std::setw(12) << w.instructions << std::setw(13)
       << w.wavefronts << std::setw(13) << w.ideal << std::setw(9) << ratio(w) << "  " << where << "\n";
  };
  for (size_t i = 0; i < sites.size() && i < max_rows; ++i) row(to_string(sites[i].op), sites[i].count, sites[i].where);
  if (sites.size() > max_rows) os << "  ... " << sites.size() - max_rows << " more sites\n";
  row("all", total, std::to_string(sites.size()) + " sites");
  return os.str();
}

}  // namespace attnjit::emu
