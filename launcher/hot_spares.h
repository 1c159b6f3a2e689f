#pragma once
// Hot spares (ddprun --spares=K, docs/recovery.md#hot-spares): the launcher's helpers.
//
// A spare is a worker process started without a rank: its environment is a worker's with
// RANK, LOCAL_RANK, ROLE_RANK and DDPRUN_PROGRESS_SLOT taken out and DDPRUN_SPARE=<id> put in.
// The runtime's init() sees DDPRUN_SPARE, loads nothing more, says it is ready in the store and
// WAITs for its assignment (rendezvous/recovery_keys.h); the program has loaded LibTorch and
// its data before it calls init(). In an in-process recovery the agent writes the assignment,
// the spare takes the rank and heals from a survivor's memory like a replacement.
//
// A spare started while training runs starts under SCHED_IDLE, so that its start-up (process,
// LibTorch, data: about a CPU-second) only takes CPU time nothing else wants. When it takes a
// rank the agent moves every thread of it back to SCHED_OTHER (a worker at idle priority would
// hold back every collective). Leaving SCHED_IDLE needs CAP_SYS_NICE, or an RLIMIT_NICE that
// allows nice 0; without either spares start at normal priority (one line says so).
#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun::launcher {

// The variables a spare's environment does not have: it is in no rank until assigned.
inline const std::vector<std::string>& spareDroppedVariables() {
  static const std::vector<std::string> names = {"RANK", "LOCAL_RANK", "ROLE_RANK",
                                                 "DDPRUN_PROGRESS_SLOT", "DDPRUN_GENERATION"};
  return names;
}

// A worker's merged environment ("KEY=VALUE" entries) made a spare's: the dropped variables
// out (also when they came from ddprun's own environment), DDPRUN_SPARE=<id> in. Pure.
std::vector<std::string> spareEnvironment(const std::vector<std::string>& workerEnv, int id);


// Moves every thread of `pid` to SCHED_OTHER, nice 0 (two passes: threads started meanwhile
// inherit their creator's policy). Returns the threads moved; `error` names a refusal.
int leaveIdlePriority(pid_t pid, std::string& error);
// The way back: every SCHED_OTHER thread of `pid` to SCHED_IDLE (always allowed).
int enterIdlePriority(pid_t pid, std::string& error);

// The scheduling policy of `pid` from /proc/<pid>/stat (SCHED_IDLE = 5), or -1.
int schedulingPolicy(pid_t pid);

}  // namespace ddprun::launcher
