#include "worker_runtime/spare_template.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
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
#include <string>
#include <vector>

#include "base/errors.h"
#include "base/fd_passing.h"
#include "base/log.h"
#include "base/process.h"
#include "base/sweep.h"
#include "rendezvous/spare_fork.h"
#include "worker_runtime/written_pages.h"

namespace ddprun::runtime {

namespace {

namespace wire = rendezvous::spare_fork;

void reply(int fd, int32_t kind, int32_t value) {
  const wire::Reply r{kind, value};
  sendAll(fd, &r, sizeof r);
}

// One request: the header with its four descriptors, then the environment.
struct Request {
  wire::Request head;
  int fds[4] = {-1, -1, -1, -1};  // control (read), status (write), stdout, stderr
  std::vector<char> env;
  void closeFds() {
    for (int& f : fds) {
      if (f >= 0) ::close(f);
      f = -1;
    }
  }
};

// False on EOF (the agent closed the socket) or a malformed request (logged).
bool receive(int fd, Request& r) {
  size_t got = 0;
  const ssize_t n = receiveWithFds(fd, &r.head, sizeof r.head, r.fds, got);
  if (n <= 0) {
    r.closeFds();
    return false;
  }
  if (static_cast<size_t>(n) < sizeof r.head &&
      !readAll(fd, reinterpret_cast<char*>(&r.head) + n, sizeof r.head - static_cast<size_t>(n))) {
    r.closeFds();
    return false;
  }
  if (got != 4 || r.head.magic != wire::kRequestMagic || r.head.envBytes > wire::kMaxEnvBytes) {
    DDPRUN_LOG(ERROR, "runtime") << "spare template: a request it cannot read (" << got
                                 << " descriptors, magic " << r.head.magic << ", "
                                 << r.head.envBytes << " bytes of environment); exiting";
    r.closeFds();
    return false;
  }
  r.env.resize(r.head.envBytes);
  if (!readAll(fd, r.env.data(), r.env.size())) {
    r.closeFds();
    return false;
  }
  return true;
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

void onChild(int) {}  // SIGCHLD only has to interrupt ppoll()

void sendRecord(int statusFd, int32_t kind, int32_t value) {
  const wire::StatusRecord r{kind, value};
  ssize_t w;
  do {
    w = ::write(statusFd, &r, sizeof r);
  } while (w < 0 && errno == EINTR);
}

// The guard G of spare W, from W's start to the sweep (launcher/guarded_process.cpp's runGuard,
// steps 4-5, without the job cgroup: the launcher's own guards sweep that when it dies).
[[noreturn]] void guardSpare(int controlFd, int statusFd, pid_t worker) {
  takeGuardSignals(onChild);
  sigset_t waitMask;
  sigemptyset(&waitMask);
  bool running = worker > 0;
  auto reapAll = [&](int flags) {
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(-1, &status, flags)) > 0 || (r < 0 && errno == EINTR)) {
      if (r == worker && running) {
        sendRecord(statusFd, wire::StatusRecord::Exited, status);
        running = false;
      }
      flags |= WNOHANG;
    }
    return r;
  };
  while (true) {
    reapAll(WNOHANG);
    pollfd p{controlFd, POLLIN, 0};
    if (::ppoll(&p, 1, nullptr, &waitMask) > 0) {
      char byte;
      const ssize_t n = ::read(controlFd, &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
    }
  }
  while (reapAll(WNOHANG) >= 0) {
    const size_t alive = killDescendants();
    const pid_t r = reapAll(alive > 0 ? 0 : WNOHANG);
    if (r < 0) break;
    if (r == 0 && alive == 0) {
      const timespec ms{0, 1000000};
      ::nanosleep(&ms, nullptr);
    }
  }
  ::kill(0, SIGKILL);  // whatever joined the group, the guard included
  ::_exit(137);
}

// In G, just forked (one thread): forks W, which returns the spare's id; G never returns.
// `idleFork`: the spare is asked at idle priority (nobody waits for it) and G may come back
// from SCHED_IDLE: then G forks W at idle priority too, so that the copy of the program's page
// tables (5-12 ms here) takes only the CPU time the ranks leave, and goes back to `policy`, the
// template's (G may have been born idle: X, which forked it, copies at idle priority too).
int becomeGuardAndSpare(int templateFd, Request& r, pid_t templatePid, bool idleFork,
                        int policy) {
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &old);  // until each side has its dispositions
  const int control = r.fds[0], status = r.fds[1], out = r.fds[2], err = r.fds[3];
  // kill(0, ...) in the sweep must hit the spare's group, never the template's: without a
  // group of its own there is nothing safe to do.
  if (::setpgid(0, 0) != 0 || ::getpgrp() != ::getpid()) {
    sendRecord(status, wire::StatusRecord::ExecFailed, errno ? errno : EPERM);
    sendRecord(status, wire::StatusRecord::Exited, 126 << 8);
    ::_exit(126);
  }
  char program[16] = {};  // the program's name, for the spare (ps, pgrep, /proc/<pid>/comm)
  ::prctl(PR_GET_NAME, program, 0, 0, 0);
  ::prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  ::close(templateFd);
  sched_param none{};
  idleFork = idleFork && r.head.idle != 0 && policy != SCHED_IDLE &&
             (::sched_getscheduler(0) == SCHED_IDLE ||
              ::sched_setscheduler(0, SCHED_IDLE, &none) == 0);
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::prctl(PR_SET_NAME, program, 0, 0, 0);
    ::close(control);
    ::close(status);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::close(out);
    ::close(err);
    // The spare's environment, as the agent made it for an exec'd spare.
    ::clearenv();
    for (size_t at = 0; at < r.env.size();) {
      const char* entry = r.env.data() + at;
      const size_t len = ::strnlen(entry, r.env.size() - at);
      if (len > 0 && std::memchr(entry, '=', len) != nullptr) {
        ::putenv(::strndup(entry, len));  // the environment keeps the string
      }
      at += len + 1;
    }
    std::string priority;
    if (r.head.idle != 0) {
      if (::sched_setscheduler(0, SCHED_IDLE, &none) != 0) priority = std::strerror(errno);
    } else if (::sched_getscheduler(0) == SCHED_IDLE &&
               ::sched_setscheduler(0, SCHED_OTHER, &none) != 0) {
      priority = std::string("it stays at idle priority: ") + std::strerror(errno);
    }
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    log::setIdentity("spare " + std::to_string(r.head.spareId));
    DDPRUN_LOG(INFO, "runtime") << "spare " << r.head.spareId << " (pid " << ::getpid()
                                << ") forked from the spare template (pid " << templatePid << ")"
                                << (r.head.idle != 0 ? ", SCHED_IDLE" : "")
                                << (priority.empty() ? "" : "; priority: " + priority);
    return r.head.spareId;
  }
  const int forkErrno = errno;
  // A guard at idle priority would report its spare's exit late under load. It may come back
  // (canLeaveIdlePriority, asked by the template); should the kernel refuse anyway, the agent
  // moves the spare, not its guard, out of SCHED_IDLE when the spare takes a rank.
  if (idleFork) ::sched_setscheduler(0, policy, &none);
  // Only the spare holds its output pipes: G writes nowhere but the status pipe.
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::close(null);
  }
  ::close(out);
  ::close(err);
  if (worker < 0) {
    sendRecord(status, wire::StatusRecord::ExecFailed, forkErrno);
    sendRecord(status, wire::StatusRecord::Exited, 127 << 8);
  } else {
    sendRecord(status, wire::StatusRecord::Started, worker);
  }
  guardSpare(control, status, worker);  // sets G's dispositions, then unblocks in ppoll
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

