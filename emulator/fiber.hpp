// Fibers: one per emulated GPU thread, switched in user space (on x86-64 a few register moves and
// no system call, as Boost.Context's fcontext does; swapcontext elsewhere). A fiber runs until it
// blocks (a barrier, a warp-collective instruction) or ends, then control returns to its block's
// scheduler.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attnjit::emu {

// Stacks for `count` fibers in one mapping, each below a guard page.
class FiberStacks {
public:
  FiberStacks() = default;
  FiberStacks(size_t count, size_t bytes_each);
  ~FiberStacks();
  FiberStacks(const FiberStacks&) = delete;
  FiberStacks& operator=(const FiberStacks&) = delete;
  FiberStacks(FiberStacks&& o) noexcept { *this = static_cast<FiberStacks&&>(o); }
  FiberStacks& operator=(FiberStacks&& o) noexcept;

  size_t count() const { return count_; }
  void* top(size_t i) const;  // highest address of stack i (stacks grow down)
  size_t usable() const { return each_ - page_; }
  bool contains(const void* p) const {
    return reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base_) < count_ * each_;
  }

private:
  void* base_ = nullptr;
  size_t count_ = 0, each_ = 0, page_ = 0;
};

// A suspended execution context.
using FiberContext = void*;

// Starts `entry(arg)` on the stack below `stack_top`. The fiber first runs at the first
// switch_to_fiber(); it must never return from `entry` (it switches back for the last time).
FiberContext make_fiber(void* stack_top, size_t stack_bytes, void (*entry)(void* arg));

// Scheduler side: runs `fiber` until it switches back; returns its new suspended context. `arg`
// reaches `entry` on the fiber's first run.
FiberContext switch_to_fiber(FiberContext fiber, void* arg);

// Fiber side: suspends the running fiber and returns to the scheduler that last switched to it.
void switch_to_scheduler();

}  // namespace attnjit::emu
