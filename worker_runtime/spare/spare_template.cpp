#include "worker_runtime/spare/spare_template.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "base/errors.h"
#include "base/fd_passing.h"
#include "base/log.h"
#include "base/process.h"
#include "rendezvous/spare_fork.h"
#include "worker_runtime/spare/spare_guard.h"
#include "worker_runtime/spare/written_pages.h"

namespace ddprun::runtime {

namespace {

namespace wire = rendezvous::spare_fork;

void reply(int fd, int32_t kind, int32_t value) {
  const wire::Reply r{kind, value};
  sendAll(fd, &r, sizeof r);
}

// The descriptor the launcher sends first to a template forked from a rank (its output), or
// -1: none within a second (the launcher sent it before the rank started), or not one.
int receiveOutput(int fd) {
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, 1000);
  } while (rc < 0 && errno == EINTR);
  if (rc <= 0) return -1;
  wire::Output head{.magic = 0};
  int out[1] = {-1};
  size_t got = 0;
  const ssize_t n = receiveWithFds(fd, &head, sizeof head, out, got);
  if (n == static_cast<ssize_t>(sizeof head) && head.magic == wire::kOutputMagic && got == 1) {
    return out[0];
  }
  if (got == 1) ::close(out[0]);
  return -1;
}

int64_t millisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start).count();
}

}  // namespace

int threadCount() {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(d);
  return n;
}

namespace {

// fork() as a raw clone, for X below: X shares the template's memory (vfork), where glibc's
// fork handlers must not run (they lock and reset the allocator's state of the template, which
// is suspended). The child G gets a copy as forkAsSibling()'s does, with the same reasoning.
pid_t rawFork() {
  return static_cast<pid_t>(::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, nullptr));
}

// Exits 3 (the launcher then exec's the spares) unless this process has one thread: a fork
// copies only the calling thread. The line reads `before` <threads> `after`.
void exitUnlessOneThread(pid_t self, const char* before, const char* after) {
  const int threads = threadCount();
  if (threads == 1) return;
  DDPRUN_LOG(ERROR, "runtime") << "spare template (pid " << self << "): " << before << threads
                               << after << ", so it cannot fork spares (a fork copies only the "
                               << "calling thread); exiting: the launcher starts its spares as "
                               << "processes";
  std::fflush(nullptr);
  ::_exit(3);
}

}  // namespace

bool forkTemplateFromRank(int fd, bool idle) {
  const pid_t rank = ::getpid();
  const int threads = threadCount();
  if (threads != 1) {
    DDPRUN_LOG(WARN, "runtime") << "no spare template forked from this process (pid " << rank
                                << "): it has " << threads << " threads when it calls init() "
                                << "(a fork copies only the calling thread); the launcher "
                                << "starts the template as a process";
    ::close(fd);
    ::unsetenv(wire::kTemplateForkFdVariable);
    return false;
  }
  std::fflush(nullptr);  // nothing the rank buffered may come out of the template too
  const pid_t x = ::fork();
  if (x == 0) {
    // Out of the rank's process group (a signal to the rank's group is not for it), not out of
    // its session: the scheduler's autogroups are per session, and a spare forked in a session
    // of its own got a CPU share equal to all the ranks' together (the group trained 30% slower).
    ::setpgid(0, 0);
    const pid_t t = ::fork();
    if (t != 0) ::_exit(t > 0 ? 0 : 1);  // the template is orphaned: re-parented to ddprun
    // Not the rank's output: the launcher reads a worker's pipes until every writer closed
    // them, and the template outlives the rank it was forked from.
    int out = receiveOutput(fd);
    if (out < 0) out = ::open("/dev/null", O_WRONLY);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    if (out >= 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
    }
    for (const int f : {in, out}) {
      if (f > STDERR_FILENO) ::close(f);
    }
    if (idle) {
      const sched_param none{};
      ::sched_setscheduler(0, SCHED_IDLE, &none);  // as a background template exec'd is
    }
    DDPRUN_LOG(INFO, "runtime") << "spare template (pid " << ::getpid() << ") forked from the "
                                << "rank with pid " << rank << " at its init()";
    reply(fd, wire::Reply::Loading, ::getpid());  // what the launcher moves out of SCHED_IDLE
    return true;
  }
  const int err = errno;
  if (x > 0) {
    int st;
    while (::waitpid(x, &st, 0) < 0 && errno == EINTR) {
    }
  } else {
    DDPRUN_LOG(WARN, "runtime") << "no spare template forked from this process (pid " << rank
                                << "): fork: " << std::strerror(err) << "; the launcher starts "
                                << "the template as a process";
  }
  ::close(fd);
  // Not for the rank's own children: a ddprun program among them would take whatever then
  // has this descriptor number for a template's socket.
  ::unsetenv(wire::kTemplateForkFdVariable);
  return false;
}

