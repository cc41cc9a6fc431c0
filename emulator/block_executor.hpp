// One thread block of an emulated launch: a fiber per GPU thread, a scheduler that runs each fiber
// until it blocks, block barriers, warp-collective instructions (the 32 lanes rendezvous and the
// last to arrive executes the instruction for all; the 128 of a warpgroup for wgmma), per-thread
// cp.async and wgmma groups, mbarriers and TMA loads (emulator/tma.cpp), and the checks the
// hardware does not make: bounds of every global and shared access, races on shared memory, a
// barrier or a collective that not every thread reaches, runaway blocks.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <unordered_map>
#include <string>
#include <vector>

#include "emulator/bank_profile.hpp"
#include "emulator/fiber.hpp"
#include "emulator/tensor_map.hpp"

namespace attnjit::emu {

// A global-memory buffer a launch may touch (`name` appears in reports).
struct GlobalBuffer {
  std::string name;
  const void* data = nullptr;
  size_t bytes = 0;
  int elem_bytes = 1;
  bool writable = false;
};

// Address ranges any thread may read without being a buffer (the kernel's own object file).
struct ReadOnlyRange {
  uintptr_t lo = 0, hi = 0;
};

// One wgmma.mma_async of a warpgroup, from its issue to the wait_group of each of its threads:
// the results wait there (the accumulators read as NaN meanwhile), and the shared memory it read
// must not change before then.
struct WgmmaOp {
  const void* pc = nullptr;
  int n = 0;
  std::vector<float> d;               // [64][n] results
  float* dst[128] = {};               // each thread's accumulator registers
  const unsigned* a[128] = {};        // each thread's A registers (A from registers), and their values
  uint32_t a_values[128][4] = {};
  std::vector<uint32_t> read_addrs;   // the operand elements read, by shared-window address
  std::vector<uint16_t> read_values;  // and their values at issue
  int elem_bytes = 2;                 // 2, or 1 for e4m3 operands
  int waiting = 128;                  // threads that have not waited for it yet
};

// An mbarrier object in shared memory (PTX ISA "Parallel Synchronization and Communication
// Instructions: mbarrier"): the arrivals a phase expects, those still pending, the transaction
// count, and how many phases have completed.
struct Mbarrier {
  size_t off = 0;
  int count = 0, pending = 0;
  int64_t tx = 0;
  uint32_t completed = 0;
  uint32_t init_epoch = 0;
  int init_tid = 0;
  const void* init_pc = nullptr;
};

// One cp.async.bulk.tensor load: issued at once, landed (its bytes written, its transaction bytes
// completed on its mbarrier) as late as possible: when no thread of the block can go on without
// it. Its bytes are visible to a thread once the thread has observed the completion of the phase
// it landed in.
struct TmaOp {
  int bar = 0;
  const void* pc = nullptr;
  int tid = 0;
  bool landed = false;
  uint32_t phase = 0;  // the mbarrier phase it completed in, once landed
  uint64_t bytes = 0;
  std::vector<uint32_t> dst;   // shared offset of every element
  std::vector<uint8_t> data;   // the elements, element_bytes each
  int element_bytes = 0;
};

struct BlockLaunch {
  unsigned grid[3] = {1, 1, 1};
  unsigned block_threads = 1;
  size_t dynamic_shared = 0;
  void (*entry)(void**) = nullptr;  // the kernel's aj_emu_entry_<name>
  void** args = nullptr;
  std::vector<GlobalBuffer> buffers;
  std::vector<ReadOnlyRange> readable;
  uint64_t seed = 0;          // 0: threads run in index order; else shuffled between barriers
  double timeout_s = 600;     // per block
  std::function<std::string(const void* pc)> symbolize;  // "file:line (function)" of a code address
};

class BlockExecutor {
public:
  explicit BlockExecutor(const BlockLaunch& launch);
  ~BlockExecutor();
  BlockExecutor(const BlockExecutor&) = delete;
  BlockExecutor& operator=(const BlockExecutor&) = delete;

  // Runs block (x, y, z) to its end. Returns the first error found, empty when none.
  std::string run(unsigned x, unsigned y, unsigned z);

