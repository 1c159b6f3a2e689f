#include "launcher/guarded_process.h"

#include <fcntl.h>
#include <linux/sched.h>  // clone3's struct clone_args, CLONE_INTO_CGROUP
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>

#include "base/errors.h"
#include "base/signal_safe_io.h"
#include "base/sweep.h"

namespace ddprun::launcher {

namespace {

// Descriptor numbers inside the guard.
constexpr int kGuardControlFd = 3;
constexpr int kGuardStatusFd = 4;
constexpr int kFirstFreeFd = kPassedFd + 1;

// Signals the guard ignores (they are meant for the worker) and the worker gets back.

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

// The control channel is a socket pair, not a pipe: the release byte goes out with
// MSG_NOSIGNAL, so a guard that is already gone costs the launcher no SIGPIPE.
Pipe makeControlChannel() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw Error(std::string("launcher: socketpair failed: ") + std::strerror(errno));
  }
  ::shutdown(fds[0], SHUT_WR);  // the guard's end only reads
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
  for (int s : kGuardForwardedSignals) ::sigaction(s, &dfl, nullptr);
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

// ---- The worker's start: a child that shares the guard's memory until its execve ----
//
// The guard is a fork of the agent, so a fork() of the guard copies the agent's page tables
// once more, write-protects both copies (every page the guard then writes is copied on a
// fault) and the worker's execve tears that copy down again: at 256 agents starting their
// workers at once, that was most of the guard's CPU (docs/rendezvous.md, "What an agent
// process costs"). Instead the worker is started as vfork() starts a child: CLONE_VM |
// CLONE_VFORK, on a stack of its own, the guard suspended until the worker's execve (or its
// exit). The child runs only workerMain(): async-signal-safe system calls on its own stack
// and on the WorkerStart the guard prepared; it writes no memory of the guard's but errno
// (the guard reads the clone's result from its return value, never from errno).
// Not in sanitizer builds: their runtimes do not expect a second process in their memory.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DDPRUN_GUARD_FORKS_WORKER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define DDPRUN_GUARD_FORKS_WORKER 1
#endif
#endif

struct WorkerStart {
  const WorkerCgroup* cgroup;
  bool inCgroup;  // started in it (CLONE_INTO_CGROUP): no cgroup.procs write needed
  bool idle;
  int execPipeRead, execPipeWrite;
  const char* path;
  char* const* argv;
  char* const* envp;
};

[[noreturn]] void runWorker(const WorkerStart& w) {
  ::close(w.execPipeRead);
  if (const int err = w.inCgroup ? 0 : joinCgroup(*w.cgroup); err != 0) {
    sendRecord(GuardRecord::CgroupFailed, err);
  }
  if (w.idle) {
    sched_param none{};
    ::sched_setscheduler(0, SCHED_IDLE, &none);  // a syscall: async-signal-safe
  }
  execWorker(w.path, w.argv, w.envp, w.execPipeWrite);
}

#if defined(__x86_64__) && defined(SYS_clone3) && defined(CLONE_INTO_CGROUP) && \
    !defined(DDPRUN_GUARD_FORKS_WORKER)
int workerMain(void* start) { runWorker(*static_cast<const WorkerStart*>(start)); }

// clone3(args) whose child calls fn(arg) on args->stack and exits with its result; the parent
// gets the child's pid or -errno. glibc 2.36 exports no clone3 wrapper, and a child that
// shares the parent's memory cannot return through a C function (it would unwind the frames
// the parent returns through): this one never returns in the child. fn and arg ride in r8
// and r9, which the syscall instruction preserves in both processes.
extern "C" long ddprun_clone3_call(struct clone_args* args, size_t size, int (*fn)(void*),
                                   void* arg);
asm(R"(
  .text
  .p2align 4
  .globl ddprun_clone3_call
  .hidden ddprun_clone3_call
  .type ddprun_clone3_call, @function
ddprun_clone3_call:
  .cfi_startproc
  mov %rdx, %r8
  mov %rcx, %r9
  mov $435, %eax
  syscall
  test %rax, %rax
  jz 1f
  ret
1:
  .cfi_undefined rip
  xor %ebp, %ebp
  mov %r9, %rdi
  call *%r8
  mov %eax, %edi
  mov $60, %eax
  syscall
  hlt
  .cfi_endproc
  .size ddprun_clone3_call, .-ddprun_clone3_call
)");
static_assert(SYS_clone3 == 435 && SYS_exit == 60, "x86_64 system call numbers");

// Starts the worker sharing the guard's memory, in the cgroup open as `cgroupFd` when there is
// one (CLONE_INTO_CGROUP, Linux 5.7) and else outside (it joins by cgroup.procs). Where clone3
// is refused (a seccomp filter may say ENOSYS) it is glibc's clone() with the same flags.
// Returns the worker's pid, or -errno.
pid_t startWorker(int cgroupFd, WorkerStart& w) {
  alignas(64) static char stack[64 * 1024];  // the worker's until its execve: the guard waits
  if (cgroupFd >= 0) {
    struct clone_args args {};
    args.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<uint64_t>(cgroupFd);
    args.stack = reinterpret_cast<uint64_t>(stack);
    args.stack_size = sizeof stack;
    w.inCgroup = true;
    const long pid = ddprun_clone3_call(&args, sizeof args, workerMain, &w);
    if (pid > 0) return static_cast<pid_t>(pid);
  }
  w.inCgroup = false;
  const pid_t pid =
      ::clone(workerMain, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &w);
  return pid > 0 ? pid : -errno;
}
#else
// fork(), with the child started right in the cgroup open as `cgroupFd` (clone3 with
// CLONE_INTO_CGROUP, Linux 5.7). Moving a process later (writing cgroup.procs) waits for an
// RCU grace period: about a millisecond each, serialised between workers. Where clone3 is
// refused (a seccomp filter may say ENOSYS) it is a plain fork(). The child only execs:
// glibc's fork handlers are not needed before execve. Returns the worker's pid, or -errno.
pid_t startWorker(int cgroupFd, WorkerStart& w) {
  w.inCgroup = false;
  pid_t pid = -1;
#if defined(SYS_clone3) && defined(CLONE_INTO_CGROUP)
  if (cgroupFd >= 0) {
    struct clone_args args {};
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<uint64_t>(cgroupFd);
    const long r = ::syscall(SYS_clone3, &args, sizeof args);
    if (r >= 0) {
      w.inCgroup = true;
      pid = static_cast<pid_t>(r);
    }
  }
#endif
  if (pid < 0) pid = ::fork();
  if (pid == 0) runWorker(w);
  return pid > 0 ? pid : -errno;
}
#endif

// ---- The guard's sweep: base/sweep.h (killDescendants) ----

// The guard's whole life. `fds` are the launcher-side numbers of the descriptors it needs.
[[noreturn]] void runGuard(int controlFd, int statusFd, int outFd, int errFd, int passFd,
                           bool subreaper, bool devNullStdin, const WorkerCgroup& cgroup,
                           bool idle, const char* path,
                           char* const* argv, char* const* envp) {
  // 1. Signals. The launcher forked us with every signal blocked, so none can arrive before
  //    this is done: the launcher's own handlers (which would write into the launcher's
  //    event loop through an inherited pipe) are reset, the forwarded signals ignored.
  takeGuardSignals(onChild);
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
  // Orphaned descendants (double fork, setsid daemons) are re-parented to the guard.
  if (subreaper) ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

  // 2. Descriptors: 0 stdin, 1/2 the worker's output pipes, 3 control, 4 status, 5 the passed
  //    one (until the worker runs); nothing else survives (in particular no other worker's control pipe, which would keep it
  //    open). Sources are first moved above the targets so dup2 never clobbers one.
  const int src[] = {controlFd, statusFd, outFd, errFd, passFd};
  int high[5];
  for (int i = 0; i < 5; ++i) high[i] = src[i] < 0 ? -1 : ::fcntl(src[i], F_DUPFD, 16);
  ::dup2(high[0], kGuardControlFd);
  ::dup2(high[1], kGuardStatusFd);
  ::dup2(high[2], STDOUT_FILENO);
  ::dup2(high[3], STDERR_FILENO);
  if (high[4] >= 0) ::dup2(high[4], kPassedFd);  // without O_CLOEXEC: the worker keeps it
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
  // The worker starts in its cgroup, or joins it before it can start anything; the guard
  // stays outside.
  const int cgroupFd =
      cgroup.dir.empty() ? -1 : ::open(cgroup.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  WorkerStart start{.cgroup = &cgroup, .inCgroup = false, .idle = idle,
                    .execPipeRead = execPipe[0], .execPipeWrite = execPipe[1],
                    .path = path, .argv = argv, .envp = envp};
  const pid_t started = startWorker(cgroupFd, start);
  const pid_t worker = started > 0 ? started : -1;
  const int forkErrno = started > 0 ? 0 : -started;
  ::sigprocmask(SIG_SETMASK, &blockChld, nullptr);
  if (cgroupFd >= 0) ::close(cgroupFd);
  ::close(execPipe[1]);
  ::close(STDOUT_FILENO);  // only the worker (and its children) may hold the output pipes
  ::close(STDERR_FILENO);
  if (passFd >= 0) ::close(kPassedFd);  // and the passed descriptor
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
  //    Every child is reaped, the worker and the orphans re-parented to the guard alike.
  bool workerRunning = worker > 0;
  auto reapAll = [&](int flags) {
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(-1, &status, flags)) > 0 || (r < 0 && errno == EINTR)) {
      if (r == worker && workerRunning) {
        sendRecord(GuardRecord::Exited, status);
        workerRunning = false;
      }
      flags |= WNOHANG;  // one blocking wait at most
    }
    return r;  // 0: children left; -1 (ECHILD): none
  };
  bool released = false;  // the launcher wrote kReleaseByte: it is alive and stops us on purpose
  while (true) {
    reapAll(WNOHANG);
    struct pollfd p {kGuardControlFd, POLLIN, 0};
    int rc = ::ppoll(&p, 1, nullptr, &waitMask);  // SIGCHLD is deliverable only in here
    if (rc > 0) {
      char byte;
      ssize_t n = ::read(kGuardControlFd, &byte, 1);
      if (n == 1 && byte == kReleaseByte) released = true;
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
    }
  }
  // 5. The sweep: every descendant until the guard has no child; when the launcher died, the
  //    job's cgroup first (a cgroup.kill: every worker of the job goes, which is what the
  //    launcher's death means). The worker's end (by SIGKILL, usually) is reported on the way.
  //    A subreaper without a child has no descendant at all (orphans below it are re-parented
  //    to it), so the common end -- the worker exited and left nothing -- neither kills nor
  //    reads /proc.
  const bool launcherDied = !released;
  if (launcherDied && reapAll(WNOHANG) >= 0) killCgroup(cgroup);
  while (reapAll(WNOHANG) >= 0) {  // -1 (ECHILD): no child left, so nothing below either
    const size_t alive = killDescendants();
    const pid_t r = reapAll(alive > 0 ? 0 : WNOHANG);  // the killed ones die: wait for one
    if (r < 0) break;                                   // no child, nothing alive below
    if (r == 0 && alive == 0) {                         // a child is still being torn down
      const struct timespec ms {0, 1000000};
      ::nanosleep(&ms, nullptr);
    }
  }
  // Without the launcher nobody else removes the job's cgroup: empty it (the other guards'
  // workers are dying too) and remove it; whichever guard comes last finds it gone.
  if (launcherDied && !cgroup.dir.empty()) killAndRemoveCgroup(cgroup.jobDir.c_str(), 2000);
  ::kill(0, SIGKILL);  // whatever joined the group from outside, the guard included
  ::_exit(137);
}

}  // namespace

