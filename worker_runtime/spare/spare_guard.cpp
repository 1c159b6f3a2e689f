#include "worker_runtime/spare/spare_guard.h"

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
#include <cstring>
#include <span>
#include <string>

#include "base/fd_passing.h"
#include "base/log.h"
#include "base/sweep.h"

namespace ddprun::runtime::spare {

namespace wire = rendezvous::spare_fork;

void Request::closeFds() {
  for (int& f : fds) {
    if (f >= 0) ::close(f);
    f = -1;
  }
}

namespace {

// One message on the template's socket pairs (agent -> template -> G -> W): a request's header
// carrying `fds`, then the environment it announces. The header may arrive in parts; the
// descriptors come with its first byte.
bool sendMessage(int fd, const wire::Request& head, std::span<const int> fds,
                 const std::vector<char>& env) {
  const ssize_t sent = sendWithFds(fd, &head, sizeof head, fds);
  return sent >= 0 &&
         (static_cast<size_t>(sent) == sizeof head ||
          sendAll(fd, reinterpret_cast<const char*>(&head) + sent,
                  sizeof head - static_cast<size_t>(sent))) &&
         sendAll(fd, env.data(), env.size());
}

// The header and its descriptors (`got` of them; the caller closes what came, read or not).
// False on EOF or a short read.
bool receiveHeader(int fd, wire::Request& head, std::span<int> fds, size_t& got) {
  const ssize_t n = receiveWithFds(fd, &head, sizeof head, fds, got);
  return n > 0 && (static_cast<size_t>(n) == sizeof head ||
                   readAll(fd, reinterpret_cast<char*>(&head) + n,
                           sizeof head - static_cast<size_t>(n)));
}

// The environment the header announces (at most kMaxEnvBytes: checked by receive()).
bool receiveEnv(int fd, const wire::Request& head, std::vector<char>& env) {
  env.resize(head.envBytes);
  return readAll(fd, env.data(), env.size());
}

}  // namespace

bool receive(int fd, Request& r) {
  size_t got = 0;
  if (!receiveHeader(fd, r.head, r.fds, got)) {
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
  if (!receiveEnv(fd, r.head, r.env)) {
    r.closeFds();
    return false;
  }
  return true;
}

bool send(int fd, const Request& r) { return sendMessage(fd, r.head, r.fds, r.env); }

pid_t forkAsSibling() {
  // glibc has no wrapper for CLONE_PARENT. A raw clone skips glibc's fork bookkeeping: fine in a
  // process of one thread holding no lock (the template between requests), and the child's
  // cached thread id (still the template's) is read by nothing G does -- glibc signals its own
  // thread by gettid(), and G's fork() of W sets W's own.
  return static_cast<pid_t>(
      ::syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, nullptr));
}

namespace {

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

// kill(0, ...) in G's sweep must hit the spare's group, never the template's: without a group
// of its own there is nothing safe to do (both records, then exit 126).
void ownGroupOrExit(int status) {
  if (::setpgid(0, 0) == 0 && ::getpgrp() == ::getpid()) return;
  sendRecord(status, wire::StatusRecord::ExecFailed, errno ? errno : EPERM);
  sendRecord(status, wire::StatusRecord::Exited, 126 << 8);
  ::_exit(126);
}

// G's name for ps and pgrep; returns the program's (W takes it back).
struct Names {
  char program[16] = {};
};
Names nameGuard() {
  Names n;
  ::prctl(PR_GET_NAME, n.program, 0, 0, 0);
  ::prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  return n;
}

// In W, one thread, every signal blocked: takes the spare's output, environment and priority,
// unblocks `old`, and logs its start. Returns the spare's id.
int enterSpare(const Names& names, const wire::Request& head, const std::vector<char>& env,
               int out, int err, pid_t templatePid, const sigset_t& old, const char* how) {
  ::prctl(PR_SET_NAME, names.program, 0, 0, 0);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  ::close(out);
  ::close(err);
  // The spare's environment, as the agent made it for an exec'd spare.
  ::clearenv();
  for (size_t at = 0; at < env.size();) {
    const char* entry = env.data() + at;
    const size_t len = ::strnlen(entry, env.size() - at);
    if (len > 0 && std::memchr(entry, '=', len) != nullptr) {
      ::putenv(::strndup(entry, len));  // the environment keeps the string
    }
    at += len + 1;
  }
  const sched_param none{};
  std::string priority;
  if (head.idle != 0) {
    if (::sched_setscheduler(0, SCHED_IDLE, &none) != 0) priority = std::strerror(errno);
  } else if (::sched_getscheduler(0) == SCHED_IDLE &&
             ::sched_setscheduler(0, SCHED_OTHER, &none) != 0) {
    priority = std::string("it stays at idle priority: ") + std::strerror(errno);
  }
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  log::setIdentity("spare " + std::to_string(head.spareId));
  DDPRUN_LOG(INFO, "runtime") << "spare " << head.spareId << " (pid " << ::getpid()
                              << ") forked from the spare template (pid " << templatePid << ")"
                              << how << (head.idle != 0 ? ", SCHED_IDLE" : "")
                              << (priority.empty() ? "" : "; priority: " + priority);
  return head.spareId;
}

// In W: makes the pages the template's warm-up wrote its own (written_pages.h).
struct Copied {
  Touched touched;
  int64_t ms = 0;
};
Copied copyWritten(const WrittenPages& written) {
  if (written.pages == 0) return {};
  const auto start = std::chrono::steady_clock::now();
  const Touched touched = touchPages(written);
  return {.touched = touched, .ms = millisSince(start)};
}

void logCopied(int id, const WrittenPages& written, const Copied& c, const char* when) {
  if (written.pages == 0) return;
  DDPRUN_LOG(INFO, "runtime") << "spare " << id << ": copied " << c.touched.pages << " of the "
                              << written.pages << " pages the template's warm-up wrote in "
                              << c.ms << " ms (" << c.touched.hugePages << " of them in "
                              << c.touched.huge << " huge pages)" << when;
}

// G's last steps, W started (or not: `worker` -1 and `forkErrno`): G writes nowhere but the
// status pipe (only W holds its output pipes), reports the start, and guards W.
[[noreturn]] void guardStarted(const Request& r, pid_t worker, int forkErrno) {
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::close(null);
  }
  ::close(r.fds[2]);
  ::close(r.fds[3]);
  if (worker < 0) {
    sendRecord(r.fds[1], wire::StatusRecord::ExecFailed, forkErrno);
    sendRecord(r.fds[1], wire::StatusRecord::Exited, 127 << 8);
  } else {
    sendRecord(r.fds[1], wire::StatusRecord::Started, worker);
  }
  guardSpare(r.fds[0], r.fds[1], worker);  // sets G's dispositions, then unblocks in ppoll
}

}  // namespace

