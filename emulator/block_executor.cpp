// The block executor: scheduling, barriers, warp collectives and cp.async (memory checks live in
// emulator/memory_check.cpp).
#include "emulator/block_executor.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>

#include "compiler/support/error.hpp"
#include "emulator/emu_abi.h"
#include "emulator/ptx_semantics.hpp"

namespace attnjit::emu {
namespace {

thread_local BlockExecutor* tls_current = nullptr;
constexpr size_t kFiberStackBytes = 256 * 1024;

std::string hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

}  // namespace

BlockExecutor* BlockExecutor::current() { return tls_current; }

BlockExecutor::BlockExecutor(const BlockLaunch& launch)
    : launch_(launch),
      buffers_(launch.buffers),
      threads_(launch.block_threads),
      stacks_(launch.block_threads, kFiberStackBytes),
      rng_(launch.seed),
      warp_arrived_((launch.block_threads + 31) / 32, 0),
      warpgroup_arrived_((launch.block_threads + 127) / 128, 0) {
  std::sort(buffers_.begin(), buffers_.end(),
            [](const GlobalBuffer& a, const GlobalBuffer& b) { return a.data < b.data; });
  static_base_ = (launch.dynamic_shared + 127) / 128 * 128;
  arena_.resize(static_base_ + kStaticSharedBytes);
  shadow_.resize(arena_.size());
  for (size_t i = 0; i < threads_.size(); ++i) {
    threads_[i].tid = static_cast<int>(i);
    order_.push_back(static_cast<int>(i));
  }
}

BlockExecutor::~BlockExecutor() = default;

std::string BlockExecutor::block_name() const {
  return "block (" + std::to_string(block_[0]) + "," + std::to_string(block_[1]) + "," + std::to_string(block_[2]) + ")";
}

std::string BlockExecutor::who(int tid) const {
  return "thread " + std::to_string(tid) + " (warp " + std::to_string(tid / 32) + ", lane " + std::to_string(tid % 32) + ")";
}

// One barrier: the same code address, or two copies of one source line and inline chain (the host
// compiler's jump threading may duplicate a block that holds a barrier; a GPU's bar.sync counts
// arrivals, not addresses). Warp collectives compare addresses.
bool BlockExecutor::same_site(const void* a, const void* b) const {
  return a == b || (launch_.symbolize && where(a) == where(b));
}

std::string BlockExecutor::where(const void* pc) const {
  if (!pc) return "?";
  return launch_.symbolize ? launch_.symbolize(pc) : hex(pc);
}

void BlockExecutor::fiber_main(void* arg) {
  Thread& t = *static_cast<Thread*>(arg);
  BlockExecutor& ex = *tls_current;
  ex.launch_.entry(ex.launch_.args);
  if (!t.wg_open.empty() || !t.wg_committed.empty())
    ex.fail(ex.who(t.tid) + " exits with wgmma.mma_async in flight (issued at " +
            ex.where((t.wg_open.empty() ? t.wg_committed.back() : t.wg_open).back()->pc) +
            "): its accumulators are never written; end with wgmma.commit_group and wgmma.wait_group 0");
  if (!t.bulk_open.empty() || !t.bulk_committed.empty())
    ex.fail(ex.who(t.tid) + " exits with a bulk copy (cp.reduce.async.bulk or a TMA store) not waited for (issued at " +
            ex.where((t.bulk_open.empty() ? t.bulk_committed.back() : t.bulk_open).back().pc) +
            "): its shared source may be gone before it is read; commit the group and wait for it (cp.async.bulk.wait_group)");
  // What a .read wait left in flight lands by the kernel's end.
  for (const std::vector<BulkReduce>& group : t.bulk_landing) ex.land_bulk_group(group);
  t.bulk_landing.clear();
  t.state = State::Done;
  ++ex.done_;
  switch_to_scheduler();  // never resumed
  ATTNJIT_CHECK(false, "a finished emulated thread was resumed");
}

std::string BlockExecutor::run(unsigned x, unsigned y, unsigned z) {
  block_[0] = x, block_[1] = y, block_[2] = z;
  tls_current = this;
  error_.clear();
  block_epoch_ = ++epoch_;
  banks_ = bank_profile_on();
  if (banks_) bank_groups_.assign((threads_.size() + 31) / 32, {}), bank_counts_.clear();
  barrier_arrived_ = 0, done_ = 0;
  std::fill(warp_arrived_.begin(), warp_arrived_.end(), 0);
  std::fill(warpgroup_arrived_.begin(), warpgroup_arrived_.end(), 0);
  for (NamedBarrier& b : named_) b = NamedBarrier{};
  // Uninitialised shared memory reads as NaN in every float type, as garbage would on hardware.
  std::memset(arena_.data(), 0xFF, arena_.size());
  static_used_ = 0;
  static_slots_.clear();
  if (!mbarriers_.empty() || !tma_ops_.empty())
    for (Shadow& sh : shadow_) sh.tma = 0, sh.mbarrier = false;
  mbarriers_.clear();
  tma_ops_.clear();
  tma_pending_ = 0;
  wgmma_waiting_ = 0;
  deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                      std::chrono::duration<double>(launch_.timeout_s));
  for (size_t i = 0; i < threads_.size(); ++i) {
    Thread& t = threads_[i];
    t.state = State::Ready;
    t.open.clear();
    t.committed.clear();
    t.op = Op::None;
    t.wgmma_fenced = false;
    t.wg_open.clear();
    t.wg_committed.clear();
    t.bulk_open.clear();
    t.bulk_committed.clear();
    t.bulk_landing.clear();
    t.proxy_fences = 0;
    t.observed.clear();
    t.wait_bar = -1;
    t.bank_seen.clear();
    t.sync_epoch = 0;
    t.ctx = make_fiber(stacks_.top(i), stacks_.usable(), fiber_main);
  }
  const int n = static_cast<int>(threads_.size());
  while (done_ < n) {
    if (launch_.seed) std::shuffle(order_.begin(), order_.end(), rng_);
    bool ran = false;
    for (int tid : order_) {
      Thread& t = threads_[size_t(tid)];
      if (t.state != State::Ready) continue;
      ran = true;
      current_ = &t;
      t.state = State::Running;
      t.ctx = switch_to_fiber(t.ctx, &t);
      current_ = nullptr;
      if (!error_.empty()) break;
    }
    if (!error_.empty()) break;
    // wgmmas complete, then TMA loads land, when nothing else can go on.
    if (!ran && done_ < n && !release_wgmma_waits() && !land_tma_ops()) {
      error_ = deadlock_report();
      break;
    }
  }
  for (int id = 1; id < 16 && error_.empty(); ++id)
    if (named_[id].arrived)
      error_ = block_name() + ": the block ends with " + std::to_string(named_[id].arrived) + " of " + std::to_string(named_[id].count) +
               " threads arrived at named barrier " + std::to_string(id) + ": an arrival no bar.sync matches";
  if (error_.empty() && !tma_ops_.empty()) {
    // Every load must have been waited for: a block that exits with one in flight frees the
    // shared memory it writes.
    join_observed();
    for (const TmaOp& op : tma_ops_)
      if (!op.landed || threads_[0].observed.size() <= size_t(op.bar) || threads_[0].observed[size_t(op.bar)] <= op.phase) {
        error_ = block_name() + ": the block ends with the TMA load issued at " + where(op.pc) + " by " + who(op.tid) +
                 " in flight: no thread waited on " + mbarrier_name(op.bar) + " for the phase it completes";
        break;
      }
  }
  if (banks_ && error_.empty()) end_bank_profile();
  tls_current = nullptr;
  return error_;
}

