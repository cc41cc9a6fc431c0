// The checks the hardware does not make, on every access an emulated kernel makes: global accesses
// must fall inside a buffer of the launch (and stores inside a writable one); shared accesses
// inside the block's shared memory; and no byte of shared memory may be written by one thread and
// read or written by another within one barrier interval.
#include <cstring>
#include <sstream>

#include "compiler/support/error.hpp"
#include "emulator/block_executor.hpp"

namespace attnjit::emu {

BlockExecutor::Space BlockExecutor::classify(const void* addr) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr), lo = reinterpret_cast<uintptr_t>(arena_.data());
  if (a - lo < arena_.size()) return Space::Shared;
  if (stacks_.contains(addr)) return Space::Private;
  return Space::Global;
}

void BlockExecutor::access(const void* addr, size_t bytes, bool write, const void* pc) {
  tick();
  switch (classify(addr)) {
    case Space::Private: return;
    case Space::Shared: {
      const size_t off = shared_offset(addr, bytes, write ? "shared store" : "shared load", pc);
      if (write) shared_write(off, bytes, current_->tid, pc);
      else shared_read(off, bytes, current_->tid, pc);
      if (banks_) count_shared(off, bytes, write ? SharedOp::Store : SharedOp::Load, pc);
      return;
    }
    case Space::Global: {
      const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
      if (!write)
        for (const ReadOnlyRange& r : launch_.readable)
          if (a >= r.lo && a + bytes <= r.hi) return;
      check_global(addr, bytes, write, write ? "global store" : "global load", pc);
      return;
    }
  }
}

void BlockExecutor::vector_access(const void* addr, size_t bytes, bool write, const void* pc) {
  ATTNJIT_CHECK(bytes == 8 || bytes == 16, "a vector access of " + std::to_string(bytes) + " bytes");
  if (reinterpret_cast<uintptr_t>(addr) % bytes != 0) {
    std::ostringstream os;
    os << "a " << bytes << "-byte " << (write ? "store" : "load") << " by " << who(current_->tid) << " at " << addr
       << " is not " << bytes << "-byte aligned (a misaligned address on a GPU) at " << where(pc);
    fail(os.str());
  }
  access(addr, bytes, write, pc);
}

size_t BlockExecutor::shared_offset(const void* addr, size_t bytes, const char* what, const void* pc) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr), lo = reinterpret_cast<uintptr_t>(arena_.data());
  const size_t off = a - lo;
  const bool in_dynamic = a >= lo && off + bytes <= launch_.dynamic_shared;
  const bool in_static = a >= lo && off >= static_base_ && off + bytes <= static_base_ + static_used_;
  if (in_dynamic || in_static) return off;
  std::ostringstream os;
  os << what << " of " << bytes << " bytes at shared offset " << static_cast<int64_t>(off) << " by " << who(current_->tid)
     << " is outside the block's shared memory (" << launch_.dynamic_shared << " dynamic bytes";
  if (static_used_) os << ", " << static_used_ << " static bytes at offset " << static_base_;
  os << ") at " << where(pc);
  fail(os.str());
}

void BlockExecutor::check_global(const void* addr, size_t bytes, bool write, const char* what, const void* pc) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const GlobalBuffer* before = nullptr;  // the buffer ending at or below the address (an overflow)
  const GlobalBuffer* after = nullptr;   // the buffer starting above it (an underflow)
  for (const GlobalBuffer& b : buffers_) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(b.data), hi = lo + b.bytes;
    if (a >= lo && a + bytes <= hi) {
      if (!write || b.writable) return;
      fail(std::string(what) + " by " + who(current_->tid) + " writes the read-only buffer '" + b.name + "' at element " +
           std::to_string((a - lo) / size_t(b.elem_bytes)) + " (at " + where(pc) + ")");
    }
    if (lo <= a) before = &b;  // buffers_ is sorted by address
    if (lo > a && !after) after = &b;
  }
  auto element_of = [&](const GlobalBuffer& b) {
    const intptr_t elem = (static_cast<intptr_t>(a) - reinterpret_cast<intptr_t>(b.data)) / b.elem_bytes;
    return "element " + std::to_string(elem) + " of '" + b.name + "', which has " + std::to_string(b.bytes / size_t(b.elem_bytes)) +
           " elements";
  };
  std::ostringstream os;
  os << what << " of " << bytes << " bytes by " << who(current_->tid) << " at " << addr << " is outside every buffer of the launch";
  if (before) os << ": it would be " << element_of(*before) << (after ? ", or " + element_of(*after) : std::string());
  else if (after) os << ": it would be " << element_of(*after);
  os << " (a too-short buffer, or an index out of range) at " << where(pc);
  fail(os.str());
}

