#pragma once
// Runs real ddprun / trainer processes for the end-to-end trainer tests.
//
// A Job is one child process in its own process group (tests/support's Process), its stdout and
// stderr captured in one file. wait() is bounded: on timeout the whole group is SIGKILLed and
// the test fails, so a hung job never outlives the test. After the job exits, whatever is left
// in its group is killed; the destructor kills a job that is still running.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace ddprun::trainers::testing {

class Job {
 public:
  // Starts argv[0] (a path) with the process environment plus `env`.
  Job(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
      std::string logPath)
      : process_({.argv = argv, .env = env, .stdoutPath = std::move(logPath),
                  .ownProcessGroup = true}) {}

  pid_t pid() const { return process_.pid(); }
  void signal(int sig) { process_.signal(sig); }

  // The exit code (128 + signal for a signal death). Throws after `timeout`, having killed the
  // whole process group.
  int wait(std::chrono::seconds timeout) { return process_.wait(timeout); }

  std::string output() const { return process_.output(); }

 private:
  ddprun::testing::Process process_;
};

}  // namespace ddprun::trainers::testing