Spare becomeGuardAndSpare(int templateFd, Request& r, pid_t templatePid, bool idleFork,
                          int policy, const WrittenPages& written) {
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &old);  // until each side has its dispositions
  ownGroupOrExit(r.fds[1]);
  const Names names = nameGuard();
  ::close(templateFd);
  // G may fork W at idle priority when W is asked at idle priority (nobody waits for it) and G
  // can come back: the copy of the program's page tables (5-12 ms here) then takes only the CPU
  // time the ranks leave; G goes back to `policy` after it (G may have been born idle: X, which
  // forked it, copies at idle priority too).
  const sched_param none{};
  idleFork = idleFork && r.head.idle != 0 && policy != SCHED_IDLE &&
             (::sched_getscheduler(0) == SCHED_IDLE ||
              ::sched_setscheduler(0, SCHED_IDLE, &none) == 0);
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::close(r.fds[0]);
    ::close(r.fds[1]);
    const int id = enterSpare(names, r.head, r.env, r.fds[2], r.fds[3], templatePid, old, "");
    logCopied(id, written, copyWritten(written), "");
    return {.id = id};
  }
  const int forkErrno = errno;
  // A guard at idle priority would report its spare's exit late under load. It may come back
  // (canLeaveIdlePriority, asked by the template); should the kernel refuse anyway, the agent
  // moves the spare, not its guard, out of SCHED_IDLE when the spare takes a rank.
  if (idleFork) ::sched_setscheduler(0, policy, &none);
  guardStarted(r, worker, forkErrno);
}