  // ---- what the kernel calls (emulator/emu_api.cpp), always on one of this block's fibers ----
  static BlockExecutor* current();
  void access(const void* addr, size_t bytes, bool write, const void* pc);
  // An 8- or 16-byte load or store as one access: its address must be aligned to its size.
  void vector_access(const void* addr, size_t bytes, bool write, const void* pc);
  unsigned thread_idx(int dim) const;
  unsigned block_idx(int dim) const { return block_[dim]; }
  unsigned grid_dim(int dim) const { return launch_.grid[dim]; }
  void syncthreads(const void* pc);
  // bar.sync (wait) / bar.arrive id, count: barrier `id` (1..15) completes when `count` threads
  // have arrived; the threads that sync wait for it.
  void named_barrier(int id, int count, bool wait, const void* pc);
  // __syncwarp(): the warp's 32 lanes meet (a warp collective), then a new barrier interval.
  void warp_sync(const void* pc);
  unsigned shfl_xor(unsigned value, int lane_mask, const void* pc);
  void* dynamic_shared();
  void* static_shared(const void* key, size_t bytes, size_t align, const void* pc);
  void cp_async(void* smem, const void* gmem, unsigned cp_size, unsigned src_size, const void* pc);
  void cp_async_commit(const void* pc);
  void cp_async_wait(int n, const void* pc);
  void ldmatrix(unsigned* regs, const void* smem, int num, int trans, const void* pc);
  void stmatrix(const unsigned* regs, void* smem, int num, int trans, const void* pc);
  void mma_sync(float* d, const unsigned* a, const unsigned* b, int type, const void* pc);
  void red_add_f32(float* addr, float value, const void* pc);
  void red_add_u32(unsigned* addr, unsigned value, const void* pc);
  void red_add_f32x2(float* addr, float a, float b, const void* pc);
  // cp.reduce.async.bulk ... .add.f32 and its bulk groups (emulator/block_executor.cpp): the adds
  // land when the issuing thread waits for the group; its source must not change before then.
  void bulk_reduce_add_f32(float* dst, const void* src, unsigned bytes, const void* pc);
  void bulk_commit(const void* pc);
  void bulk_wait(int n, bool read, const void* pc);
  // sm_90a (emulator/wgmma.cpp)
  unsigned smem_addr(const void* p);
  void wgmma(float* d, int n, const unsigned* a_regs, uint64_t a_desc, uint64_t b_desc, int type, int flags,
             const void* pc);
  void wgmma_fence(const void* pc);
  void wgmma_commit(const void* pc);
  void wgmma_wait(int n, const void* pc);
  void fence_proxy_async(const void* pc);
  // sm_90: mbarrier and TMA (emulator/tma.cpp)
  void mbarrier_init(void* bar, unsigned count, const void* pc);
  uint64_t mbarrier_arrive(void* bar, unsigned expect_tx, int arrive, const void* pc);
  void mbarrier_wait(void* bar, unsigned parity, const void* pc);
  bool mbarrier_test(void* bar, unsigned parity, const void* pc);
  void tma_load(void* dst, const void* tensor_map, const int* coords, int rank, void* bar, const void* pc);
  // cp.async.bulk.tensor ... global.shared::cta ... bulk_group: a bulk group's copy, which lands
  // (and must find its source unchanged) when the issuing thread waits for the group.
  void tma_store(const void* tensor_map, const int* coords, int rank, const void* src, const void* pc);

private:
  // A TMA instruction's map, decoded and checked against its rank, and its shared box (`role`:
  // destination or source) checked for size, alignment and swizzle; the box's offset in *off.
  TensorMapSpec tma_box(const void* tensor_map, int rank, const void* smem, const std::string& what, const char* role, size_t* off,
                        const void* pc);
  enum class State : uint8_t { Ready, Running, AtBarrier, AtCollective, AtMbarrier, AtNamedBarrier, AtWgmmaWait, Done, Aborted };
  enum class Op : uint8_t { None, Shfl, Ldmatrix, Stmatrix, Mma, Wgmma, WarpSync };
  struct PendingCopy {
    uint8_t* dst;
    unsigned bytes;
    const void* pc;
    uint8_t data[16];
  };
  struct BulkReduce {  // one cp.reduce.async.bulk (or, with `to`, one TMA store) in flight
    float* dst;
    size_t src;  // shared offset
    std::vector<uint8_t> bytes;  // the source as issued (a store: its elements in box order)
    const void* pc;
    // A TMA store: each element's shared offset and global destination (null: outside the tensor).
    std::vector<uint32_t> from;
    std::vector<uint8_t*> to;
    int element_bytes = 0;
  };
  void land_bulk_group(const std::vector<BulkReduce>& group);  // a bulk group's global writes
  struct Thread {
    int tid = 0;
    State state = State::Ready;
    FiberContext ctx = nullptr;
    const void* wait_pc = nullptr;
    // cp.async: the open group and the committed ones, oldest first
    std::vector<PendingCopy> open;
    std::deque<std::vector<PendingCopy>> committed;
    // bulk asynchronous reductions: the open group and the committed ones, oldest first
    std::vector<BulkReduce> bulk_open;
    std::deque<std::vector<BulkReduce>> bulk_committed;
    // groups whose sources are read (a .read wait) but whose global writes have not landed: they
    // land at a full wait that covers them, or when the thread exits (the kernel's end)
    std::deque<std::vector<BulkReduce>> bulk_landing;
    // operands of the collective this thread waits at
    Op op = Op::None;
    unsigned value = 0, result = 0;
    int lane_mask = 0, num = 0, trans = 0, type = 0;
    const void* addr = nullptr;
    unsigned* regs = nullptr;
    const unsigned* a = nullptr;
    const unsigned* b = nullptr;
    float* d = nullptr;
    // wgmma: the operands of the one this thread waits at, whether a wgmma.fence came since the
    // last wait (or the start), and this thread's wgmmas not yet waited for (open, then committed
    // groups, oldest first)
    uint64_t desc_a = 0, desc_b = 0;
    int flags = 0;
    bool wgmma_fenced = false;
    std::vector<std::shared_ptr<WgmmaOp>> wg_open;
    std::deque<std::vector<std::shared_ptr<WgmmaOp>>> wg_committed;
    uint32_t proxy_fences = 0;  // fence.proxy.async executed by this thread, this block
    // mbarriers: the phases of each this thread has observed complete (its own wait, or a
    // barrier after another thread's), and the one it waits at
    std::vector<uint32_t> observed;
    int wait_bar = -1;
    unsigned wait_parity = 0;
    // the bank profile: the warp-wide synchronisations this thread has passed (collectives,
    // barriers: every lane of a warp passes the same ones), and per shared access the epoch it
    // last ran in and how often it ran there; the n-th execution in an epoch meets its warp's other
    // lanes' n-th (lanes that skip an access in divergent code are simply absent)
    uint32_t sync_epoch = 0;
    std::unordered_map<const void*, std::pair<uint32_t, uint32_t>> bank_seen;
  };
  struct Shadow {  // per byte of shared memory: last writer and reader within a barrier interval
    uint32_t write_epoch = 0, read_epoch = 0;
    uint16_t writer = 0, reader = 0;
    const void* write_pc = nullptr;
    const void* read_pc = nullptr;
    uint32_t write_fence = 0;  // the writer's proxy_fences when it wrote
    uint32_t tma = 0;          // 1 + the TmaOp that last wrote it (0: none since a thread's write)
    bool mbarrier = false;     // part of an initialised mbarrier
  };
  static constexpr uint16_t kManyReaders = 0xffff;
  static constexpr size_t kStaticSharedBytes = 48 * 1024;

