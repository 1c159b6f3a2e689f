#include "bench/fiber_scheduler.h"

#include <atomic>
#include <fstream>
#include <cxxabi.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "base/errors.h"

namespace ddprun::bench {

using rendezvous::Clock;

namespace {

// The C++ runtime's per-thread exception state (libstdc++'s __cxa_eh_globals: the stack of
// exceptions being handled, the count of uncaught ones). Fibers share their thread's, so a
// fiber that parks inside a catch block would have its handled exception popped by another
// fiber's; each fiber keeps its own copy, swapped in and out with its stack.
struct EhGlobals {
  void* caughtExceptions = nullptr;
  unsigned int uncaughtExceptions = 0;
};
EhGlobals& ehGlobals() { return *reinterpret_cast<EhGlobals*>(abi::__cxa_get_globals()); }

constexpr uint64_t kEventTag = ~uint64_t{0};  // the eventfd's epoll data

}  // namespace

#if DDPRUN_FIBER_ASM_SWITCH
// The context switch on x86-64: swapcontext() also saves and restores the signal mask, one
// rt_sigprocmask syscall per switch (about 8 % of the simulated agents' CPU at 10,000). The
// fibers never change their signal mask, so this switch keeps only what the System V ABI
// says a callee preserves: rbx, rbp, r12-r15, the stack pointer, and the MXCSR and x87
// control words. ddprun_fiber_switch(&from, to) saves them on the current stack, stores that
// stack pointer in `from`, and resumes the stack `to` was saved from (or made by makeStack).
// A new stack "returns" into ddprun_fiber_entry, which calls entry(rbx) with rbx = the
// scheduler; entry never returns.
extern "C" void ddprun_fiber_switch(void** from, void* to);
extern "C" void ddprun_fiber_entry();
asm(R"(
  .text
  .globl ddprun_fiber_switch
  .type ddprun_fiber_switch, @function
ddprun_fiber_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size ddprun_fiber_switch, .-ddprun_fiber_switch

  .globl ddprun_fiber_entry
  .type ddprun_fiber_entry, @function
ddprun_fiber_entry:
  .cfi_startproc
  .cfi_undefined rip
  movq %rbx, %rdi
  call *%r12
  ud2
  .cfi_endproc
  .size ddprun_fiber_entry, .-ddprun_fiber_entry
)");

namespace {
// A fresh stack whose first switch lands in ddprun_fiber_entry, which calls entry(arg).
void* makeStack(char* base, size_t bytes, void (*entry)(void*), void* arg) {
  auto top = reinterpret_cast<uintptr_t>(base + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  // From the top: the address ret jumps to (then rsp = top, 16-aligned before entry's call),
  // rbp, rbx, r12, r13, r14, r15, MXCSR, x87 control word -- the order the switch pops them.
  *--slot = reinterpret_cast<uint64_t>(&ddprun_fiber_entry);
  *--slot = 0;                                     // rbp
  *--slot = reinterpret_cast<uint64_t>(arg);       // rbx
  *--slot = reinterpret_cast<uint64_t>(entry);     // r12
  *--slot = 0;                                     // r13
  *--slot = 0;                                     // r14
  *--slot = 0;                                     // r15
  *--slot = 0x1F80;                                // MXCSR: the default
  *--slot = 0x037F;                                // x87 control word: the default
  return slot;
}
}  // namespace
#endif

struct FiberScheduler::Fiber {
  uint32_t id = 0;
  uint32_t generation = 0;  // of the current park; a waker holding an older one is stale
  Woken woken = Woken::No;
#if DDPRUN_FIBER_ASM_SWITCH
  void* sp = nullptr;  // where ddprun_fiber_switch saved it
#else
  ucontext_t context{};
#endif
  char* stack = nullptr;  // the mapping, guard page first
  std::function<void()> body;
  EhGlobals eh;
};

namespace {
std::atomic<size_t>& guardedFibers() {
  static std::atomic<size_t> n{0};
  return n;
}
std::atomic<bool>& warnedUnguarded() {
  static std::atomic<bool> w{false};
  return w;
}
// Guard pages for at most a quarter of vm.max_map_count's mappings (each costs two).
size_t guardBudget() {
  static const size_t budget = [] {
    size_t limit = 65530;
    std::ifstream in("/proc/sys/vm/max_map_count");
    in >> limit;
    return limit / 8;
  }();
  return budget;
}
}  // namespace

FiberScheduler::FiberScheduler(size_t stackBytes) : stackBytes_(stackBytes) {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  event_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_ < 0 || event_ < 0) throw Error(std::string("fiber scheduler: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kEventTag;
  ::epoll_ctl(epoll_, EPOLL_CTL_ADD, event_, &ev);
}

FiberScheduler::~FiberScheduler() {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (auto& f : fibers_) ::munmap(f->stack, stackBytes_ + page);
  ::close(epoll_);
  ::close(event_);
}

void FiberScheduler::spawn(std::function<void()> body) {
  Fiber* f;
  if (!freeFibers_.empty()) {
    f = freeFibers_.back();
    freeFibers_.pop_back();
  } else {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* m = ::mmap(nullptr, stackBytes_ + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) {
      throw Error("fiber scheduler: cannot map a stack of " + std::to_string(stackBytes_) +
                  " bytes for fiber " + std::to_string(fibers_.size()) + ": " + std::strerror(errno) +
                  " (vm.max_map_count?)");
    }
    // A stack overflow faults instead of corrupting a neighbour -- but a guard page splits the
    // mapping in two, and the kernel allows vm.max_map_count (65,530 by default) mappings per
    // process: 10,000 simulated etcd agents run 4 fibers each (the agent, its round watcher,
    // its lease keeper and watcher), 80,000 mappings with guards. So the first fibers of the
    // process (up to a quarter of the limit's worth, the rest left to malloc, sockets and
    // libraries) get a guard page; the later ones none, and their mappings merge.
    if (guardedFibers().fetch_add(1) < guardBudget()) {
      ::mprotect(m, page, PROT_NONE);
    } else if (!warnedUnguarded().exchange(true)) {
      std::fprintf(stderr, "fiber scheduler: more than %zu fibers: the later stacks have no guard "
                   "page (vm.max_map_count)\n", guardBudget());
    }
    fibers_.push_back(std::make_unique<Fiber>());
    f = fibers_.back().get();
    f->id = static_cast<uint32_t>(fibers_.size() - 1);
    f->stack = static_cast<char*>(m);
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  f->body = std::move(body);
  f->eh = EhGlobals{};
  f->woken = Woken::Ready;
#if DDPRUN_FIBER_ASM_SWITCH
  f->sp = makeStack(f->stack + page, stackBytes_, &FiberScheduler::entry, this);
#else
  ::getcontext(&f->context);
  f->context.uc_stack.ss_sp = f->stack + page;
  f->context.uc_stack.ss_size = stackBytes_;
  f->context.uc_link = nullptr;
  const auto self = reinterpret_cast<uintptr_t>(this);
  ::makecontext(&f->context, reinterpret_cast<void (*)()>(&FiberScheduler::trampoline), 2,
                static_cast<unsigned>(self >> 32), static_cast<unsigned>(self & 0xffffffffu));
#endif
  ++live_;
  runnable_.push_back(f);
}

void FiberScheduler::trampoline(unsigned hi, unsigned lo) {
  entry(reinterpret_cast<FiberScheduler*>((static_cast<uintptr_t>(hi) << 32) | lo));
}

void FiberScheduler::entry(void* scheduler) {
  auto* s = static_cast<FiberScheduler*>(scheduler);
  Fiber* f = s->current_;
  try {
    f->body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fiber %u: uncaught exception: %s\n", f->id, e.what());
    std::terminate();
  }
  f->body = nullptr;
  --s->live_;
  s->freeFibers_.push_back(f);
  // Back to the scheduler for good: this context is remade by the next spawn that reuses it.
  f->eh = ehGlobals();
  s->current_ = nullptr;
#if DDPRUN_FIBER_ASM_SWITCH
  ddprun_fiber_switch(&f->sp, s->mainSp_);  // f->sp is remade by the next spawn
  __builtin_unreachable();
#else
  ::setcontext(&s->main_);
  __builtin_unreachable();
#endif
}

void FiberScheduler::switchTo(Fiber* f) {
  const EhGlobals mine = ehGlobals();
  ehGlobals() = f->eh;
  current_ = f;
  ++switches_;
#if DDPRUN_FIBER_ASM_SWITCH
  ddprun_fiber_switch(&mainSp_, f->sp);
#else
  ::swapcontext(&main_, &f->context);
#endif
  current_ = nullptr;
  ehGlobals() = mine;
}

FiberScheduler::Woken FiberScheduler::suspend(Clock::time_point deadline) {
  Fiber* f = current_;
  DDPRUN_CHECK(f != nullptr, "a fiber wait outside a fiber (on the scheduler's own stack)");
  if (deadline != Clock::time_point::max()) timers_.push(Timer{deadline, f->id, f->generation});
  f->woken = Woken::No;
  f->eh = ehGlobals();
  // The scheduler restores our exception state.
#if DDPRUN_FIBER_ASM_SWITCH
  ddprun_fiber_switch(&f->sp, mainSp_);
#else
  ::swapcontext(&f->context, &main_);
#endif
  ++f->generation;
  return f->woken;
}

bool FiberScheduler::resume(Fiber* f, Woken why, uint32_t generation) {
  if (f->generation != generation || f->woken != Woken::No || !f->body) return false;
  f->woken = why;
  runnable_.push_back(f);
  return true;
}

void FiberScheduler::run() {
  Blocking* previous = Blocking::current();
  Blocking::install(this);
  epoll_event events[1024];
  while (live_ > 0) {
    while (!runnable_.empty()) {
      Fiber* f = runnable_.front();
      runnable_.pop_front();
      switchTo(f);
    }
    if (live_ == 0) break;
    int timeoutMs = -1;
    if (!timers_.empty()) {
      const auto left = timers_.top().at - Clock::now();
      timeoutMs = left.count() <= 0
                      ? 0
                      : static_cast<int>(std::min<int64_t>(
                            std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1 << 30));
    }
    const int n = ::epoll_wait(epoll_, events, 1024, timeoutMs);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kEventTag) {
        drainPosts();
        continue;
      }
      onSocketEvent(static_cast<int>(tag), events[i].events);
    }
    fireTimers();
  }
  drainPosts();
  Blocking::install(previous);
}

void FiberScheduler::fireTimers() {
  const auto now = Clock::now();
  while (!timers_.empty() && timers_.top().at <= now) {
    const Timer t = timers_.top();
    timers_.pop();
    resume(fibers_[t.id].get(), Woken::Timer, t.generation);
  }
}

void FiberScheduler::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> g(postMu_);
    posts_.push_back(std::move(fn));
  }
  const uint64_t one = 1;
  (void)!::write(event_, &one, sizeof one);
}

