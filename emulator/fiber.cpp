// Fiber switching. On x86-64 a switch saves the callee-saved registers on the old stack, swaps the
// stack pointer and restores them from the new one (what Boost.Context's fcontext does, in a dozen
// instructions and no system call). Elsewhere glibc's swapcontext stands in: correct, but it makes
// a system call per switch, so the emulator is slower there.
#include "emulator/fiber.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <new>

#include "compiler/support/error.hpp"

#ifndef ATTNJIT_FIBER_ASM  // -DATTNJIT_FIBER_ASM=0 forces the swapcontext path (tests it on x86-64)
#if defined(__x86_64__) && defined(__linux__)
#define ATTNJIT_FIBER_ASM 1
#else
#define ATTNJIT_FIBER_ASM 0
#endif
#endif
#if !ATTNJIT_FIBER_ASM
#include <ucontext.h>
#endif

namespace attnjit::emu {

#if ATTNJIT_FIBER_ASM
// aj_fiber_switch(save, to, arg): pushes rbp, rbx, r12-r15, stores rsp in *save, loads `to` as rsp,
// pops the registers saved there and returns into that context with `arg` in rax. A new fiber's
// frame (make_fiber) returns into aj_fiber_start, which calls entry(arg) with entry held in r12.
// Both hidden, as the C++ around them is: the shared libattnjit exports its public API only.
extern "C" void* aj_fiber_switch(void** save, void* to, void* arg);
extern "C" void aj_fiber_start();
asm(R"(
  .text
  .globl aj_fiber_switch
  .hidden aj_fiber_switch
  .type aj_fiber_switch, @function
aj_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  movq %rdx, %rax
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size aj_fiber_switch, .-aj_fiber_switch
  .globl aj_fiber_start
  .hidden aj_fiber_start
  .type aj_fiber_start, @function
aj_fiber_start:
  movq %rax, %rdi
  callq *%r12
  ud2
  .size aj_fiber_start, .-aj_fiber_start
)");

namespace {
struct FiberTls {
  void* scheduler = nullptr;  // the scheduler's saved stack pointer
  void** fiber_slot = nullptr;  // where the running fiber saves its stack pointer when it yields
};
thread_local FiberTls tls;
}  // namespace

FiberContext make_fiber(void* stack_top, size_t, void (*entry)(void*)) {
  // Seven slots (r15, r14, r13, r12 = entry, rbx, rbp, return address); 16-byte alignment at the call.
  const uintptr_t top = reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top - 72);
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  sp[3] = reinterpret_cast<void*>(entry);
  sp[6] = reinterpret_cast<void*>(&aj_fiber_start);
  return sp;
}

FiberContext switch_to_fiber(FiberContext fiber, void* arg) {
  void* saved = nullptr;
  void** const outer = tls.fiber_slot;
  tls.fiber_slot = &saved;
  aj_fiber_switch(&tls.scheduler, fiber, arg);
  tls.fiber_slot = outer;
  return saved;
}

void switch_to_scheduler() { aj_fiber_switch(tls.fiber_slot, tls.scheduler, nullptr); }

#else  // swapcontext

namespace {
struct Fiber {
  ucontext_t ctx;
  void (*entry)(void*);
  void* arg;
};
struct FiberTls {
  ucontext_t scheduler;
  Fiber* running = nullptr;
};
thread_local FiberTls tls;

void start(unsigned hi, unsigned lo) {
  Fiber* f = reinterpret_cast<Fiber*>((uintptr_t{hi} << 32) | lo);
  f->entry(f->arg);
  ATTNJIT_CHECK(false, "an emulated thread returned from its fiber entry");
}
}  // namespace

FiberContext make_fiber(void* stack_top, size_t stack_bytes, void (*entry)(void*)) {
  // The Fiber record lives at the top of its own stack.
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack_top) - sizeof(Fiber)) & ~uintptr_t{63};
  Fiber* f = new (reinterpret_cast<void*>(top)) Fiber{};
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = static_cast<char*>(stack_top) - stack_bytes;
  f->ctx.uc_stack.ss_size = top - reinterpret_cast<uintptr_t>(f->ctx.uc_stack.ss_sp);
  f->ctx.uc_link = nullptr;
  f->entry = entry;
  const uintptr_t p = reinterpret_cast<uintptr_t>(f);
  makecontext(&f->ctx, reinterpret_cast<void (*)()>(start), 2, unsigned(p >> 32), unsigned(p & 0xffffffffu));
  return f;
}

FiberContext switch_to_fiber(FiberContext fiber, void* arg) {
  Fiber* f = static_cast<Fiber*>(fiber);
  f->arg = arg;
  Fiber* const outer = tls.running;
  tls.running = f;
  swapcontext(&tls.scheduler, &f->ctx);
  tls.running = outer;
  return f;
}

void switch_to_scheduler() { swapcontext(&tls.running->ctx, &tls.scheduler); }

#endif

FiberStacks::FiberStacks(size_t count, size_t bytes_each) : count_(count) {
  page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  each_ = (bytes_each + page_ - 1) / page_ * page_ + page_;
  base_ = mmap(nullptr, count_ * each_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw std::bad_alloc();
  }
  for (size_t i = 0; i < count_; ++i) mprotect(static_cast<char*>(base_) + i * each_, page_, PROT_NONE);  // guard
}

FiberStacks::~FiberStacks() {
  if (base_) munmap(base_, count_ * each_);
}

FiberStacks& FiberStacks::operator=(FiberStacks&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, count_ * each_);
    base_ = o.base_, count_ = o.count_, each_ = o.each_, page_ = o.page_;
    o.base_ = nullptr, o.count_ = 0;
  }
  return *this;
}

void* FiberStacks::top(size_t i) const { return static_cast<char*>(base_) + (i + 1) * each_; }

}  // namespace attnjit::emu