ForkedSpare serveSpareForks(int fd, const std::function<bool()>& warmUp,
                            const ServeOptions& options) {
  const pid_t self = ::getpid();
  log::setIdentity("spare template");
  exitUnlessOneThread(self, "the program has ", " threads when it calls init()");
  const bool warm = warmUp();
  exitUnlessOneThread(self, "the program's spare warm-up left ", " threads");
  // A template forked from a rank: what its warm-up wrote, which each spare it forks copies
  // before it says ready (written_pages.h). An exec'd template shares no page with anyone.
  WrittenPages written;
  if (warm && options.guardsAsSiblings) {
    const auto start = std::chrono::steady_clock::now();
    written = exclusivePages();
    DDPRUN_LOG(INFO, "runtime") << "spare template (pid " << self << "): its warm-up wrote "
                                << written.pages << " of its " << written.present << " pages ("
                                << written.runs.size() << " runs; found in " << millisSince(start)
                                << " ms)";
    // Most of them its own: the rank it shared them with is gone, and they tell nothing.
    if (written.pages * 2 > written.present) written = {};
  }
  // Whether a guard may fork its spare at idle priority: only if it can come back from it.
  std::string notIdle;
  const bool idleForks = canLeaveIdlePriority(notIdle);
  // A spare forked ahead of the request (spare_guard.h), before Ready: a death that finds the
  // template ready finds that spare too. The next one once a second has passed without another
  // request (not during the grow back that took this one), at the template's first priority.
  // (volatile: the vfork below runs on this stack; GCC's -Wclobbered)
  const volatile bool ahead = options.guardsAsSiblings && options.forkAhead;
  const int startPolicy = ::sched_getscheduler(0);
  spare::Prepared prepared;
  auto prepareNext = [&](bool first) -> std::optional<ForkedSpare> {
    DDPRUN_CHECK(threadCount() == 1, "the spare template forks from its only thread");
    const sched_param none{};
    if (startPolicy == SCHED_IDLE && idleForks && ::sched_getscheduler(0) != SCHED_IDLE) {
      ::sched_setscheduler(0, SCHED_IDLE, &none);  // the agent moves it out for a grow back
    }
    if (auto s = spare::prepare(fd, self, written, idleForks, prepared)) return ForkedSpare{s->id, warm};
    if (!first && prepared.guard > 0) {
      DDPRUN_LOG(INFO, "runtime") << "spare template (pid " << self << "): the next spare "
                                  << "forked ahead of its request, guard pid " << prepared.guard;
    }
    return std::nullopt;
  };
  if (ahead) {
    if (auto s = prepareNext(true)) return *s;
  }
  reply(fd, wire::Reply::Ready, self);
  DDPRUN_LOG(INFO, "runtime") << "spare template (pid " << self << ") ready: loaded, forks "
                              << "the spares started from now on"
                              << (prepared.guard > 0 ? " (one forked ahead, guard pid " +
                                                           std::to_string(prepared.guard) + ")"
                                                     : "")
                              << (idleForks ? "" : " (a spare asked at idle priority is forked at "
                                                   "normal priority: this process has " + notIdle + ")");
  for (;;) {
    if (ahead && prepared.guard < 0) {
      pollfd p{fd, POLLIN, 0};
      int rc;
      do {
        rc = ::poll(&p, 1, kForkAheadDelayMs);
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        if (auto s = prepareNext(false)) return *s;
      }
    }
    spare::Request r;
    if (!spare::receive(fd, r)) {
      std::fflush(nullptr);
      ::_exit(0);  // the launcher closed the socket: the group ended (no static destructors)
    }
    // Nothing in this loop starts a thread: it is the invariant the fork stands on.
    DDPRUN_CHECK(threadCount() == 1, "the spare template forks from its only thread");
    if (prepared.guard > 0) {
      const pid_t guard = prepared.guard;
      if (spare::handOver(prepared, r)) {
        r.closeFds();
        reply(fd, wire::Reply::Forked, guard);
        continue;
      }
      DDPRUN_LOG(WARN, "runtime") << "spare template (pid " << self << "): the spare forked "
                                  << "ahead (guard pid " << guard << ") is gone; forking one";
    }
    std::fflush(nullptr);  // nothing the template buffered may come out of the spare too
    if (options.guardsAsSiblings) {
      const pid_t guard = spare::forkAsSibling();
      if (guard == 0) {
        const spare::Spare s = spare::becomeGuardAndSpare(fd, r, self, idleForks,
                                                          ::sched_getscheduler(0), written);
        return {.id = s.id, .warm = warm};
      }
      const int err = errno;
      r.closeFds();
      // G's own setpgid() may still be to come: the agent, its parent, sets it too on Forked.
      reply(fd, guard > 0 ? wire::Reply::Forked : wire::Reply::Failed, guard > 0 ? guard : err);
      continue;
    }
    // X is a vfork: it shares the template's memory and stack (the template waits until X
    // exits), so the program's image is copied for G and then for W, not for X too. Each copy
    // of its page tables took 4-14 ms here, on the cores the ranks train on: a spare forked
    // after a recovery slowed the group's next steps by ~35 ms in all, a third of it X's.
    // Until its _exit, X makes only system calls (a raw clone, setpgid, the reply's send):
    // nothing that writes the template's memory but its own stack below this frame.
    // A spare asked at idle priority: X clones G under SCHED_IDLE, so that the copy of the
    // page tables for G (4-9 ms here) also takes only what CPU time the ranks leave (a window
    // p50 of 46 ms against 65 over 7 seeds, docs/recovery.md). Its answer may then wait:
    // the agent reads it off its loop (launcher/spare_template.h).
    const int policy = ::sched_getscheduler(0);
    // volatile: not kept in a register that X, running on the template's stack, could clobber
    // (GCC's -Wclobbered)
    const volatile bool idleClone = idleForks && r.head.idle != 0 && policy != SCHED_IDLE;
    const sched_param idleParam{};
    const pid_t x = ::vfork();
    if (x == 0) {
      if (idleClone) ::sched_setscheduler(0, SCHED_IDLE, &idleParam);  // X's own, not the template's
      const pid_t guard = rawFork();
      if (guard == 0) {
        return {.id = spare::becomeGuardAndSpare(fd, r, self, idleForks, policy, written).id,
                .warm = warm};
      }
      const int err = errno;
      if (guard > 0) ::setpgid(guard, guard);  // also from this side, before the agent knows it
      reply(fd, guard > 0 ? wire::Reply::Forked : wire::Reply::Failed, guard > 0 ? guard : err);
      ::_exit(0);  // G is orphaned now: re-parented to the agent
    }
    const int err = errno;
    r.closeFds();
    if (x < 0) {
      reply(fd, wire::Reply::Failed, err);
      continue;
    }
    int st;
    while (::waitpid(x, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace ddprun::runtime
