// mbarrier objects and TMA tile loads (cp.async.bulk.tensor) in the block executor.
//
// An mbarrier has a count of expected arrivals and a transaction count; a phase completes when
// every expected thread has arrived and the transaction count is back to zero, and a wait on a
// parity returns once the phase of that parity has completed (PTX ISA, "mbarrier"). A TMA load
// is issued at once but lands as late as it may: only when no thread of the block can go on
// (every live thread waits), so a thread that reads its bytes without waiting finds them not yet
// written. Its destination reads as NaN from issue to landing.
//
// Race checks for ordinary shared-memory accesses: a phase every thread of the block arrives at
// ends a barrier interval, as __syncthreads() does; mbarriers of fewer threads order only TMA
// bytes (below), so data threads exchange through shared memory needs a block barrier or a
// phase of all threads.
//
// Visibility: a thread may read bytes a TMA load wrote only after observing the completion of the
// mbarrier phase the load landed in: by its own wait, or through a __syncthreads() after a thread
// that waited. The emulator reports every read (a load, ldmatrix, a wgmma operand) and every
// write that breaks this, every load whose destination another load is still filling, more
// arrivals than a phase expects, mbarriers used before their init is visible, overwritten by
// stores or loads, or waited on forever (with each mbarrier's state), and a block that ends with a
// load in flight.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "emulator/block_executor.hpp"
#include "emulator/tensor_map.hpp"