void BlockExecutor::fail(std::string message) {
  if (error_.empty()) error_ = block_name() + ": " + message;
  current_->state = State::Aborted;
  switch_to_scheduler();
  ATTNJIT_CHECK(false, "an aborted emulated thread was resumed");
}

void BlockExecutor::tick() {
  if ((++ticks_ & 0xffff) == 0 && std::chrono::steady_clock::now() > deadline_) {
    std::ostringstream os;
    os << "ran longer than " << launch_.timeout_s
       << " s (ATTNJIT_EMU_TIMEOUT): a runaway loop? The last thread running was " << who(current_->tid);
    fail(os.str());
  }
}

void BlockExecutor::block_until_released(Thread& t) {
  switch_to_scheduler();
  ATTNJIT_CHECK(t.state == State::Running, "an emulated thread resumed while still blocked");
}

unsigned BlockExecutor::thread_idx(int dim) const { return dim == 0 ? static_cast<unsigned>(current_->tid) : 0u; }

// ---- barriers --------------------------------------------------------------------------------

void BlockExecutor::syncthreads(const void* pc) {
  Thread& t = *current_;
  t.state = State::AtBarrier;
  t.wait_pc = pc;
  if (++barrier_arrived_ < static_cast<int>(threads_.size())) {
    block_until_released(t);
    return;
  }
  for (const Thread& o : threads_)
    if (!same_site(o.wait_pc, pc)) {
      const std::string msg = "threads wait at different __syncthreads(): " + who(o.tid) + " at " + where(o.wait_pc) +
                              ", " + who(t.tid) + " at " + where(pc) + " (a barrier in divergent code)";
      fail(msg);
    }
  barrier_arrived_ = 0;
  ++epoch_;  // a new barrier interval: shared-memory accesses before it no longer race
  if (banks_) {
    for (Thread& o : threads_) bank_sync(o);
    for (size_t w = 0; w < bank_groups_.size(); ++w) flush_bank_groups(int(w));
  }
  join_observed();
  for (Thread& o : threads_) o.state = State::Ready;
  t.state = State::Running;
}

