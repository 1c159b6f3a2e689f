#pragma once
// Test helpers that drive the real build/bin/ddprun: start it with arguments and an exact
// environment, capture its stdout/stderr in files, signal it, wait for it with a deadline.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::testing {

using Env = std::map<std::string, std::string>;

inline std::string ddprunPath() { return std::string(DDPRUN_BIN_DIR) + "/ddprun"; }

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ddprun-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// TMPDIR for every ddprun these tests start: its run directories (left behind when a test
// SIGKILLs ddprun) go away with this directory when the test process exits.
inline const std::string& testTmpDir() {
  static TempDir dir;
  return dir.path();
}

// The minimal environment ddprun runs with in these tests: exact, so that what ddprun adds
// to a worker's environment can be told apart.
inline Env baseEnv() {
  return Env{{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/tmp"}, {"LANG", "C.UTF-8"},
             {"FOO", "bar"}, {"TMPDIR", testTmpDir()}};
}

// Polls for a condition the test itself cannot be woken by (files written by workers).
template <typename Pred>
bool waitUntil(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// True while `pid` exists and is not a zombie.
inline bool processRunning(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = content.rfind(')');
  return close != std::string::npos && close + 2 < content.size() && content[close + 2] != 'Z';
}

class Ddprun {
 public:
  Ddprun(std::vector<std::string> args, Env env = baseEnv()) : dir_() {
    outPath_ = dir_ / "ddprun.out";
    errPath_ = dir_ / "ddprun.err";
    std::vector<std::string> argvStore{ddprunPath()};
    argvStore.insert(argvStore.end(), args.begin(), args.end());
    std::vector<std::string> envStore;
    for (const auto& [k, v] : env) envStore.push_back(k + "=" + v);
    std::vector<char*> argv, envp;
    for (auto& a : argvStore) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : envStore) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      int out = ::open(outPath_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(errPath_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int null = ::open("/dev/null", O_RDONLY);
      ::dup2(null, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(255);
    }
  }
  ~Ddprun() {
    if (!done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  // Waits for ddprun's exit; returns its exit code, or 128 + signal as a shell reports it.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (done_) return code_;
    int status = 0;
    const bool exited = waitUntil(
        [&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!exited) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      done_ = true;
      FAIL("ddprun did not exit within " << timeout.count() << " ms; stderr:\n" << err());
    }
    done_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return code_;
  }

  std::string out() const { return readFile(outPath_); }
  std::string err() const { return readFile(errPath_); }

 private:
  TempDir dir_;
  std::string outPath_, errPath_;
  pid_t pid_ = -1;
  bool done_ = false;
  int code_ = -1;
};

// Runs ddprun to completion.
struct Result {
  int code;
  std::string out, err;
};
inline Result runDdprun(std::vector<std::string> args, Env env = baseEnv()) {
  Ddprun d(std::move(args), std::move(env));
  int code = d.wait();
  return Result{code, d.out(), d.err()};
}

}  // namespace ddprun::testing