void releaseGuard(UniqueFd& control) noexcept {
  if (control.get() < 0) return;
  // One byte into a socket nobody else writes: never blocks. A guard already gone (EPIPE) is
  // fine, and raises no SIGPIPE.
  ssize_t w;
  do {
    w = ::send(control.get(), &kReleaseByte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (w < 0 && errno == EINTR);
  control.reset();
}

GuardedProcess spawnGuarded(const SpawnRequest& req) {
  DDPRUN_CHECK(!req.argv.empty(), "a worker needs argv[0]");
  // Everything the child needs is prepared before fork: it may not allocate.
  std::vector<char*> argv, envp;
  for (const auto& a : req.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : req.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  Pipe control = makeControlChannel(), status = makePipe(), out = makePipe(), err = makePipe();
  // The guard starts with every signal blocked until it has set its dispositions.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &old);
  // _Fork, not fork: glibc's fork() runs the atfork handlers and holds every malloc arena's
  // lock across the clone, so a thread of this process that allocates meanwhile -- the hosted
  // rendezvous store's -- waits for as long as the fork takes, which on a loaded machine is as
  // long as this thread waits for a CPU. The guard runs only async-signal-safe code and never
  // allocates (above): it needs none of that. Sanitizer runtimes hook fork() to keep their own
  // locks consistent in the child, so their builds keep it.
#if defined(DDPRUN_GUARD_FORKS_WORKER)
  const pid_t guard = ::fork();
#else
  const pid_t guard = ::_Fork();
#endif
  if (guard == 0) {
    runGuard(control.read.get(), status.write.get(), out.write.get(), err.write.get(),
             req.passFd, req.subreaper, req.stdinFromDevNull, req.cgroup, req.idlePriority, req.executable.c_str(), argv.data(),
             envp.data());
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
