#pragma once
// Process: the one process spawner of the C++ tests. Starts a real program (posix_spawn, safe in
// a test process with threads), stdin from /dev/null, stdout and stderr into files, and waits
// for it with a deadline that only catches hangs. A process still running when its Process goes
// out of scope is SIGKILLed (with its whole process group when it leads one) and reaped, so a
// failed test leaves nothing behind.
//
//   Process p({.argv = {bin + "/ddprun", "--standalone", "true"},
//              .env = {{"PATH", "/usr/bin:/bin"}}, .exactEnv = true,
//              .stdoutPath = dir / "out", .stderrPath = dir / "err"});
//   CHECK(p.wait() == 0);       // exit code, or 128 + signal as a shell reports it
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ddprun::testing {

using Env = std::map<std::string, std::string>;

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Polls for a condition the test cannot be woken by (files written by other processes). The
// timeout only catches hangs: pass one far beyond the expected time.
template <typename Pred>
bool waitUntil(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// The state letter of `pid` in /proc/<pid>/stat (R, S, T for stopped, Z, ...), or 0 when gone.
// Read with read(2): a process that exits between the open and the read makes the read fail
// (ESRCH), which an ifstream turned into an exception (a CI failure of "nothing a worker
// started survives ddprun's SIGKILL").
inline char processState(pid_t pid) {
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  if (n <= 0) return 0;
  const std::string content(buf, static_cast<size_t>(n));
  const auto close = content.rfind(')');
  return close != std::string::npos && close + 2 < content.size() ? content[close + 2] : 0;
}

// True while `pid` exists and is not a zombie (PID 1 of a sandbox may reap orphans late).
inline bool processRunning(pid_t pid) {
  const char state = processState(pid);
  return state != 0 && state != 'Z';
}

// The value of `name` in the environment `pid` was started with ("" when absent; "?" when
// unreadable): /proc/<pid>/environ.
inline std::string startEnv(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  if (!in) return "?";
  for (std::string e; std::getline(in, e, '\0');) {
    if (e.rfind(name + "=", 0) == 0) return e.substr(name.size() + 1);
  }
  return "";
}

// Sends `sig` to every pid of `pids` as one event for whoever watches them (an agent deciding
// whether a death is one or several): the calls run at real-time priority when this process may
// (CAP_SYS_NICE or RLIMIT_RTPRIO), so no process of normal priority runs between them. Two plain
// kill() calls on a loaded machine can be 100 ms apart, and an agent deciding in that gap sees
// one death and then another, not two at once. True when every kill() succeeded.
inline bool killAtOnce(const std::vector<pid_t>& pids, int sig) {
  int policy = SCHED_OTHER;
  sched_param saved{};
  const bool known = pthread_getschedparam(pthread_self(), &policy, &saved) == 0;
  const sched_param realtime{.sched_priority = 1};
  const bool raised = known && pthread_setschedparam(pthread_self(), SCHED_FIFO, &realtime) == 0;
  bool ok = true;
  for (const pid_t pid : pids) ok = ::kill(pid, sig) == 0 && ok;
  if (raised) pthread_setschedparam(pthread_self(), policy, &saved);
  return ok;
}

// The shell's view of a wait status: the exit code, or 128 + the signal number.
inline int exitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct ProcessOptions {
  std::vector<std::string> argv;  // argv[0] is a path (not looked up on PATH)
  Env env;                        // added to this process's environment (replacing same names)
  bool exactEnv = false;          // true: `env` is the whole environment
  std::string stdoutPath;         // empty: inherit this process's stdout
  std::string stderrPath;         // empty: same file as stdout (or inherit when that is empty)
  bool ownProcessGroup = false;   // lead a new process group; kills reach all of it
};

class Process {
 public:
  explicit Process(ProcessOptions options) : options_(std::move(options)) {
    if (options_.argv.empty()) throw std::invalid_argument("Process: empty argv");
    std::vector<std::string> envStrings;
    if (!options_.exactEnv) {
      for (char** e = environ; *e; ++e) {
        const std::string entry = *e;
        if (!options_.env.count(entry.substr(0, entry.find('=')))) envStrings.push_back(entry);
      }
    }
    for (const auto& [k, v] : options_.env) envStrings.push_back(k + "=" + v);
    std::vector<char*> argv, envp;
    for (auto& a : options_.argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : envStrings) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    constexpr int kWrite = O_WRONLY | O_CREAT | O_TRUNC;
    if (!options_.stdoutPath.empty()) {
      posix_spawn_file_actions_addopen(&actions, 1, options_.stdoutPath.c_str(), kWrite, 0644);
    }
    if (!options_.stderrPath.empty()) {
      posix_spawn_file_actions_addopen(&actions, 2, options_.stderrPath.c_str(), kWrite, 0644);
    } else if (!options_.stdoutPath.empty()) {
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
    }
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Signals the test process ignores or blocks must not leak into the program.
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (options_.ownProcessGroup) {
      flags |= POSIX_SPAWN_SETPGROUP;
      posix_spawnattr_setpgroup(&attr, 0);
    }
    posix_spawnattr_setflags(&attr, flags);
    const int rc = posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("cannot start " + options_.argv[0] + ": " + std::strerror(rc));
    }
  }
  ~Process() {
    if (pid_ > 0 && !status_) {
      kill(SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `sig` to the process (and to its group when it leads one).
  void kill(int sig) const { ::kill(options_.ownProcessGroup ? -pid_ : pid_, sig); }
  // Sends `sig` to the process alone.
  void signal(int sig) const { ::kill(pid_, sig); }

  // The raw wait status once the process has exited (reaping it), else nothing. Never blocks.
  std::optional<int> poll() {
    if (!status_) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) finished(st);
    }
    return status_;
  }
  // The raw wait status, waiting at most `timeout` (then the process is killed and nothing is
  // returned).
  std::optional<int> waitStatus(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (!waitUntil([&] { return poll().has_value(); }, timeout)) {
      kill(SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
      finished(st);
      return std::nullopt;
    }
    return status_;
  }
  // The exit code (128 + signal for a signal death). Throws, with the output, when the process
  // has not exited within `timeout` (it is killed first): a hang fails the test, never blocks it.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (status_) return exitCodeOf(*status_);
    if (!waitStatus(timeout)) {
      throw std::runtime_error(options_.argv[0] + " did not exit within " +
                               std::to_string(timeout.count()) + " ms; output:\n" + output() +
                               (options_.stderrPath.empty() ? "" : "\nstderr:\n" + errors()));
    }
    return exitCodeOf(*status_);
  }

  // What it wrote to stdoutPath / stderrPath so far.
  std::string output() const { return readFile(options_.stdoutPath); }
  std::string errors() const { return readFile(options_.stderrPath); }

 private:
  void finished(int status) {
    status_ = status;
    // Whatever the process left in its group (workers of a launcher that died) goes with it.
    if (options_.ownProcessGroup) ::kill(-pid_, SIGKILL);
  }

  ProcessOptions options_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace ddprun::testing
