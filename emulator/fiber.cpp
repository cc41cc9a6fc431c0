#include "emulator/fiber.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/detail/fcontext.hpp>
#include <new>

#include "compiler/error.hpp"

namespace attnjit::emu {
namespace ctx = boost::context::detail;

namespace {

// Per OS thread: the scheduler context to return to, and the entry of a fiber's first run.
struct FiberTls {
  ctx::fcontext_t scheduler = nullptr;
  void (*entry)(void*) = nullptr;
};
thread_local FiberTls tls;

void trampoline(ctx::transfer_t t) {
  tls.scheduler = t.fctx;
  tls.entry(t.data);
  ATTNJIT_CHECK(false, "an emulated thread returned from its fiber entry");
}

}  // namespace

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

FiberContext make_fiber(void* stack_top, size_t stack_bytes, void (*entry)(void*)) {
  tls.entry = entry;
  return ctx::make_fcontext(stack_top, stack_bytes, trampoline);
}

FiberContext switch_to_fiber(FiberContext fiber, void* arg) {
  return ctx::jump_fcontext(static_cast<ctx::fcontext_t>(fiber), arg).fctx;
}

void switch_to_scheduler() {
  const ctx::transfer_t t = ctx::jump_fcontext(tls.scheduler, nullptr);
  tls.scheduler = t.fctx;
}

}  // namespace attnjit::emu
