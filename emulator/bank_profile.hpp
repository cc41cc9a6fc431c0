// The shared-memory bank profile: for every instruction of an emulated kernel that touches shared
// memory, how many wavefronts its warp accesses take on the 32 banks of 4 bytes, against the fewest
// their bytes need. A count, not a timing: it shows bank conflicts (and their source lines) on a
// machine without a GPU, where Nsight Compute's l1tex shared-memory wavefront metrics would show
// them on one.
//
// The model (the CUDA C++ Programming Guide's, compute capability 5.x and later): a warp's request
// is served in phases, all 32 lanes for accesses of up to 4 bytes, each half warp for 8 bytes, each
// quarter warp for 16; ldmatrix and stmatrix one 8 x 16-byte matrix a phase (lanes 8j .. 8j + 7
// give matrix j's rows). A phase takes as many wavefronts as the most distinct 4-byte words it
// touches in any one bank (lanes on one word share it: a broadcast). Its ideal is its distinct
// words over 32, rounded up.
//
// What is approximate: the lanes of one warp instruction are matched by the order in which each
// lane executes the instruction (its n-th execution since the warp's last warp-wide
// synchronisation: a collective, wgmma, a barrier), which is exact for the straight-line and
// uniform loops of attention kernels; where the host compiler duplicated the code of an access, its
// lanes are split between the copies and conflicts between them go uncounted (never invented). The
// access widths are those the kernel text asks for (8 and 16 bytes through the building blocks'
// vector loads and stores). TMA and wgmma operand reads are not counted (their swizzles are the
// hardware's own).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnjit::emu {

enum class SharedOp : uint8_t { Load, Store, CpAsync, Ldmatrix, Stmatrix };
const char* to_string(SharedOp op);

struct Wavefronts {
  uint64_t instructions = 0;  // warp instructions
  uint64_t wavefronts = 0;
  uint64_t ideal = 0;
  Wavefronts& operator+=(const Wavefronts& o) {
    instructions += o.instructions, wavefronts += o.wavefronts, ideal += o.ideal;
    return *this;
  }
};

// One lane's part of a warp instruction: `bytes` at shared offset `off`.
struct LaneAccess {
  uint32_t off = 0;
  uint32_t bytes = 0;
  uint8_t lane = 0;
};

// The wavefronts of one warp instruction whose lanes each access their own bytes (loads, stores,
// cp.async): phases by the widest access (up to 4 bytes: one; 8: two half warps; 16 or more: four
// quarter warps).
Wavefronts thread_access_wavefronts(const std::vector<LaneAccess>& lanes);
// The wavefronts of one ldmatrix or stmatrix of `num` matrices: rows[j][r] is the shared offset of
// matrix j's row r (16 bytes).
Wavefronts matrix_wavefronts(const uint32_t rows[][8], int num);

// ---- the process-wide profile -------------------------------------------------------------------

// Off by default; while on, every block an emulated launch runs counts its shared accesses and adds
// them here when it ends. Thread-safe.
void set_bank_profile(bool on);
bool bank_profile_on();
void clear_bank_profile();

// The profile cleared and on for a scope, and off when the scope ends (thrown through or not).
class BankProfileScope {
public:
  BankProfileScope() {
    clear_bank_profile();
    set_bank_profile(true);
  }
  ~BankProfileScope() { set_bank_profile(false); }
  BankProfileScope(const BankProfileScope&) = delete;
  BankProfileScope& operator=(const BankProfileScope&) = delete;
};

struct BankSite {
  std::string where;  // the access's source line, with the lines it was inlined into
  SharedOp op = SharedOp::Load;
  Wavefronts count;
};
// What was counted since the last clear, by site, the most excess wavefronts first.
std::vector<BankSite> bank_profile();
void add_to_bank_profile(const std::vector<BankSite>& sites);

// A table of `sites` (the first `max_rows` by excess, then how many more there are) with the total
// of all of them; "" when there are none.
std::string bank_report(const std::vector<BankSite>& sites, size_t max_rows = 20);

}  // namespace attnjit::emu
