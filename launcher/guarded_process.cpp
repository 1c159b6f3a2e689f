#include "launcher/guarded_process.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "base/errors.h"

namespace ddprun::launcher {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

// Descriptor numbers inside the guard.
constexpr int kGuardControlFd = 3;
constexpr int kGuardStatusFd = 4;
constexpr int kFirstFreeFd = 5;

// Signals the guard ignores (they are meant for the worker) and the worker gets back.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP,
                                     SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2, SIGALRM};

struct Pipe {
  UniqueFd read, write;
};
Pipe makePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(std::string("launcher: pipe2 failed: ") + std::strerror(errno));
  }
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// ---- Everything below runs in the forked guard or worker: async-signal-safe calls only ----

void writeAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void sendRecord(int32_t kind, int32_t value) {
  GuardRecord r{kind, value};
  writeAll(kGuardStatusFd, &r, sizeof r);
}

void closeFrom(int first) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, first, ~0U, 0) == 0) return;
#endif
  for (int fd = first; fd < 65536; ++fd) ::close(fd);
}

void onChild(int) {}  // SIGCHLD only has to interrupt ppoll()

[[noreturn]] void execWorker(const char* path, char* const* argv, char* const* envp,
                             int execErrorFd) {
  // Undo what the guard changed: default dispositions first, then the empty mask (which
  // delivers whatever arrived meanwhile).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : kForwardedSignals) ::sigaction(s, &dfl, nullptr);
  ::sigaction(SIGCHLD, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::close(kGuardControlFd);
  ::close(kGuardStatusFd);
  ::execve(path, argv, envp);
  int err = errno;
  writeAll(execErrorFd, &err, sizeof err);
  ::_exit(127);
}

// The guard's whole life. `fds` are the launcher-side numbers of the descriptors it needs.
[[noreturn]] void runGuard(int controlFd, int statusFd, int outFd, int errFd, bool devNullStdin,
                           const char* path, char* const* argv, char* const* envp) {
  // 1. Signals. The launcher forked us with every signal blocked, so none can arrive before
  //    this is done: the launcher's own handlers (which would write into the launcher's
  //    event loop through an inherited pipe) are reset, the forwarded signals ignored.
  struct sigaction dfl {}, ign {}, chld {};
  dfl.sa_handler = SIG_DFL;
  ign.sa_handler = SIG_IGN;
  chld.sa_handler = onChild;
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) == 0 && current.sa_handler != SIG_DFL &&
        current.sa_handler != SIG_IGN) {
      ::sigaction(s, &dfl, nullptr);
    }
  }
  for (int s : kForwardedSignals) ::sigaction(s, &ign, nullptr);
  ::sigaction(SIGCHLD, &chld, nullptr);
  sigset_t blockChld, waitMask;
  sigemptyset(&blockChld);
  sigaddset(&blockChld, SIGCHLD);
  sigemptyset(&waitMask);  // inside ppoll() everything, SIGCHLD included, may arrive
  // kill(0, ...) below must hit the worker's group, never the launcher's: without a group
  // of our own there is nothing safe to do.
  if (::setpgid(0, 0) != 0 || ::getpgrp() != ::getpid()) {
    GuardRecord r{GuardRecord::ExecFailed, errno ? errno : EPERM};
    writeAll(statusFd, &r, sizeof r);
    ::_exit(126);
  }
  ::prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);

  // 2. Descriptors: 0 stdin, 1/2 the worker's output pipes, 3 control, 4 status; nothing
  //    else survives (in particular no other worker's control pipe, which would keep it
  //    open). Sources are first moved above the targets so dup2 never clobbers one.
  const int src[] = {controlFd, statusFd, outFd, errFd};
  int high[4];
  for (int i = 0; i < 4; ++i) high[i] = ::fcntl(src[i], F_DUPFD, 16);
  ::dup2(high[0], kGuardControlFd);
  ::dup2(high[1], kGuardStatusFd);
  ::dup2(high[2], STDOUT_FILENO);
  ::dup2(high[3], STDERR_FILENO);
  if (devNullStdin) {
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0 && null != STDIN_FILENO) {
      ::dup2(null, STDIN_FILENO);
      ::close(null);
    }
  }
  closeFrom(kFirstFreeFd);

  // 3. The worker. A CLOEXEC pipe tells whether its execve succeeded (EOF) or not (errno).
  int execPipe[2];
  if (::pipe2(execPipe, O_CLOEXEC) != 0) {
    ::sigprocmask(SIG_SETMASK, &blockChld, nullptr);
    sendRecord(GuardRecord::ExecFailed, errno);
    sendRecord(GuardRecord::Exited, 127 << 8);
    ::_exit(1);
  }
  // Still with every signal blocked: a signal sent to the group before the worker has reset
  // its dispositions stays pending (blocked signals are never discarded) instead of being
  // lost to the SIG_IGN it inherits for an instant.
  const pid_t worker = ::fork();
  if (worker == 0) {
    ::close(execPipe[0]);
    execWorker(path, argv, envp, execPipe[1]);
  }
  const int forkErrno = errno;
  ::sigprocmask(SIG_SETMASK, &blockChld, nullptr);
  ::close(execPipe[1]);
  ::close(STDOUT_FILENO);  // only the worker (and its children) may hold the output pipes
  ::close(STDERR_FILENO);
  if (worker < 0) {
    sendRecord(GuardRecord::ExecFailed, forkErrno);
    sendRecord(GuardRecord::Exited, 127 << 8);
  } else {
    int err = 0;
    ssize_t n;
    do {
      n = ::read(execPipe[0], &err, sizeof err);
    } while (n < 0 && errno == EINTR);
    sendRecord(n == sizeof err ? GuardRecord::ExecFailed : GuardRecord::Started,
               n == sizeof err ? err : worker);
  }
  ::close(execPipe[0]);

  // 4. Wait for the worker's exit (report it) and for the control pipe's EOF (kill all).
  bool workerRunning = worker > 0;
  while (true) {
    if (workerRunning) {
      int status = 0;
      pid_t r = ::waitpid(worker, &status, WNOHANG);
      if (r == worker) {
        sendRecord(GuardRecord::Exited, status);
        workerRunning = false;
      }
    }
    struct pollfd p {kGuardControlFd, POLLIN, 0};
    int rc = ::ppoll(&p, 1, nullptr, &waitMask);  // SIGCHLD is deliverable only in here
    if (rc > 0) {
      char byte;
      ssize_t n = ::read(kGuardControlFd, &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
    }
  }
  ::kill(0, SIGKILL);  // the whole process group, the guard included
  ::_exit(137);
}

}  // namespace

GuardedProcess spawnGuarded(const SpawnRequest& req) {
  DDPRUN_CHECK(!req.argv.empty(), "a worker needs argv[0]");
  // Everything the child needs is prepared before fork: it may not allocate.
  std::vector<char*> argv, envp;
  for (const auto& a : req.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : req.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  Pipe control = makePipe(), status = makePipe(), out = makePipe(), err = makePipe();
  // The guard starts with every signal blocked until it has set its dispositions.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &old);
  const pid_t guard = ::fork();
  if (guard == 0) {
    runGuard(control.read.get(), status.write.get(), out.write.get(), err.write.get(),
             req.stdinFromDevNull, req.executable.c_str(), argv.data(), envp.data());
  }
  const int forkErrno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (guard < 0) throw Error(std::string("launcher: fork failed: ") + std::strerror(forkErrno));
  // Also from this side, so the group exists before the launcher first signals it.
  ::setpgid(guard, guard);
  GuardedProcess p;
  p.guardPid = guard;
  p.control = std::move(control.write);
  p.status = std::move(status.read);
  p.stdoutRead = std::move(out.read);
  p.stderrRead = std::move(err.read);
  return p;
}

}  // namespace ddprun::launcher