namespace {

// W's part of a hand-over: the request's header, its output and its environment.
struct HandOver {
  wire::Request head;
  int fds[2] = {-1, -1};  // stdout, stderr
  std::vector<char> env;
};

// G checked the request it passes on (receive()).
bool receiveHandOver(int fd, HandOver& h) {
  size_t got = 0;
  return receiveHeader(fd, h.head, h.fds, got) && got == 2 && receiveEnv(fd, h.head, h.env);
}

// In W, forked ahead: copies the pages, then waits for its hand-over (every signal blocked but
// SIGKILL). Exits when G closed the link without one (the template's group ended).
Spare waitAsSpare(int link, const Names& names, pid_t templatePid, const sigset_t& old,
                  const WrittenPages& written, bool leaveIdle) {
  ::prctl(PR_SET_NAME, names.program, 0, 0, 0);  // the program's, as a spare shows it
  const Copied copied = copyWritten(written);
  // The copy took the template's priority (idle in the background); the wait does not need
  // one, but the hand-over's wake-up does: at idle priority beside ranks that keep every core
  // busy, it waited 20-30 ms for a core while the group trained one rank short.
  const sched_param none{};
  if (leaveIdle && ::sched_getscheduler(0) == SCHED_IDLE) ::sched_setscheduler(0, SCHED_OTHER, &none);
  HandOver h;
  if (!receiveHandOver(link, h)) {
    for (int f : h.fds) {
      if (f >= 0) ::close(f);
    }
    ::_exit(0);
  }
  ::close(link);
  const int id = enterSpare(names, h.head, h.env, h.fds[0], h.fds[1], templatePid, old,
                            " ahead of its request");
  logCopied(id, written, copied, ", before it was asked");
  return {.id = id};
}

// In G, forked ahead, W forked: waits for the request on `link`, then does what G does on
// request. Exits, closing the link, when W dies first (the template then forks on request) or
// when the link closes without a request (the template exited: W is killed first).
[[noreturn]] void waitAsGuard(int link, int toSpare, pid_t worker) {
  takeGuardSignals(onChild);
  sigset_t waitMask;
  sigemptyset(&waitMask);
  int st = 0;
  bool reaped = false;
  for (;;) {
    pollfd p{link, POLLIN, 0};
    reaped = ::waitpid(worker, &st, WNOHANG) == worker;
    if (reaped) {
      if (::poll(&p, 1, 0) <= 0) ::_exit(0);
      break;  // a request came as W died: the template counts on this G, which says so
    }
    if (::ppoll(&p, 1, nullptr, &waitMask) > 0) break;  // else SIGCHLD (EINTR): look again
  }
  Request r;
  if (!receive(link, r)) {
    ::kill(worker, SIGKILL);
    while (::waitpid(worker, &st, 0) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  ::close(link);
  ownGroupOrExit(r.fds[1]);
  if (reaped) {  // the agent supervises it as a spare that could not start
    sendRecord(r.fds[1], wire::StatusRecord::ExecFailed, ESRCH);
    sendRecord(r.fds[1], wire::StatusRecord::Exited, st);
    ::_exit(127);
  }
  ::setpgid(worker, ::getpid());  // W waited in the template's group: into G's, as on request
  const int output[2] = {r.fds[2], r.fds[3]};  // W's part: its stdout and stderr
  // W died since it was last looked at: reported as a spare that exited at once (guardSpare).
  if (!sendMessage(toSpare, r.head, output, r.env)) ::kill(worker, SIGKILL);
  ::close(toSpare);
  // G back from the template's priority (which the agent moved out of SCHED_IDLE for this
  // request, or not) to what was asked; W takes its own in enterSpare().
  const sched_param none{};
  if (r.head.idle == 0 && ::sched_getscheduler(0) == SCHED_IDLE) {
    ::sched_setscheduler(0, SCHED_OTHER, &none);
  }
  guardStarted(r, worker, 0);
}

}  // namespace

std::optional<Spare> prepare(int templateFd, pid_t templatePid, const WrittenPages& written,
                             bool leaveIdle, Prepared& prepared) {
  prepared = {};
  int link[2], toSpare[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link) != 0) {
    DDPRUN_LOG(WARN, "runtime") << "spare template: no spare forked ahead: socketpair: "
                                << std::strerror(errno);
    return std::nullopt;
  }
  std::fflush(nullptr);  // nothing the template buffered may come out of G or W too
  const pid_t guard = forkAsSibling();
  if (guard > 0) {
    ::close(link[1]);
    prepared = {.guard = guard, .link = link[0]};
    return std::nullopt;
  }
  if (guard < 0) {
    DDPRUN_LOG(WARN, "runtime") << "spare template: no spare forked ahead: clone: "
                                << std::strerror(errno);
    ::close(link[0]);
    ::close(link[1]);
    return std::nullopt;
  }
  // G: in the template's process group until the hand-over (see the header). Without W it
  // exits at once, and the template forks on request.
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &old);
  ::close(link[0]);
  ::close(templateFd);
  const Names names = nameGuard();
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, toSpare) != 0) ::_exit(0);
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::close(link[1]);
    ::close(toSpare[0]);
    return waitAsSpare(toSpare[1], names, templatePid, old, written, leaveIdle);
  }
  if (worker < 0) ::_exit(0);
  ::close(toSpare[1]);
  const sched_param none{};  // as W, once the fork's copy of the page tables is done
  if (leaveIdle && ::sched_getscheduler(0) == SCHED_IDLE) ::sched_setscheduler(0, SCHED_OTHER, &none);
  waitAsGuard(link[1], toSpare[0], worker);
}

bool handOver(Prepared& prepared, const Request& r) {
  const bool ok = send(prepared.link, r);
  ::close(prepared.link);
  prepared = {};
  return ok;
}

}  // namespace ddprun::runtime::spare
