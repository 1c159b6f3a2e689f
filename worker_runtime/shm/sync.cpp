#include "worker_runtime/shm/sync.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <sstream>

#include "base/errors.h"
#include "base/process.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DDPRUN_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define DDPRUN_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define DDPRUN_CPU_RELAX() ((void)0)
#endif

namespace ddprun::runtime::shm {
namespace {

bool reached(uint32_t value, uint32_t step) { return static_cast<int32_t>(value - step) >= 0; }

// Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
void futexWait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::milliseconds timeout) {
  timespec ts{.tv_sec = static_cast<time_t>(timeout.count() / 1000),
              .tv_nsec = static_cast<long>(timeout.count() % 1000) * 1'000'000};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

PhaseSync::PhaseSync(RankControl* control, int rank, int size, SyncOptions options)
    : control_(control), rank_(rank), size_(size), options_(options),
      mine_(control[rank].step.load()) {}

uint32_t PhaseSync::post() {
  ++mine_;
  // seq_cst store then seq_cst load, against the sleeper's increment then re-check: either we
  // see its sleepers count, or it sees our step (no lost wake-up).
  control_[rank_].step.store(mine_, std::memory_order_seq_cst);
  if (control_[rank_].sleepers.load(std::memory_order_seq_cst) != 0) {
    futexWakeAll(&control_[rank_].step);
  }
  return mine_;
}

void PhaseSync::waitAll(uint32_t step, Clock::time_point deadline) {
  for (int j = 0; j < size_; ++j) {
    if (j != rank_) waitFor(j, step, deadline);
  }
}

void PhaseSync::waitFor(int peer, uint32_t step, Clock::time_point deadline) {
  RankControl& c = control_[peer];
  if (reached(c.step.load(std::memory_order_acquire), step)) return;
  const auto start = Clock::now();
  const auto spinUntil = start + std::chrono::microseconds(options_.spinMicros);
  for (int i = 1; options_.spinMicros > 0; ++i) {
    if (reached(c.step.load(std::memory_order_acquire), step)) return;
    DDPRUN_CPU_RELAX();
    if ((i & 63) == 0 && Clock::now() >= spinUntil) break;
  }
  const auto yieldUntil = start + std::chrono::microseconds(options_.yieldMicros);
  while (Clock::now() < yieldUntil) {
    if (reached(c.step.load(std::memory_order_acquire), step)) return;
    ::sched_yield();
  }
  // The first sleeps are short (1, 2, 4 ms, then pollMillis): a peer that dies in the middle of
  // a collective, where the others wait only a step's skew for it, is seen within a few ms (its
  // death cannot wake our futex); one that waits long checks every pollMillis.
  auto poll = std::chrono::milliseconds(std::min(1, options_.pollMillis));
  const auto maxPoll = std::chrono::milliseconds(options_.pollMillis);
  while (true) {
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c.step.load(std::memory_order_seq_cst);
    if (!reached(seen, step)) futexWait(&c.step, seen, poll);
    poll = std::min(poll * 2, maxPoll);
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(c.step.load(std::memory_order_acquire), step)) return;
    if (const std::string why = peerProblem(peer); !why.empty()) throw BackendError(why);
    if (Clock::now() >= deadline) {
      std::ostringstream os;
      os << "timed out waiting for local rank " << peer << " (pid " << c.pid.load()
         << ") to reach phase " << step << " (it is at " << c.step.load()
         << "): is it stopped or stuck outside the collective?";
      throw TimeoutError(os.str());
    }
  }
}

std::string PhaseSync::peerProblem(int peer) const {
  const RankControl& c = control_[peer];
  if (c.aborted.load(std::memory_order_acquire) != 0) {
    return "local rank " + std::to_string(peer) + " aborted the collective (it failed first)";
  }
  // processExiting, not processDead: a SIGKILLed peer is a zombie only once the kernel has freed
  // its memory (tens of ms for a LibTorch process), but it never posts again from the moment its
  // exit began (base/process.h).
  if (const int32_t pid = c.pid.load(); processExiting(pid)) {
    return "local rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
           ") died during the collective";
  }
  return "";
}

void PhaseSync::checkPeers() const {
  for (int j = 0; j < size_; ++j) {
    if (j != rank_ && control_[j].aborted.load(std::memory_order_relaxed) != 0) {
      throw BackendError(peerProblem(j));
    }
  }
}

void PhaseSync::abort() {
  control_[rank_].aborted.store(1, std::memory_order_seq_cst);
  // Wakes whoever sleeps on our counter (the value stays: a wait must never think we posted);
  // they see the flag at once, and anyone who missed the wake-up within pollMillis.
  futexWakeAll(&control_[rank_].step);
}

}  // namespace ddprun::runtime::shm
