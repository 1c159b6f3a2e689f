#pragma once
// Test helpers that drive the real build/bin/ddprun: start it with arguments and an exact
// environment, capture its stdout/stderr in files, signal it, wait for it with a deadline.
// Built on tests/support/ (TempDir, Process).
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace ddprun::testing {

inline std::string ddprunPath() { return std::string(DDPRUN_BIN_DIR) + "/ddprun"; }

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

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

// One ddprun process: stdout and stderr in files of its own directory.
class Ddprun {
 public:
  Ddprun(std::vector<std::string> args, Env env = baseEnv())
      : process_(options(std::move(args), std::move(env), dir_)) {}

  pid_t pid() const { return process_.pid(); }
  void signal(int sig) const { process_.signal(sig); }

  // Waits for ddprun's exit; returns its exit code, or 128 + signal as a shell reports it.
  // A ddprun still running after `timeout` is killed and the test fails.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (auto st = process_.waitStatus(timeout)) return exitCodeOf(*st);
    FAIL("ddprun did not exit within " << timeout.count() << " ms; stderr:\n" << err());
    return -1;
  }

  std::string out() const { return process_.output(); }
  std::string err() const { return process_.errors(); }

 private:
  static ProcessOptions options(std::vector<std::string> args, Env env, const TempDir& dir) {
    std::vector<std::string> argv{ddprunPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    return ProcessOptions{.argv = std::move(argv), .env = std::move(env), .exactEnv = true,
                          .stdoutPath = dir / "ddprun.out", .stderrPath = dir / "ddprun.err"};
  }

  TempDir dir_;  // before process_: the files outlive the process
  Process process_;
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
