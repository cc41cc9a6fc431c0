// The Hopper warpgroup instructions in the block executor: wgmma.mma_async with its fence,
// commit_group and wait_group, and fence.proxy.async. What the hardware leaves undefined the
// emulator reports: a wgmma without a wgmma.fence since the thread's last wait (or the start), a
// warpgroup whose threads disagree on the operands, shared memory that changes while a wgmma may
// still read it, A registers that change before their thread's wait, shared memory written through
// the generic proxy (stores, cp.async) and read by a wgmma with no fence.proxy.async by the writer
// in between, a thread that exits with wgmmas in flight. The accumulators read as NaN from issue to
// wait, and a wgmma completes as late as it may: its waiting threads go on only once no thread of
// the block can, one warpgroup at a time.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "compiler/support/half.hpp"
#include "emulator/block_executor.hpp"
#include "emulator/emu_abi.h"
#include "emulator/ptx_semantics.hpp"

namespace attnjit::emu {

unsigned BlockExecutor::smem_addr(const void* p) {
  return static_cast<unsigned>(shared_offset(p, 1, "cvta.to.shared", nullptr));
}

void BlockExecutor::fence_proxy_async(const void*) { ++current_->proxy_fences; }

void BlockExecutor::wgmma_fence(const void*) { current_->wgmma_fenced = true; }

void BlockExecutor::wgmma_commit(const void*) {
  Thread& t = *current_;
  t.wg_committed.push_back(std::move(t.wg_open));
  t.wg_open.clear();
}

void BlockExecutor::wgmma_wait(int n, const void* pc) {
  tick();
  Thread& t = *current_;
  if (static_cast<int>(t.wg_committed.size()) > n) {
    // A wgmma completes as late as it may: once no thread of the block can go on (as a TMA load
    // lands), and one warpgroup's at a time, so shared memory another warpgroup changes while it
    // may still read its operands is caught below, where index order alone would have let this
    // thread finish first.
    t.state = State::AtWgmmaWait;
    t.wait_pc = pc;
    ++wgmma_waiting_;
    block_until_released(t);
  }
  while (static_cast<int>(t.wg_committed.size()) > n) {
    for (const std::shared_ptr<WgmmaOp>& op : t.wg_committed.front()) finish_wgmma(t, *op);
    t.wg_committed.pop_front();
  }
  t.wgmma_fenced = false;  // the accumulators are the kernel's again: the next wgmma needs a fence
}

bool BlockExecutor::release_wgmma_waits() {
  if (wgmma_waiting_ == 0) return false;
  // One warpgroup at a time, the lowest waiting: the others' wgmmas stay in flight while it goes
  // on (completions across warpgroups are unordered on the hardware).
  int wg = -1;
  for (Thread& t : threads_) {
    if (t.state != State::AtWgmmaWait) continue;
    if (wg < 0) wg = t.tid / 128;
    if (t.tid / 128 != wg) break;
    t.state = State::Ready;
    --wgmma_waiting_;
  }
  return true;
}

void BlockExecutor::finish_wgmma(Thread& t, WgmmaOp& op) {
  const int lt = t.tid % 128;
  if (op.a[lt] && std::memcmp(op.a[lt], op.a_values[lt], sizeof op.a_values[lt]) != 0) {
    fail("the A registers of the wgmma.mma_async at " + where(op.pc) + " changed before " + who(t.tid) +
         " waited for it (wgmma.wait_group): the wgmma may still read them; write them after the wait");
  }
  // The last of the warpgroup to wait checks that the operands never changed in between.
  if (--op.waiting == 0) {
    for (size_t i = 0; i < op.read_addrs.size(); ++i) {
      uint16_t now = 0;
      std::memcpy(&now, arena_.data() + op.read_addrs[i], size_t(op.elem_bytes));
      if (now != op.read_values[i]) {
        std::ostringstream os;
        os << "shared memory at shared address " << op.read_addrs[i] << ", an operand of the wgmma.mma_async at "
           << where(op.pc) << ", changed before its warpgroup's last thread (" << who(t.tid)
           << ") waited for it (wgmma.wait_group): the wgmma may still read it; every thread of the warpgroup waits, then a "
              "barrier, before its operands are overwritten";
        fail(os.str());
      }
    }
  }
  for (int i = 0; i < op.n / 2; ++i) {
    const MmaRowCol e = wgmma_d_element(lt, i);
    op.dst[lt][i] = op.d[size_t(e.row) * size_t(op.n) + size_t(e.col)];
  }
}

double BlockExecutor::wgmma_operand(uint64_t desc, const WgmmaDesc& d, bool mn_major, int mn, int k, int type, WgmmaOp& op) {
  const uint32_t eb = type == AJ_EMU_E4M3 ? 1 : 2;
  const uint32_t addr = wgmma_element_address(d, mn_major, mn, k, int(eb));
  const size_t limit = launch_.dynamic_shared;
  if (size_t(addr) + eb > limit) {
    std::ostringstream os;
    os << "wgmma.mma_async at " << where(op.pc) << ": descriptor 0x" << std::hex << desc << std::dec << " addresses element ("
       << mn << ", " << k << ") at shared address " << addr << ", outside the block's " << limit << " bytes of dynamic shared memory";
    fail(os.str());
  }
  for (uint32_t b = addr; b < addr + eb; ++b) {
    const Shadow& s = shadow_[b];
    if (s.write_epoch >= block_epoch_ && s.write_epoch != 0 && threads_[s.writer].proxy_fences == s.write_fence) {
      fail("wgmma.mma_async at " + where(op.pc) + " reads shared address " + std::to_string(b) + ", which " + who(s.writer) +
           " wrote at " + where(s.write_pc) +
           " through the generic proxy with no fence.proxy.async after it (wgmma reads through the async proxy)");
    }
  }
  check_tma_visible(addr, eb, wg_observed_, current_->tid, op.pc);
  shared_read(addr, eb, current_->tid, op.pc);
  uint16_t h = 0;
  std::memcpy(&h, arena_.data() + addr, eb);
  op.read_addrs.push_back(addr);
  op.read_values.push_back(h);
  return type == AJ_EMU_E4M3 ? e4m3_to_float(static_cast<uint8_t>(h)) : cvt_f32_of_type(h, type);
}

void BlockExecutor::wgmma(float* d, int n, const unsigned* a_regs, uint64_t a_desc, uint64_t b_desc, int type,
                          int flags, const void* pc) {
  tick();
  Thread& t = *current_;
  if (n < 8 || n > 256 || n % 8) fail("wgmma.mma_async: N must be a multiple of 8 in 8..256, got " + std::to_string(n));
  if (!t.wgmma_fenced) {
    fail("wgmma.mma_async at " + where(pc) + " by " + who(t.tid) +
         " without a wgmma.fence since the thread's last wgmma.wait_group (or the kernel's start): the accumulator and A "
         "registers are not ordered with the thread's own accesses to them");
  }
  t.d = d;
  t.a = a_regs;
  t.num = n;
  t.type = type;
  t.flags = flags;
  t.desc_a = a_desc;
  t.desc_b = b_desc;
  arrive_warpgroup(t, pc);
}

void BlockExecutor::arrive_warpgroup(Thread& t, const void* pc) {
  const int wg = t.tid / 128;
  if (static_cast<int>(threads_.size()) < (wg + 1) * 128)
    fail(who(t.tid) + " runs wgmma.mma_async in a warpgroup of fewer than 128 threads; the block size must be a multiple of 128");
  t.op = Op::Wgmma;
  t.wait_pc = pc;
  t.state = State::AtCollective;
  if (banks_) bank_sync(t);
  if (++warpgroup_arrived_[size_t(wg)] < 128) {
    block_until_released(t);
    return;
  }
  warpgroup_arrived_[size_t(wg)] = 0;
  if (banks_)
    for (int w = 4 * wg; w < 4 * wg + 4; ++w) flush_bank_groups(w);
  execute_wgmma(wg);
  for (int l = 0; l < 128; ++l) {
    threads_[size_t(wg * 128 + l)].state = State::Ready;
    threads_[size_t(wg * 128 + l)].op = Op::None;
  }
  t.state = State::Running;
}

void BlockExecutor::execute_wgmma(int wg) {
  Thread* th = &threads_[size_t(wg * 128)];
  const Thread& t0 = th[0];
  for (int l = 0; l < 128; ++l) {
    const Thread& o = th[l];
    if (o.op != Op::Wgmma || o.wait_pc != t0.wait_pc)
      fail("the threads of warpgroup " + std::to_string(wg) + " are at different instructions: " + who(o.tid) + " at " +
           where(o.wait_pc) + ", " + who(t0.tid) + " at wgmma.mma_async " + where(t0.wait_pc));
    if (o.num != t0.num || o.type != t0.type || o.flags != t0.flags || (o.a == nullptr) != (t0.a == nullptr) ||
        (!o.a && o.desc_a != t0.desc_a) || o.desc_b != t0.desc_b)
      fail("wgmma.mma_async at " + where(t0.wait_pc) + ": the threads of warpgroup " + std::to_string(wg) +
           " disagree on its shape, type, flags or descriptors (" + who(o.tid) + " and " + who(t0.tid) + ")");
  }
  // Bytes a TMA load wrote are operands only once every thread of the warpgroup has observed
  // their mbarrier phase.
  wg_observed_.assign(mbarriers_.size(), UINT32_MAX);
  for (int l = 0; l < 128; ++l)
    for (size_t i = 0; i < wg_observed_.size(); ++i)
      wg_observed_[i] = std::min(wg_observed_[i], i < th[l].observed.size() ? th[l].observed[i] : 0u);
  auto op = std::make_shared<WgmmaOp>();
  op->pc = t0.wait_pc;
  const int n = op->n = t0.num;
  const int type = t0.type, flags = t0.flags;
  for (uint64_t desc : {t0.a ? uint64_t(0) : t0.desc_a, t0.desc_b})
    if (desc && decode_wgmma_desc(desc).base_offset != 0)
      fail("wgmma.mma_async at " + where(op->pc) + ": a descriptor with a non-zero base offset (the emulator expects swizzled "
           "operands to start on their pattern's boundary, as the kernels place them)");
  const double sa = flags & AJ_EMU_WGMMA_NEG_A ? -1.0 : 1.0, sb = flags & AJ_EMU_WGMMA_NEG_B ? -1.0 : 1.0;
  // e4m3: K = 32 per instruction, both shared-memory operands K-major (the PTX ISA gives the
  // 8-bit types no imm-trans), A's registers 4 bytes each.
  const bool fp8 = type == AJ_EMU_E4M3;
  const int kk = fp8 ? 32 : 16;
  op->elem_bytes = fp8 ? 1 : 2;
  if (fp8 && (flags & (AJ_EMU_WGMMA_TRANS_A | AJ_EMU_WGMMA_TRANS_B)))
    fail("wgmma.mma_async at " + where(op->pc) + ": e4m3 operands are K-major only (no imm-trans for 8-bit types); "
         "transpose the operand in shared memory");
  std::vector<double> a(size_t(64 * kk)), b(size_t(kk) * size_t(n));
  const size_t operands = size_t(kk) * size_t(n + (t0.a ? 0 : 64));
  op->read_addrs.reserve(operands);
  op->read_values.reserve(operands);
  if (t0.a) {
    for (int l = 0; l < 128; ++l)
      for (int reg = 0; reg < 4; ++reg) {
        if (fp8) {
          for (int byte = 0; byte < 4; ++byte) {
            const MmaRowCol e = wgmma_a_element_8bit(l, reg, byte);
            a[size_t(e.row * kk + e.col)] = sa * e4m3_to_float(static_cast<uint8_t>(th[l].a[reg] >> (8 * byte)));
          }
          continue;
        }
        for (int half = 0; half < 2; ++half) {
          const MmaRowCol e = wgmma_a_element(l, reg, half);
          a[size_t(e.row * kk + e.col)] = sa * cvt_f32_of_type(static_cast<uint16_t>(th[l].a[reg] >> (16 * half)), type);
        }
      }
  } else {
    const WgmmaDesc da = decode_wgmma_desc(t0.desc_a);
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < kk; ++k)
        a[size_t(m * kk + k)] = sa * wgmma_operand(t0.desc_a, da, flags & AJ_EMU_WGMMA_TRANS_A, m, k, type, *op);
  }
  const WgmmaDesc db = decode_wgmma_desc(t0.desc_b);
  for (int c = 0; c < n; ++c)
    for (int k = 0; k < kk; ++k)
      b[size_t(k * n + c)] = sb * wgmma_operand(t0.desc_b, db, flags & AJ_EMU_WGMMA_TRANS_B, c, k, type, *op);