void BlockExecutor::named_barrier(int id, int count, bool wait, const void* pc) {
  tick();
  Thread& t = *current_;
  const char* op = wait ? "bar.sync" : "bar.arrive";
  if (id < 1 || id > 15)
    fail(std::string(op) + " at " + where(pc) + ": barrier " + std::to_string(id) + " is not in 1..15 (0 is __syncthreads())");
  if (count <= 0 || count % 32 || count > static_cast<int>(threads_.size()))
    fail(std::string(op) + " at " + where(pc) + ": thread count " + std::to_string(count) + " is not a multiple of 32 within the block's " +
         std::to_string(threads_.size()));
  NamedBarrier& b = named_[id];
  if (b.arrived > 0 && b.count != count)
    fail(std::string(op) + " " + std::to_string(id) + ", " + std::to_string(count) + " by " + who(t.tid) + " at " + where(pc) +
         ": the barrier's other arrivals this round expect " + std::to_string(b.count) + " threads");
  b.count = count;
  if (banks_) bank_sync(t);
  if (++b.arrived < count) {
    if (!wait) return;
    t.state = State::AtNamedBarrier;
    t.wait_bar = id;
    t.wait_pc = pc;
    block_until_released(t);
    t.wait_bar = -1;
    return;
  }
  // Complete: release the waiters. Accesses before it and after it by the threads it orders no
  // longer race (a new barrier interval for all: lenient for the threads outside it).
  b.arrived = 0;
  ++epoch_;
  for (Thread& o : threads_)
    if (o.state == State::AtNamedBarrier && o.wait_bar == id) o.state = State::Ready;
}

// ---- warp collectives ------------------------------------------------------------------------

void BlockExecutor::arrive_collective(Thread& t, Op op, const void* pc) {
  const int warp = t.tid / 32;
  const int lanes = std::min(32, static_cast<int>(threads_.size()) - warp * 32);
  if (lanes != 32) fail(who(t.tid) + " runs a warp-collective instruction in a warp of " + std::to_string(lanes) + " threads; the block size must be a multiple of 32");
  t.op = op;
  t.wait_pc = pc;
  t.state = State::AtCollective;
  if (banks_) bank_sync(t);
  if (++warp_arrived_[size_t(warp)] < 32) {
    block_until_released(t);
    return;
  }
  warp_arrived_[size_t(warp)] = 0;
  for (int l = 0; l < 32; ++l) {
    const Thread& o = threads_[size_t(warp * 32 + l)];
    if (o.op != op || o.wait_pc != pc) {
      fail("the lanes of warp " + std::to_string(warp) + " are at different warp-collective instructions: " + who(o.tid) +
           " at " + where(o.wait_pc) + ", " + who(t.tid) + " at " + where(pc));
    }
  }
  if (banks_) flush_bank_groups(warp);
  execute_collective(warp);
  for (int l = 0; l < 32; ++l) threads_[size_t(warp * 32 + l)].state = State::Ready;
  t.state = State::Running;
}