namespace attnjit::emu {

std::string BlockExecutor::mbarrier_name(int bar) const {
  const Mbarrier& m = mbarriers_[size_t(bar)];
  return "the mbarrier at shared offset " + std::to_string(m.off) + " (initialised at " + where(m.init_pc) + ")";
}

uint32_t& BlockExecutor::observed(Thread& t, int bar) {
  if (t.observed.size() <= size_t(bar)) t.observed.resize(size_t(bar) + 1, 0);
  return t.observed[size_t(bar)];
}

int BlockExecutor::find_mbarrier(const void* bar, const char* what, const void* pc) {
  const size_t off = shared_offset(bar, 8, what, pc);
  if (off % 8) fail(std::string(what) + " at " + where(pc) + ": the mbarrier address (shared offset " + std::to_string(off) + ") is not 8-byte aligned");
  for (size_t i = mbarriers_.size(); i-- > 0;) {
    const Mbarrier& m = mbarriers_[i];
    if (m.off != off) continue;
    if (m.init_epoch == epoch_ && m.init_tid != current_->tid) {
      fail(std::string(what) + " by " + who(current_->tid) + " at " + where(pc) + " uses " + mbarrier_name(int(i)) + " in the same barrier interval as its mbarrier.init by " +
           who(m.init_tid) + ": a __syncthreads() between the init and its first use by other threads");
    }
    return int(i);
  }
  fail(std::string(what) + " by " + who(current_->tid) + " at " + where(pc) + ": shared offset " + std::to_string(off) +
       " holds no mbarrier (mbarrier.init it first)");
}

void BlockExecutor::mbarrier_init(void* bar, unsigned count, const void* pc) {
  tick();
  const size_t off = shared_offset(bar, 8, "mbarrier.init", pc);
  if (off % 8) fail("mbarrier.init at " + where(pc) + ": shared offset " + std::to_string(off) + " is not 8-byte aligned");
  if (count == 0 || count >= (1u << 20)) fail("mbarrier.init at " + where(pc) + ": count " + std::to_string(count) + " is not in 1..2^20-1");
  for (size_t i = 0; i < mbarriers_.size(); ++i) {
    Mbarrier& m = mbarriers_[i];
    if (m.off + 8 <= off || off + 8 <= m.off) continue;
    for (const TmaOp& op : tma_ops_)
      if (op.bar == int(i) && !op.landed)
        fail("mbarrier.init at " + where(pc) + " re-initialises " + mbarrier_name(int(i)) + " while the TMA load issued at " + where(op.pc) + " still completes on it");
    m.off = SIZE_MAX;  // retired: a new mbarrier takes its place (threads' observed phases do not carry over)
  }
  for (size_t b = off; b < off + 8; ++b) {
    if (shadow_[b].tma && !tma_ops_[shadow_[b].tma - 1].landed)
      fail("mbarrier.init at " + where(pc) + ": shared offset " + std::to_string(off) + " is the destination of a TMA load still in flight");
    shadow_[b].mbarrier = true;
    shadow_[b].tma = 0;
  }
  Mbarrier m;
  m.off = off;
  m.count = m.pending = int(count);
  m.init_epoch = epoch_;
  m.init_tid = current_->tid;
  m.init_pc = pc;
  mbarriers_.push_back(m);
}

void BlockExecutor::complete_phase_if_done(int bar) {
  Mbarrier& m = mbarriers_[size_t(bar)];
  if (m.pending != 0 || m.tx != 0) return;
  ++m.completed;
  m.pending = m.count;
  if (size_t(m.count) == threads_.size()) {
    // Every thread of the block arrived: a block barrier for the race checks (a new barrier
    // interval; each thread has observed what any had). Accesses a thread makes between its
    // arrival and the completion count as before it, so a split arrive/wait is checked leniently.
    ++epoch_;
    join_observed();
  }
  for (Thread& t : threads_)
    if (t.state == State::AtMbarrier && t.wait_bar == bar && (m.completed & 1u) != t.wait_parity) t.state = State::Ready;
}

uint64_t BlockExecutor::mbarrier_arrive(void* bar, unsigned expect_tx, int arrive, const void* pc) {
  tick();
  const int b = find_mbarrier(bar, arrive ? "mbarrier.arrive" : "mbarrier.expect_tx", pc);
  Mbarrier& m = mbarriers_[size_t(b)];
  const uint64_t state = m.completed & 1u;
  if (expect_tx) {
    m.tx += expect_tx;
    if (m.tx >= (int64_t(1) << 20))
      fail("mbarrier.expect_tx by " + who(current_->tid) + " at " + where(pc) + " raises the transaction count of " + mbarrier_name(b) + " to " +
           std::to_string(m.tx) + " bytes, past the 2^20 - 1 a phase may hold");
  }
  if (arrive) {
    if (m.pending == 0)
      fail("mbarrier.arrive by " + who(current_->tid) + " at " + where(pc) + " on " + mbarrier_name(b) + ": all " + std::to_string(m.count) +
           " arrivals of phase " + std::to_string(m.completed) + " have come and the phase waits for " + std::to_string(m.tx) +
           " transaction bytes: more arrivals than the count (a producer not waiting for its stage to be released?)");
    --m.pending;
  }
  const uint32_t before = m.completed;
  complete_phase_if_done(b);
  if (mbarriers_[size_t(b)].completed != before) {
    // Let the threads this phase released run first: a thread that arrives before it is done with
    // what the phase guards (a stage released early) is caught when the producer refills it.
    current_->state = State::Ready;
    block_until_released(*current_);
  }
  return state;
}

void BlockExecutor::mbarrier_wait(void* bar, unsigned parity, const void* pc) {
  tick();
  Thread& t = *current_;
  const int b = find_mbarrier(bar, "mbarrier.try_wait", pc);
  parity &= 1u;
  if ((mbarriers_[size_t(b)].completed & 1u) == parity) {
    t.state = State::AtMbarrier;
    t.wait_bar = b;
    t.wait_parity = parity;
    t.wait_pc = pc;
    block_until_released(t);
    t.wait_bar = -1;
  }
  uint32_t& seen = observed(t, b);
  seen = std::max(seen, mbarriers_[size_t(b)].completed);
}

bool BlockExecutor::mbarrier_test(void* bar, unsigned parity, const void* pc) {
  tick();
  const int b = find_mbarrier(bar, "mbarrier.test_wait", pc);
  if ((mbarriers_[size_t(b)].completed & 1u) == (parity & 1u)) return false;
  uint32_t& seen = observed(*current_, b);
  seen = std::max(seen, mbarriers_[size_t(b)].completed);
  return true;
}

namespace {

// Calls at(l, address) for each element l of the box at `coords` (innermost first, in the order a
// load lays them out), with the element's global address, or 0 where it lies outside the tensor.
template <typename At>
void for_each_box_element(const TensorMapSpec& s, const int* coords, int rank, At&& at) {
  const uint64_t eb = uint64_t(element_bytes(s.type));
  uint32_t n[5] = {1, 1, 1, 1, 1};
  uint64_t total = 1;
  for (int d = 0; d < rank; ++d) total *= (n[d] = box_elements(s, d));
  for (uint64_t l = 0; l < total; ++l) {
    uint64_t rest = l, addr = s.address;
    bool inside = true;
    for (int d = 0; d < rank; ++d) {
      const int64_t i = int64_t(rest % n[d]);
      rest /= n[d];
      const int64_t g = int64_t(coords[d]) + i * (d == 0 ? 1 : int64_t(s.element_strides[size_t(d)]));
      if (g < 0 || g >= int64_t(s.dims[size_t(d)])) inside = false;
      else addr += uint64_t(g) * (d == 0 ? eb : s.strides[size_t(d)]);
    }
    at(l, inside ? addr : 0);
  }
}

}  // namespace

TensorMapSpec BlockExecutor::tma_box(const void* tensor_map, int rank, const void* smem, const std::string& what, const char* role,
                                     size_t* off, const void* pc) {
  const std::optional<TensorMapSpec> map = decode_emulated_tensor_map(tensor_map);
  if (!map)
    fail(what + ": the tensor map is not one the emulator can read (made by attnjit::emu::encode_emulated_tensor_map; a map "
                "the CUDA driver encoded is opaque here)");
  const TensorMapSpec& s = *map;
  if (s.rank != rank) fail(what + ": the tensor map has rank " + std::to_string(s.rank) + ", the instruction gives " + std::to_string(rank) + " coordinates");
  const uint64_t bytes = box_bytes(s);
  *off = shared_offset(smem, bytes, (std::string("cp.async.bulk.tensor ") + role).c_str(), pc);
  if (*off + bytes > launch_.dynamic_shared)
    fail(what + ": the box of " + std::to_string(bytes) + " bytes at shared offset " + std::to_string(*off) + " does not fit the block's dynamic shared memory");
  if (*off % box_alignment(s))
    fail(what + ": the " + role + " (shared offset " + std::to_string(*off) + ") is not " + std::to_string(box_alignment(s)) + "-byte aligned, as " +
         (s.swizzle ? "a " + std::to_string(s.swizzle) + "-byte swizzle" : std::string("a box")) + " needs");
  if (s.swizzle && uint64_t(s.box[0]) * uint64_t(element_bytes(s.type)) != uint64_t(s.swizzle))
    fail(what + ": a swizzled box whose inner dimension is narrower than the swizzle is not modelled by the emulator; make box[0] span the swizzle");
  return s;
}

void BlockExecutor::tma_load(void* dst, const void* tensor_map, const int* coords, int rank, void* bar, const void* pc) {
  tick();
  const std::string what = "cp.async.bulk.tensor." + std::to_string(rank) + "d by " + who(current_->tid) + " at " + where(pc);
  size_t off = 0;
  const TensorMapSpec s = tma_box(tensor_map, rank, dst, what, "destination", &off, pc);
  const int b = find_mbarrier(bar, "cp.async.bulk.tensor", pc);
  const uint64_t bytes = box_bytes(s);

  TmaOp op;
  op.bar = b, op.pc = pc, op.tid = current_->tid, op.bytes = bytes;
  op.element_bytes = element_bytes(s.type);
  const int eb = op.element_bytes;
  const uint64_t total = bytes / uint64_t(eb);
  op.dst.resize(total);
  op.data.resize(total * size_t(eb));
  uint8_t fill[4] = {0, 0, 0, 0};
  if (s.oob_nan) {  // the canonical NaN of the type
    const uint32_t nan = eb == 4 ? 0x7fffffffu : 0x7fffu;
    std::memcpy(fill, &nan, size_t(eb));
  }
  for_each_box_element(s, coords, rank, [&](uint64_t l, uint64_t addr) {
    uint8_t* out = op.data.data() + l * size_t(eb);
    if (addr) {
      const void* src = reinterpret_cast<const void*>(uintptr_t(addr));
      check_global(src, size_t(eb), false, "cp.async.bulk.tensor source (the tensor map reaches past its buffer)", pc);
      std::memcpy(out, src, size_t(eb));
    } else {
      std::memcpy(out, fill, size_t(eb));
    }
    op.dst[l] = swizzle_address(uint32_t(off + l * size_t(eb)), s.swizzle);
  });
  const uint32_t id = uint32_t(tma_ops_.size()) + 1;
  for (uint32_t a : op.dst)
    for (uint32_t k = a; k < a + uint32_t(eb); ++k) {
      Shadow& sh = shadow_[k];
      if (sh.mbarrier) fail(what + " writes shared offset " + std::to_string(k) + ", part of an mbarrier");
      if (sh.tma && !tma_ops_[sh.tma - 1].landed)
        fail(what + " writes shared offset " + std::to_string(k) + ", which the TMA load issued at " + where(tma_ops_[sh.tma - 1].pc) +
             " is still filling (a stage reused before its consumers released it?)");
      sh.tma = id;
      sh.write_epoch = 0;  // written through the async proxy: no fence.proxy.async needed to read it with wgmma
      arena_[k] = 0xFF;     // NaN until it lands
    }
  tma_ops_.push_back(std::move(op));
  ++tma_pending_;
}

void BlockExecutor::tma_store(const void* tensor_map, const int* coords, int rank, const void* src, const void* pc) {
  tick();
  Thread& t = *current_;
  const std::string what = "cp.async.bulk.tensor." + std::to_string(rank) + "d (a store) by " + who(t.tid) + " at " + where(pc);
  size_t off = 0;
  const TensorMapSpec s = tma_box(tensor_map, rank, src, what, "source", &off, pc);
  const uint64_t bytes = box_bytes(s);
  // The PTX ISA ("Restriction on Tensor Copy instructions", the .global.shared::cta direction): a
  // store's box starts at non-negative coordinates (it may run past the end). An H200 stops such a
  // store with an illegal instruction.
  for (int d = 0; d < rank; ++d)
    if (coords[d] < 0)
      fail(what + " starts its box at coordinate " + std::to_string(coords[d]) + " of dimension " + std::to_string(d) +
           ": a TMA store's box must start at non-negative coordinates (only its far end may leave the tensor)");
  // Read through the async proxy: a generic store to the source needs its writer's
  // fence.proxy.async, and a barrier between the writers and this thread (shared_read).
  for (size_t b = off; b < off + bytes; ++b) {
    const Shadow& sh = shadow_[b];
    if (sh.write_epoch >= block_epoch_ && sh.write_epoch != 0 && threads_[sh.writer].proxy_fences == sh.write_fence)
      fail(what + " reads shared offset " + std::to_string(b) + ", which " + who(sh.writer) + " wrote at " + where(sh.write_pc) +
           " through the generic proxy with no fence.proxy.async after it (the store reads through the async proxy)");
  }
  shared_read(off, size_t(bytes), t.tid, pc);

  BulkReduce op{nullptr, off, {}, pc, {}, {}, element_bytes(s.type)};
  const size_t eb = size_t(op.element_bytes), total = size_t(bytes) / eb;
  op.from.resize(total);
  op.to.resize(total);
  op.bytes.resize(total * eb);
  for_each_box_element(s, coords, rank, [&](uint64_t l, uint64_t addr) {
    op.from[l] = swizzle_address(uint32_t(off + l * eb), s.swizzle);
    std::memcpy(op.bytes.data() + l * eb, arena_.data() + op.from[l], eb);
    if (addr) {
      uint8_t* dst = reinterpret_cast<uint8_t*>(uintptr_t(addr));
      check_global(dst, eb, true, "cp.async.bulk.tensor destination (the tensor map reaches past its buffer)", pc);
      op.to[l] = dst;
    }
  });
  t.bulk_open.push_back(std::move(op));
}

bool BlockExecutor::land_tma_ops() {
  if (tma_pending_ == 0) return false;
  for (TmaOp& op : tma_ops_) {
    if (op.landed) continue;
    for (size_t l = 0; l < op.dst.size(); ++l)
      std::memcpy(arena_.data() + op.dst[l], op.data.data() + l * size_t(op.element_bytes), size_t(op.element_bytes));
    Mbarrier& m = mbarriers_[size_t(op.bar)];
    op.phase = m.completed;
    op.landed = true;
    m.tx -= int64_t(op.bytes);
    complete_phase_if_done(op.bar);
  }
  tma_pending_ = 0;
  return true;
}

void BlockExecutor::check_tma_visible(size_t off, size_t bytes, const std::vector<uint32_t>& seen, int tid, const void* pc) {
  for (size_t k = off; k < off + bytes; ++k) {
    const uint32_t id = shadow_[k].tma;
    if (!id) continue;
    const TmaOp& op = tma_ops_[id - 1];
    const uint32_t have = size_t(op.bar) < seen.size() ? seen[size_t(op.bar)] : 0;
    if (op.landed && have > op.phase) continue;
    std::ostringstream os;
    os << who(tid) << " at " << where(pc) << " accesses shared offset " << k << ", which the TMA load issued at " << where(op.pc) << " by "
       << who(op.tid);
    if (!op.landed) os << " has not written yet";
    else os << " wrote in phase " << op.phase << " of " << mbarrier_name(op.bar) << ", a completion the thread has not observed";
    os << ": wait on the mbarrier (parity " << (op.landed ? op.phase : mbarriers_[size_t(op.bar)].completed) % 2
       << ") first, or reach a barrier after a thread that did (for a wgmma: every thread of the warpgroup)";
    fail(os.str());
  }
}

void BlockExecutor::join_observed() {
  if (mbarriers_.empty()) return;
  std::vector<uint32_t> all(mbarriers_.size(), 0);
  for (const Thread& t : threads_)
    for (size_t i = 0; i < t.observed.size(); ++i) all[i] = std::max(all[i], t.observed[i]);
  for (Thread& t : threads_) t.observed = all;
}

}  // namespace attnjit::emu