void FiberScheduler::drainPosts() {
  uint64_t count;
  (void)!::read(event_, &count, sizeof count);
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard<std::mutex> g(postMu_);
    fns.swap(posts_);
  }
  for (auto& fn : fns) fn();
}

void FiberScheduler::sleepUntil(Clock::time_point t) {
  while (Clock::now() < t) suspend(t);
}

int FiberScheduler::poll(int fd, short events, Clock::time_point deadline) {
  return waitFd(fd, events, deadline, nullptr);
}

int FiberScheduler::pollOrWake(int fd, short events, Clock::time_point deadline,
                               const void* channel) {
  return waitFd(fd, events, deadline, channel);
}

int FiberScheduler::waitFd(int fd, short events, Clock::time_point deadline,
                           const void* channel) {
  if (current_ == nullptr || deadline <= Clock::now() || fd < 0) {  // one look, without waiting
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, 0);
  }
  // Each socket is registered once (edge-triggered), not re-armed per wait: an epoll_ctl per
  // wait was about 6 % of the simulated agents' CPU at 10,000. Edge-triggered is enough
  // because a caller waits after its read or write found nothing to do, and readiness that
  // arrived while it was not waiting is remembered (onSocketEvent).
  if (static_cast<size_t>(fd) >= fds_.size()) fds_.resize(static_cast<size_t>(fd) + 1);
  if (!fds_[fd].registered) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = static_cast<uint64_t>(fd);
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) return -1;
    fds_[fd] = FdState{.registered = true};  // the kernel reports the current readiness
  }
  FdState& s = fds_[fd];
  const bool wantIn = (events & POLLIN) != 0, wantOut = (events & POLLOUT) != 0;
  if ((wantIn && s.readyIn) || (wantOut && s.readyOut)) {
    if (wantIn) s.readyIn = false;
    if (wantOut) s.readyOut = false;
    return 1;
  }
  s.waiting = true;
  s.want = events;
  s.fiber = current_->id;
  s.generation = current_->generation;
  const uint32_t id = current_->id, generation = current_->generation;
  if (channel) parked_.emplace(channel, std::make_pair(id, generation));
  const Woken w = suspend(deadline);
  fds_[fd].waiting = false;  // fds_ may have grown meanwhile: no reference kept across
  if (channel && w != Woken::Channel) unpark(channel, id, generation);
  return w == Woken::Ready ? 1 : 0;
}