void BlockExecutor::execute_collective(int warp) {
  Thread* lane = &threads_[size_t(warp * 32)];
  const Op op = lane[0].op;
  if (op == Op::Shfl) {
    for (int l = 0; l < 32; ++l) lane[l].result = lane[(l ^ lane[l].lane_mask) & 31].value;
  } else if (op == Op::Ldmatrix || op == Op::Stmatrix) {
    // Lanes 8j..8j+7 give the 16-byte rows of matrix j, read (ldmatrix) or written (stmatrix).
    const bool store = op == Op::Stmatrix;
    const char* what = store ? "stmatrix" : "ldmatrix";
    const int num = lane[0].num;
    uint16_t* rows[4][8];
    uint32_t offsets[4][8] = {};
    for (int j = 0; j < num; ++j)
      for (int r = 0; r < 8; ++r) {
        const Thread& src = lane[8 * j + r];
        const void* a = src.addr;
        if (reinterpret_cast<uintptr_t>(a) % 16 != 0) {
          fail(std::string(what) + ": " + who(src.tid) + " gives row address " + hex(a) + " of matrix " + std::to_string(j) +
               ", which is not 16-byte aligned (at " + where(src.wait_pc) + ")");
        }
        const size_t off = shared_offset(a, 16, what, src.wait_pc);
        if (store) shared_write(off, 16, src.tid, src.wait_pc);
        else shared_read(off, 16, src.tid, src.wait_pc);
        rows[j][r] = reinterpret_cast<uint16_t*>(arena_.data() + off);
        offsets[j][r] = uint32_t(off);
      }
    if (banks_) count_matrix(offsets, num, store ? SharedOp::Stmatrix : SharedOp::Ldmatrix, lane[0].wait_pc);
    if (store) {
      uint32_t in[32][4];
      for (int l = 0; l < 32; ++l)
        for (int j = 0; j < num; ++j) in[l][j] = lane[l].a[j];
      attnjit::emu::stmatrix(rows, num, lane[0].trans != 0, in);
    } else {
      const uint16_t* const(*read)[8] = rows;
      uint32_t out[32][4];
      attnjit::emu::ldmatrix(read, num, lane[0].trans != 0, out);
      for (int l = 0; l < 32; ++l)
        for (int j = 0; j < num; ++j) lane[l].regs[j] = out[l][j];
    }
  } else if (op == Op::Mma) {
    uint32_t a[32][4], b[32][2];
    float d[32][4];
    for (int l = 0; l < 32; ++l) {
      if (lane[l].type != lane[0].type) fail("mma: the lanes of warp " + std::to_string(warp) + " disagree on the input type");
      std::memcpy(a[l], lane[l].a, sizeof a[l]);
      std::memcpy(b[l], lane[l].b, sizeof b[l]);
      std::memcpy(d[l], lane[l].d, sizeof d[l]);
    }
    if (lane[0].type == AJ_EMU_E4M3) attnjit::emu::mma_m16n8k32_e4m3(a, b, d);
    else attnjit::emu::mma_m16n8k16(a, b, d, lane[0].type);
    for (int l = 0; l < 32; ++l) std::memcpy(lane[l].d, d[l], sizeof d[l]);
  } else if (op == Op::WarpSync) {
    // Shared-memory accesses of the warp's lanes before and after it no longer race (a new barrier
    // interval for all: lenient for the other warps, as the named barriers are).
    ++epoch_;
  }
  for (int l = 0; l < 32; ++l) lane[l].op = Op::None;
}

void BlockExecutor::warp_sync(const void* pc) {
  tick();
  arrive_collective(*current_, Op::WarpSync, pc);
}

unsigned BlockExecutor::shfl_xor(unsigned value, int lane_mask, const void* pc) {
  tick();
  Thread& t = *current_;
  t.value = value;
  t.lane_mask = lane_mask;
  arrive_collective(t, Op::Shfl, pc);
  return t.result;
}

void BlockExecutor::ldmatrix(unsigned* regs, const void* smem, int num, int trans, const void* pc) {
  tick();
  Thread& t = *current_;
  t.regs = regs;
  t.addr = smem;
  t.num = num;
  t.trans = trans;
  arrive_collective(t, Op::Ldmatrix, pc);
}