// fork(), but the child's parent is this process's parent (CLONE_PARENT), which reaps it; glibc
// has no wrapper for that. Raw clone skips glibc's fork bookkeeping: fine in a process of one
// thread holding no lock (the template between requests), and the child's cached thread id
// (still the template's) is read by nothing the guard does -- glibc signals its own thread by
// gettid(), and the guard's fork() of the spare sets the spare's own.
pid_t forkAsSibling() {
  return static_cast<pid_t>(
      ::syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, nullptr));
}

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
  reply(fd, wire::Reply::Ready, self);
  DDPRUN_LOG(INFO, "runtime") << "spare template (pid " << self << ") ready: loaded, forks "
                              << "the spares started from now on"
                              << (idleForks ? "" : " (a spare asked at idle priority is forked at "
                                                   "normal priority: this process has " + notIdle + ")");
  for (;;) {
    Request r;
    if (!receive(fd, r)) {
      std::fflush(nullptr);
      ::_exit(0);  // the launcher closed the socket: the group ended (no static destructors)
    }
    // Nothing in this loop starts a thread: it is the invariant the fork stands on.
    DDPRUN_CHECK(threadCount() == 1, "the spare template forks from its only thread");
    std::fflush(nullptr);  // nothing the template buffered may come out of the spare too
    if (options.guardsAsSiblings) {
      const pid_t guard = forkAsSibling();
      if (guard == 0) {
        const int id = becomeGuardAndSpare(fd, r, self, idleForks, ::sched_getscheduler(0));
        if (written.pages > 0) {  // W, still of one thread
          const auto start = std::chrono::steady_clock::now();
          const Touched touched = touchPages(written);
          DDPRUN_LOG(INFO, "runtime") << "spare " << id << ": copied " << touched.pages
                                      << " of the " << written.pages << " pages the template's "
                                      << "warm-up wrote in " << millisSince(start) << " ms ("
                                      << touched.hugePages << " of them in " << touched.huge
                                      << " huge pages)";
        }
        return {.id = id, .warm = warm};
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
        return {.id = becomeGuardAndSpare(fd, r, self, idleForks, policy), .warm = warm};
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