  static void fiber_main(void* thread);
  [[noreturn]] void fail(std::string message);
  void tick();
  void block_until_released(Thread& t);
  void arrive_collective(Thread& t, Op op, const void* pc);
  void execute_collective(int warp);
  void arrive_warpgroup(Thread& t, const void* pc);
  void execute_wgmma(int warpgroup);
  void finish_wgmma(Thread& t, WgmmaOp& op);
  // One 16-bit operand element of `op` through its descriptor (`d`, decoded from `desc`): checked,
  // recorded for the check at the wait, converted.
  double wgmma_operand(uint64_t desc, const struct WgmmaDesc& d, bool mn_major, int mn, int k, int type, WgmmaOp& op);
  // mbarrier / TMA (emulator/tma.cpp)
  int find_mbarrier(const void* bar, const char* what, const void* pc);
  uint32_t& observed(Thread& t, int bar);
  void complete_phase_if_done(int bar);
  bool land_tma_ops();  // lands every pending load; false when there was none
  void check_tma_visible(size_t off, size_t bytes, const std::vector<uint32_t>& observed, int tid, const void* pc);
  void join_observed();  // a block barrier: every thread has observed what any thread had
  std::string mbarrier_name(int bar) const;
  std::string deadlock_report() const;
  std::string where(const void* pc) const;
  bool same_site(const void* a, const void* b) const;
  std::string who(int tid) const;
  std::string block_name() const;