void BlockExecutor::stmatrix(const unsigned* regs, void* smem, int num, int trans, const void* pc) {
  tick();
  Thread& t = *current_;
  t.a = regs;  // the lane's registers, read when the warp's last lane arrives
  t.addr = smem;
  t.num = num;
  t.trans = trans;
  arrive_collective(t, Op::Stmatrix, pc);
}

void BlockExecutor::mma_sync(float* d, const unsigned* a, const unsigned* b, int type, const void* pc) {
  tick();
  Thread& t = *current_;
  t.d = d;
  t.a = a;
  t.b = b;
  t.type = type;
  arrive_collective(t, Op::Mma, pc);
}

// ---- global atomics --------------------------------------------------------------------------

void BlockExecutor::red_add_f32(float* addr, float value, const void* pc) {
  tick();
  if (reinterpret_cast<uintptr_t>(addr) % 4) fail("red.global.add.f32 by " + who(current_->tid) + " at an address that is not 4-byte aligned (at " + where(pc) + ")");
  check_global(addr, 4, true, "red.global.add.f32", pc);
  // Blocks run on several OS threads: a real atomic (the workers' FTZ/DAZ flush subnormals, as .f32 red does).
  std::atomic_ref<float>(*addr).fetch_add(value);
}

void BlockExecutor::red_add_u32(unsigned* addr, unsigned value, const void* pc) {
  tick();
  if (reinterpret_cast<uintptr_t>(addr) % 4) fail("red.global.add.u32 by " + who(current_->tid) + " at an address that is not 4-byte aligned (at " + where(pc) + ")");
  check_global(addr, 4, true, "red.global.add.u32", pc);
  std::atomic_ref<unsigned>(*addr).fetch_add(value);
}

void BlockExecutor::red_add_f32x2(float* addr, float a, float b, const void* pc) {
  tick();
  if (reinterpret_cast<uintptr_t>(addr) % 8) fail("red.global.add.v2.f32 by " + who(current_->tid) + " at an address that is not 8-byte aligned (at " + where(pc) + ")");
  check_global(addr, 8, true, "red.global.add.v2.f32", pc);
  // Each element is its own atomic add (the PTX ISA makes no promise for the pair as a whole).
  std::atomic_ref<float>(addr[0]).fetch_add(a);
  std::atomic_ref<float>(addr[1]).fetch_add(b);
}

// ---- bulk asynchronous reductions ------------------------------------------------------------

void BlockExecutor::bulk_reduce_add_f32(float* dst, const void* src, unsigned bytes, const void* pc) {
  tick();
  Thread& t = *current_;
  const std::string what = "cp.reduce.async.bulk.add.f32 by " + who(t.tid) + " at " + where(pc);
  if (bytes == 0 || bytes % 16) fail(what + ": the size must be a non-zero multiple of 16 bytes, got " + std::to_string(bytes));
  if (reinterpret_cast<uintptr_t>(dst) % 16) fail(what + ": the global destination is not 16-byte aligned");
  const size_t off = shared_offset(src, bytes, "cp.reduce.async.bulk source", pc);
  if (off % 16) fail(what + ": the shared source (offset " + std::to_string(off) + ") is not 16-byte aligned");
  check_global(dst, bytes, true, "cp.reduce.async.bulk destination", pc);
  // The source is read through the async proxy: a generic store to it needs its writer's
  // fence.proxy.async (and a barrier, which shared_read checks) before the issue.
  for (size_t b = off; b < off + bytes; ++b) {
    const Shadow& s = shadow_[b];
    if (s.write_epoch >= block_epoch_ && s.write_epoch != 0 && threads_[s.writer].proxy_fences == s.write_fence)
      fail(what + " reads shared offset " + std::to_string(b) + ", which " + who(s.writer) + " wrote at " + where(s.write_pc) +
           " through the generic proxy with no fence.proxy.async after it (the bulk copy reads through the async proxy)");
  }
  shared_read(off, bytes, t.tid, pc);
  BulkReduce r{dst, off, std::vector<uint8_t>(arena_.data() + off, arena_.data() + off + bytes), pc};
  t.bulk_open.push_back(std::move(r));
}

void BlockExecutor::bulk_commit(const void*) {
  Thread& t = *current_;
  if (t.bulk_open.empty()) return;  // an empty group is complete at once: never waited for
  t.bulk_committed.push_back(std::move(t.bulk_open));
  t.bulk_open.clear();
}

