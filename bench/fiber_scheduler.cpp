#include "bench/fiber_scheduler.h"

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

struct FiberScheduler::Fiber {
  uint32_t id = 0;
  uint32_t generation = 0;  // of the current park; a waker holding an older one is stale
  Woken woken = Woken::No;
  ucontext_t context{};
  char* stack = nullptr;  // the mapping, guard page first
  std::function<void()> body;
  EhGlobals eh;
};

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
    ::mprotect(m, page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
    fibers_.push_back(std::make_unique<Fiber>());
    f = fibers_.back().get();
    f->id = static_cast<uint32_t>(fibers_.size() - 1);
    f->stack = static_cast<char*>(m);
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  f->body = std::move(body);
  f->eh = EhGlobals{};
  f->woken = Woken::Ready;
  ::getcontext(&f->context);
  f->context.uc_stack.ss_sp = f->stack + page;
  f->context.uc_stack.ss_size = stackBytes_;
  f->context.uc_link = nullptr;
  const auto self = reinterpret_cast<uintptr_t>(this);
  ::makecontext(&f->context, reinterpret_cast<void (*)()>(&FiberScheduler::trampoline), 2,
                static_cast<unsigned>(self >> 32), static_cast<unsigned>(self & 0xffffffffu));
  ++live_;
  runnable_.push_back(f);
}

void FiberScheduler::trampoline(unsigned hi, unsigned lo) {
  auto* s = reinterpret_cast<FiberScheduler*>((static_cast<uintptr_t>(hi) << 32) | lo);
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
  ::setcontext(&s->main_);
}

void FiberScheduler::switchTo(Fiber* f) {
  const EhGlobals mine = ehGlobals();
  ehGlobals() = f->eh;
  current_ = f;
  ++switches_;
  ::swapcontext(&main_, &f->context);
  current_ = nullptr;
  ehGlobals() = mine;
}

FiberScheduler::Woken FiberScheduler::suspend(Clock::time_point deadline) {
  Fiber* f = current_;
  DDPRUN_CHECK(f != nullptr, "a fiber wait outside a fiber (on the scheduler's own stack)");
  if (deadline != Clock::time_point::max()) timers_.push(Timer{deadline, f->id, f->generation});
  f->woken = Woken::No;
  f->eh = ehGlobals();
  ::swapcontext(&f->context, &main_);  // the scheduler restores our exception state
  ++f->generation;
  return f->woken;
}

void FiberScheduler::resume(Fiber* f, Woken why, uint32_t generation) {
  if (f->generation != generation || f->woken != Woken::No || !f->body) return;
  f->woken = why;
  runnable_.push_back(f);
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
      const auto id = static_cast<uint32_t>(tag >> 32);
      if (id < fibers_.size()) resume(fibers_[id].get(), Woken::Ready, static_cast<uint32_t>(tag));
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
  if (current_ == nullptr || deadline <= Clock::now()) {  // one look, without waiting
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, 0);
  }
  epoll_event ev{};
  ev.events = EPOLLONESHOT | ((events & POLLIN) ? EPOLLIN : 0u) | ((events & POLLOUT) ? EPOLLOUT : 0u);
  ev.data.u64 = (static_cast<uint64_t>(current_->id) << 32) | current_->generation;
  if (::epoll_ctl(epoll_, EPOLL_CTL_MOD, fd, &ev) != 0) {
    if (errno != ENOENT || ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) return -1;
  }
  return suspend(deadline) == Woken::Ready ? 1 : 0;
}

bool FiberScheduler::park(std::unique_lock<std::mutex>* lock, const void* channel,
                          Clock::time_point deadline) {
  DDPRUN_CHECK(current_ != nullptr, "a fiber wait outside a fiber (on the scheduler's own stack)");
  parked_.emplace(channel, std::make_pair(current_->id, current_->generation));
  if (lock) lock->unlock();
  const Woken w = suspend(deadline);
  if (lock) lock->lock();
  return w != Woken::Timer;
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