  // memory checks
  enum class Space { Shared, Global, Private };
  Space classify(const void* addr) const;
  size_t shared_offset(const void* addr, size_t bytes, const char* what, const void* pc);
  void check_global(const void* addr, size_t bytes, bool write, const char* what, const void* pc);
  void shared_read(size_t off, size_t bytes, int tid, const void* pc);
  void shared_write(size_t off, size_t bytes, int tid, const void* pc);
  std::string race_report(const char* kind, size_t off, int tid, const void* pc, int other, const void* other_pc) const;

  // the bank profile (emulator/bank_profile.hpp), while it is on: a lane's access joins its warp
  // instruction's group (its warp, the access, the epoch, the execution in the epoch), which is
  // counted once all 32 lanes are in, or with the lanes that came when the warp next meets at a
  // collective or a barrier (by then every lane has run past it)
  struct BankGroupKey {
    const void* pc;
    uint32_t epoch, n;
    SharedOp op;
    bool operator==(const BankGroupKey& o) const { return pc == o.pc && epoch == o.epoch && n == o.n && op == o.op; }
  };
  struct BankGroupHash {
    size_t operator()(const BankGroupKey& k) const {
      return std::hash<const void*>()(k.pc) ^ (size_t(k.epoch) * 0x9E3779B97F4A7C15ull) ^ (size_t(k.n) << 40) ^ size_t(k.op);
    }
  };
  using BankGroups = std::unordered_map<BankGroupKey, std::vector<LaneAccess>, BankGroupHash>;
  void count_shared(size_t off, size_t bytes, SharedOp op, const void* pc);
  void count_matrix(const uint32_t rows[][8], int num, SharedOp op, const void* pc);
  void bank_sync(Thread& t) { ++t.sync_epoch; }  // t passes a synchronisation its whole warp passes
  void flush_bank_groups(int warp);  // counts the warp's groups, whole or not
  void end_bank_profile();           // the block's counts into the process-wide profile
  bool banks_ = false;
  std::vector<BankGroups> bank_groups_;  // by warp
  std::map<std::pair<const void*, SharedOp>, Wavefronts> bank_counts_;  // this block's, by site

  const BlockLaunch& launch_;
  std::vector<GlobalBuffer> buffers_;  // sorted by address
  unsigned block_[3] = {0, 0, 0};
  std::vector<Thread> threads_;
  FiberStacks stacks_;
  Thread* current_ = nullptr;
  std::vector<int> order_;
  std::mt19937_64 rng_;
  int barrier_arrived_ = 0, done_ = 0;
  std::vector<int> warp_arrived_, warpgroup_arrived_;
  struct NamedBarrier {
    int count = 0, arrived = 0;
  };
  NamedBarrier named_[16];
  uint32_t epoch_ = 0, block_epoch_ = 0;  // block_epoch_: the epoch this block started in
  uint64_t ticks_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::string error_;

  std::vector<uint8_t> arena_;   // dynamic shared memory, then the static region
  size_t static_base_ = 0, static_used_ = 0;
  std::vector<std::pair<const void*, size_t>> static_slots_;  // key -> offset, this block
  std::vector<Shadow> shadow_;
  std::vector<Mbarrier> mbarriers_;
  std::vector<TmaOp> tma_ops_;
  size_t tma_pending_ = 0;  // ops not landed
  int wgmma_waiting_ = 0;   // threads in wgmma.wait_group for a wgmma that has not completed
  // When no thread of the block can go on: completes the wgmmas of the lowest warpgroup that
  // waits (its waiting threads run again; the others' stay in flight); false when none waits.
  bool release_wgmma_waits();
  std::vector<uint32_t> wg_observed_;  // the phases every thread of the wgmma's warpgroup observed
};

}  // namespace attnjit::emu