void BlockExecutor::bulk_wait(int n, bool read, const void* pc) {
  tick();
  Thread& t = *current_;
  const char* wait = read ? "cp.async.bulk.wait_group.read" : "cp.async.bulk.wait_group";
  // Groups past the n most recent have read their sources: each source is checked unchanged since
  // the issue (the copy may read it up to this wait). Their global writes land now for a full
  // wait; after a .read wait they land later, so a thread that reads what it stored or added with
  // only a .read wait between sees the old values, as it may on the GPU.
  while (static_cast<int>(t.bulk_committed.size()) > n) {
    for (const BulkReduce& r : t.bulk_committed.front()) {
      if (!r.to.empty()) {  // a TMA store
        const size_t eb = size_t(r.element_bytes);
        for (size_t l = 0; l < r.to.size(); ++l) {
          // A read by this thread now, so a store by another thread that no barrier orders after
          // the wait is a race.
          shared_read(r.from[l], eb, t.tid, pc);
          if (std::memcmp(arena_.data() + r.from[l], r.bytes.data() + l * eb, eb) != 0)
            fail("shared memory at offset " + std::to_string(r.from[l]) + ", the source of the TMA store issued at " + where(r.pc) +
                 ", changed before " + who(t.tid) + " waited for its group (" + wait + ", at " + where(pc) +
                 "): the copy may still read it");
        }
        continue;
      }
      if (std::memcmp(arena_.data() + r.src, r.bytes.data(), r.bytes.size()) != 0)
        fail("shared memory at offset " + std::to_string(r.src) + ", the source of the cp.reduce.async.bulk issued at " + where(r.pc) +
             ", changed before " + who(t.tid) + " waited for its group (" + wait + ", at " + where(pc) +
             "): the copy may still read it");
    }
    t.bulk_landing.push_back(std::move(t.bulk_committed.front()));
    t.bulk_committed.pop_front();
  }
  // A full wait completes every group but the n most recent, those read before included.
  if (!read)
    while (!t.bulk_landing.empty() && t.bulk_landing.size() + t.bulk_committed.size() > size_t(n)) {
      land_bulk_group(t.bulk_landing.front());
      t.bulk_landing.pop_front();
    }
}

void BlockExecutor::land_bulk_group(const std::vector<BulkReduce>& group) {
  for (const BulkReduce& r : group) {
    if (!r.to.empty()) {  // a TMA store: its box's elements inside the tensor
      const size_t eb = size_t(r.element_bytes);
      for (size_t l = 0; l < r.to.size(); ++l)
        if (r.to[l]) std::memcpy(r.to[l], r.bytes.data() + l * eb, eb);
      continue;
    }
    const size_t count = r.bytes.size() / 4;
    for (size_t i = 0; i < count; ++i) {
      float v;
      std::memcpy(&v, r.bytes.data() + 4 * i, 4);
      std::atomic_ref<float>(r.dst[i]).fetch_add(v);  // as red.global.add.f32 (the workers flush subnormals)
    }
  }
}

// ---- cp.async --------------------------------------------------------------------------------

void BlockExecutor::cp_async(void* smem, const void* gmem, unsigned cp_size, unsigned src_size, const void* pc) {
  tick();
  Thread& t = *current_;
  if (cp_size != 4 && cp_size != 8 && cp_size != 16) fail("cp.async: cp-size must be 4, 8 or 16 bytes, got " + std::to_string(cp_size));
  if (src_size > cp_size) fail("cp.async: src-size " + std::to_string(src_size) + " exceeds cp-size " + std::to_string(cp_size));
  if (reinterpret_cast<uintptr_t>(smem) % cp_size || (src_size && reinterpret_cast<uintptr_t>(gmem) % cp_size)) {
    fail("cp.async: " + who(t.tid) + " copies " + std::to_string(cp_size) + " bytes from " + hex(gmem) + " to " + hex(smem) +
         "; both addresses must be aligned to the copy size (at " + where(pc) + ")");
  }
  const size_t off = shared_offset(smem, cp_size, "cp.async destination", pc);
  PendingCopy c{arena_.data() + off, cp_size, pc, {}};
  if (src_size) {
    check_global(gmem, src_size, false, "cp.async source", pc);
    std::memcpy(c.data, gmem, src_size);
  }
  // The destination holds garbage until the group completes: poison it now, so a read before the
  // wait (or before the barrier after it) sees NaN.
  shared_write(off, cp_size, t.tid, pc);
  if (banks_) count_shared(off, cp_size, SharedOp::CpAsync, pc);
  std::memset(c.dst, 0xFF, cp_size);
  t.open.push_back(c);
}