void FiberScheduler::onSocketEvent(int fd, uint32_t events) {
  if (fd < 0 || static_cast<size_t>(fd) >= fds_.size() || !fds_[fd].registered) return;
  FdState& s = fds_[fd];
  const bool in = (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
  const bool out = (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0;
  bool tookIn = false, tookOut = false;
  if (s.waiting) {
    const bool match = ((s.want & POLLIN) && in) || ((s.want & POLLOUT) && out);
    if (match && resume(fibers_[s.fiber].get(), Woken::Ready, s.generation)) {
      s.waiting = false;
      tookIn = (s.want & POLLIN) && in;
      tookOut = (s.want & POLLOUT) && out;
    }
  }
  if (in && !tookIn) s.readyIn = true;
  if (out && !tookOut) s.readyOut = true;
}

void FiberScheduler::forget(int fd) {
  if (fd < 0 || static_cast<size_t>(fd) >= fds_.size() || !fds_[fd].registered) return;
  // Closing removes the registration too, unless another process still holds the socket (a
  // child between fork and exec): then its events would reach whichever socket gets this number.
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  fds_[fd] = FdState{};
}

bool FiberScheduler::park(std::unique_lock<std::mutex>* lock, const void* channel,
                          Clock::time_point deadline) {
  DDPRUN_CHECK(current_ != nullptr, "a fiber wait outside a fiber (on the scheduler's own stack)");
  const uint32_t id = current_->id, generation = current_->generation;
  parked_.emplace(channel, std::make_pair(id, generation));
  if (lock) lock->unlock();
  const Woken w = suspend(deadline);
  if (w != Woken::Channel) unpark(channel, id, generation);  // else wake() erased it
  if (lock) lock->lock();
  return w != Woken::Timer;
}

void FiberScheduler::unpark(const void* channel, uint32_t id, uint32_t generation) {
  auto [b, e] = parked_.equal_range(channel);
  for (auto it = b; it != e; ++it) {
    if (it->second.first == id && it->second.second == generation) {
      parked_.erase(it);
      return;
    }
  }
}

void FiberScheduler::wake(const void* channel) {
  auto [b, e] = parked_.equal_range(channel);
  for (auto it = b; it != e; ++it) resume(fibers_[it->second.first].get(), Woken::Channel, it->second.second);
  parked_.erase(b, e);
}

std::function<void()> FiberScheduler::start(std::function<void()> body) {
  auto done = std::make_shared<bool>(false);
  spawn([this, done, body = std::move(body)] {
    body();
    *done = true;
    wake(done.get());
  });
  return [this, done] {
    while (!*done) park(nullptr, done.get(), Clock::time_point::max());
  };
}

FiberPool::FiberPool(int count, size_t stackBytes) {
  DDPRUN_CHECK(count >= 1, "a fiber pool of " << count << " schedulers");
  for (int i = 0; i < count; ++i) schedulers_.push_back(std::make_unique<FiberScheduler>(stackBytes));
}

FiberPool::~FiberPool() { join(); }

void FiberPool::start() {
  for (auto& s : schedulers_) threads_.emplace_back([p = s.get()] { p->run(); });
}

void FiberPool::postAll(const std::function<void(FiberScheduler&)>& fn) {
  for (auto& s : schedulers_) s->post([fn, p = s.get()] { fn(*p); });
}

void FiberPool::join() {
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace ddprun::bench
