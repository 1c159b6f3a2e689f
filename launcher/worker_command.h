#pragma once
// What each worker executes, decided once per launch, as torchrun decides it:
//   - PROGRAM runs directly; a PROGRAM ending in .py, -m MODULE and --run-path run under
//     $PYTHON_EXEC (else python3 on PATH) with -u; --no-python forces direct execution;
//   - --pass-local-rank adds --local_rank=${local_rank} right after PROGRAM, where
//     torch.distributed.launch put it;
//   - in every argument after argv[0], ${local_rank} and $local_rank become the worker's
//     local rank and $$ becomes $ (torchrun applies Python's Template.safe_substitute).
#include <string>
#include <string_view>
#include <vector>

#include "launcher/options.h"
#include "base/errors.h"

namespace ddprun::launcher {

// PROGRAM (or the interpreter) cannot be found on PATH, or cannot be executed. main() exits
// with 127 (not found) or 126 (not executable), as a shell does.
class ProgramError : public ConfigError {
 public:
  ProgramError(const std::string& what, int exitCode) : ConfigError(what), exitCode_(exitCode) {}
  int exitCode() const { return exitCode_; }

 private:
  int exitCode_;
};

struct WorkerCommand {
  std::string executable;         // the path given to execve
  std::vector<std::string> argv;  // argv[0] first; macros not yet substituted
  bool python = false;            // runs under the Python interpreter
};

// Throws ProgramError when the executable is missing or not executable.
WorkerCommand buildWorkerCommand(const LaunchOptions& options, const Environment& env);

// The argv of one local rank (macros substituted in argv[1..]).
std::vector<std::string> argvForRank(const WorkerCommand& command, int localRank);

// Python's string.Template(arg).safe_substitute(local_rank=N).
std::string substituteLocalRank(std::string_view arg, int localRank);

// Looks `name` up like execvp: a name containing '/' is taken as is, others are searched in
// PATH. Returns "" when nothing executable is found.
std::string findExecutable(const std::string& name, const Environment& env);

}  // namespace ddprun::launcher