void BlockExecutor::cp_async_commit(const void*) {
  Thread& t = *current_;
  t.committed.push_back(std::move(t.open));
  t.open.clear();
}

void BlockExecutor::cp_async_wait(int n, const void* pc) {
  tick();
  Thread& t = *current_;
  while (static_cast<int>(t.committed.size()) > n) {
    for (const PendingCopy& c : t.committed.front()) {
      shared_write(static_cast<size_t>(c.dst - arena_.data()), c.bytes, t.tid, c.pc);
      std::memcpy(c.dst, c.data, c.bytes);
    }
    t.committed.pop_front();
  }
}

// ---- shared memory allocation --------------------------------------------------------------

void* BlockExecutor::dynamic_shared() { return arena_.data(); }

void* BlockExecutor::static_shared(const void* key, size_t bytes, size_t align, const void* pc) {
  for (const auto& [k, off] : static_slots_)
    if (k == key) return arena_.data() + off;
  const size_t off = (static_base_ + static_used_ + align - 1) / align * align;
  if (off + bytes > arena_.size()) {
    fail("static shared memory of " + std::to_string(off + bytes - static_base_) + " bytes exceeds the " +
         std::to_string(kStaticSharedBytes) + " bytes a block may declare statically (at " + where(pc) + ")");
  }
  static_used_ = off + bytes - static_base_;
  static_slots_.emplace_back(key, off);
  return arena_.data() + off;
}

// ---- reports ---------------------------------------------------------------------------------

std::string BlockExecutor::deadlock_report() const {
  // Group threads by what they wait at.
  std::map<std::string, std::vector<int>> groups;
  for (const Thread& t : threads_) {
    std::string what;
    switch (t.state) {
      case State::Done: what = "exited"; break;
      case State::AtBarrier: what = "wait at __syncthreads() at " + where(t.wait_pc); break;
      case State::AtCollective: what = "wait for their warp at a warp-collective instruction at " + where(t.wait_pc); break;
      case State::AtNamedBarrier:
        what = "wait at bar.sync " + std::to_string(t.wait_bar) + " (" + std::to_string(named_[t.wait_bar].arrived) + " of " +
               std::to_string(named_[t.wait_bar].count) + " threads arrived) at " + where(t.wait_pc);
        break;
      case State::AtWgmmaWait: what = "wait for a wgmma (wgmma.wait_group) at " + where(t.wait_pc); break;
      case State::AtMbarrier:
        what = "wait on " + mbarrier_name(t.wait_bar) + " for the phase of parity " + std::to_string(t.wait_parity) + " at " + where(t.wait_pc);
        break;
      default: what = "are blocked"; break;
    }
    groups[what].push_back(t.tid);
  }
  std::ostringstream os;
  os << block_name() << ": the block can never finish: a __syncthreads(), a warp-collective instruction or an mbarrier phase "
     << "is not reached by every thread it needs (on a GPU: a hang or undefined behaviour).";
  for (const auto& [what, tids] : groups) {
    os << "\n  threads ";
    for (size_t i = 0; i < tids.size();) {  // ranges a-b
      size_t j = i;
      while (j + 1 < tids.size() && tids[j + 1] == tids[j] + 1) ++j;
      os << (i ? "," : "") << tids[i];
      if (j > i) os << "-" << tids[j];
      i = j + 1;
    }
    os << " " << what;
  }
  for (size_t i = 0; i < mbarriers_.size(); ++i) {
    const Mbarrier& m = mbarriers_[i];
    if (m.off == SIZE_MAX) continue;
    os << "\n  " << mbarrier_name(int(i)) << ": phase " << m.completed << " (parity " << m.completed % 2 << "), " << m.pending << " of "
       << m.count << " arrivals pending, transaction count " << m.tx << " bytes";
    if (m.tx < 0) os << " (more bytes landed than expect_tx announced)";
    else if (m.tx > 0 && m.pending == 0) os << " (expect_tx announced bytes no load brings)";
  }
  return os.str();
}

}  // namespace attnjit::emu
