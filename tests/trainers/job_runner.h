#pragma once
// Runs real ddprun / trainer processes for the end-to-end trainer tests.
//
// A Job is one child process in its own process group, its stdout and stderr captured in a file.
// wait() is bounded: on timeout the whole group is SIGKILLed and the test fails, so a hung job
// never outlives the test. The destructor kills a job that is still running.
// workerPid() finds a worker of a running launcher from outside (by /proc), so a test can kill it
// at an arbitrary moment, as a crash would: nothing in the trainer knows about tests.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>

extern char** environ;

namespace ddprun::trainers::testing {

// The pids of every living descendant of `root` (from /proc/<pid>/stat; zombies included).
inline std::vector<pid_t> descendants(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
      std::string stat;
      std::getline(in, stat);
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 2));
      std::string state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      children[ppid].push_back(pid);
    }
    ::closedir(d);
  }
  std::vector<pid_t> out, todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p]) {
      out.push_back(c);
      todo.push_back(c);
    }
  }
  return out;
}

// The worker of global rank `rank` under launcher `launcher` (the descendant whose environment
// has RANK=<rank> and whose executable is `program`), or -1.
inline pid_t workerPid(pid_t launcher, int rank, const std::string& program) {
  for (pid_t p : descendants(launcher)) {
    std::ifstream comm("/proc/" + std::to_string(p) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != program.substr(0, 15)) continue;
    std::ifstream env("/proc/" + std::to_string(p) + "/environ");
    std::string entry;
    while (std::getline(env, entry, '\0')) {
      if (entry == "RANK=" + std::to_string(rank)) return p;
    }
  }
  return -1;
}

class Job {
 public:
  // Starts argv[0] (a path) with the process environment plus `env`.
  Job(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
      std::string logPath)
      : log_(std::move(logPath)) {
    std::vector<std::string> envStrings;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      if (!env.count(entry.substr(0, entry.find('=')))) envStrings.push_back(entry);
    }
    for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    for (const auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
    args.push_back(nullptr);
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = posix_spawn(&pid_, args[0], &actions, &attr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  ~Job() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }
  // Whether the process has exited (it is reaped then; wait() returns its code at once).
  bool exited() {
    if (reaped_) return true;
    if (::waitpid(pid_, &status_, WNOHANG) != pid_) return false;
    reaped_ = true;
    return true;
  }

  // The exit code (128 + signal for a signal death). Throws after `timeout`, having killed the
  // whole process group.
  int wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = status_;
    while (!reaped_ && ::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        throw std::runtime_error("job timed out; output:\n" + output());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Workers of a launcher that died abruptly must not linger past the test.
    ::kill(-pid_, SIGKILL);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string output() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace ddprun::trainers::testing