  // C: each thread's accumulators, or the result of its latest wgmma in flight into the same
  // registers (wgmmas of one shape into one accumulator are ordered without a fence).
  op->d.assign(size_t(64) * size_t(n), 0.0f);
  for (int l = 0; l < 128; ++l) {
    Thread& o = th[l];
    op->dst[l] = o.d;
    if (o.a) {
      op->a[l] = o.a;
      std::memcpy(op->a_values[l], o.a, sizeof op->a_values[l]);
    }
    const WgmmaOp* chained = nullptr;
    for (const auto& group : o.wg_committed)
      for (const auto& p : group)
        if (p->dst[l] == o.d) chained = p.get();
    for (const auto& p : o.wg_open)
      if (p->dst[l] == o.d) chained = p.get();
    if (chained && chained->n != n)
      fail("wgmma.mma_async at " + where(op->pc) + " accumulates into registers a wgmma of another shape (at " +
           where(chained->pc) + ") has in flight");
    for (int i = 0; i < n / 2; ++i) {
      const MmaRowCol e = wgmma_d_element(l, i);
      const size_t at = size_t(e.row) * size_t(n) + size_t(e.col);
      op->d[at] = chained ? chained->d[at] : o.d[i];
    }
  }
  wgmma_m64nNk(a.data(), b.data(), op->d.data(), n, kk, flags & AJ_EMU_WGMMA_SCALE_D);
  for (int l = 0; l < 128; ++l) {
    for (int i = 0; i < n / 2; ++i) th[l].d[i] = std::numeric_limits<float>::quiet_NaN();
    th[l].wg_open.push_back(op);
  }
}

}  // namespace attnjit::emu