void BlockExecutor::shared_read(size_t off, size_t bytes, int tid, const void* pc) {
  for (size_t i = off; i < off + bytes; ++i) {
    Shadow& s = shadow_[i];
    if (s.tma) check_tma_visible(i, 1, threads_[size_t(tid)].observed, tid, pc);
    if (s.write_epoch == epoch_ && s.writer != tid) fail(race_report("read after write", i, tid, pc, s.writer, s.write_pc));
    if (s.read_epoch == epoch_) {
      if (s.reader != tid) s.reader = kManyReaders;
    } else {
      s.read_epoch = epoch_;
      s.reader = static_cast<uint16_t>(tid);
      s.read_pc = pc;
    }
  }
}

void BlockExecutor::shared_write(size_t off, size_t bytes, int tid, const void* pc) {
  for (size_t i = off; i < off + bytes; ++i) {
    Shadow& s = shadow_[i];
    if (s.mbarrier)
      fail(who(tid) + " at " + where(pc) + " writes shared offset " + std::to_string(i) +
           ", part of an initialised mbarrier (place data and mbarriers apart)");
    if (s.tma) {  // the thread's own data from now on, once the load's bytes are visible to it
      check_tma_visible(i, 1, threads_[size_t(tid)].observed, tid, pc);
      s.tma = 0;
    }
    if (s.write_epoch == epoch_ && s.writer != tid) fail(race_report("write after write", i, tid, pc, s.writer, s.write_pc));
    if (s.read_epoch == epoch_ && s.reader != tid) fail(race_report("write after read", i, tid, pc, s.reader, s.read_pc));
    s.write_epoch = epoch_;
    s.writer = static_cast<uint16_t>(tid);
    s.write_pc = pc;
    s.write_fence = threads_[size_t(tid)].proxy_fences;
  }
}

// ---- the bank profile ------------------------------------------------------------------------

void BlockExecutor::count_shared(size_t off, size_t bytes, SharedOp op, const void* pc) {
  Thread& t = *current_;
  std::pair<uint32_t, uint32_t>& seen = t.bank_seen[pc];
  if (seen.first != t.sync_epoch) seen = {t.sync_epoch, 0};
  const BankGroupKey key{pc, t.sync_epoch, seen.second++, op};
  BankGroups& groups = bank_groups_[size_t(t.tid / 32)];
  std::vector<LaneAccess>& group = groups[key];
  group.push_back({uint32_t(off), uint32_t(bytes), uint8_t(t.tid % 32)});
  if (group.size() < 32) return;
  bank_counts_[{pc, op}] += thread_access_wavefronts(group);
  groups.erase(key);
}

void BlockExecutor::count_matrix(const uint32_t rows[][8], int num, SharedOp op, const void* pc) {
  bank_counts_[{pc, op}] += matrix_wavefronts(rows, num);
}

void BlockExecutor::flush_bank_groups(int warp) {
  BankGroups& groups = bank_groups_[size_t(warp)];
  for (const auto& [key, group] : groups) bank_counts_[{key.pc, key.op}] += thread_access_wavefronts(group);
  groups.clear();
}

void BlockExecutor::end_bank_profile() {
  for (size_t w = 0; w < bank_groups_.size(); ++w) flush_bank_groups(int(w));
  std::vector<BankSite> sites;
  for (const auto& [key, count] : bank_counts_) sites.push_back({where(key.first), key.second, count});
  bank_counts_.clear();
  add_to_bank_profile(sites);
}

std::string BlockExecutor::race_report(const char* kind, size_t off, int tid, const void* pc, int other,
                                       const void* other_pc) const {
  std::ostringstream os;
  os << "shared-memory race (" << kind << ") on byte " << off << " within one barrier interval:\n  " << who(tid) << " at "
     << where(pc) << "\n  " << (other == kManyReaders ? std::string("several threads (the first)") : who(other)) << " at "
     << where(other_pc) << "\n  a __syncthreads() (or a cp.async wait before it) is missing between them";
  return os.str();
}

}  // namespace attnjit::emu
