#pragma once
// Spawning one worker so that nothing of it can outlive the launcher.
//
// PR_SET_PDEATHSIG would kill the worker when the launcher dies, but not the processes the
// worker started. So every worker gets a *guard*: a small process forked from the launcher
// (no exec) that leads a new process group and forks the worker inside it:
//
//   ddprun ──fork──> guard (process group leader, pgid = guard pid)
//                      └──fork+exec──> worker ──> worker's children (same process group)
//
// The guard holds the read end of a *control pipe* (a socket pair) whose write end only the
// launcher has.
// When that pipe reaches EOF -- the launcher closed it, or the launcher died, even by
// SIGKILL -- the guard kills every descendant with SIGKILL, then its process group (itself
// last). The launcher writes kReleaseByte before it closes the pipe on purpose
// (releaseGuard()), so a guard tells the launcher's death (EOF alone) from a stop. The guard is a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant that left
// the group (setsid) and lost its parent (double fork) is re-parented to the guard, so
// "every descendant" is everything the worker started; the guard sweeps /proc and kills
// until it has no child left. The guard also reaps the worker (and the orphans) and
// reports the worker on a *status pipe* (records below), so the launcher learns of a
// worker's exit the moment it happens, through an fd its event loop watches. The launcher
// stops a worker for good by closing its control pipe, not by killing the guard: a guard
// killed from outside cannot sweep (its group still dies, escaped descendants may not; with
// a job cgroup the launcher kills the worker's cgroup then).
// With a job cgroup (job_cgroup.h) the worker starts in the job's cgroup; when the launcher
// died, the guard's sweep starts with that cgroup's cgroup.kill and ends by removing it
// (with the launcher alive, the launcher sweeps the cgroup once the group has stopped).
// The guard ignores SIGINT/SIGTERM/SIGHUP/SIGQUIT: signals forwarded to the group are for
// the worker; the guard's only way out is the control pipe (or SIGKILL).
//
// Everything between fork and exec uses async-signal-safe calls only, so spawning is safe
// even if another thread of the launcher holds a lock.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "launcher/job_cgroup.h"

namespace ddprun::launcher {

// What the guard writes on the status pipe: fixed 8-byte records (atomic pipe writes).
struct GuardRecord {
  enum Kind : int32_t {
    Started = 1,     // value = the worker's pid; it has exec'd
    ExecFailed = 2,  // value = errno of the failed execve (an Exited record follows)
    Exited = 3,      // value = the worker's wait status
    CgroupFailed = 4,  // value = errno: the worker could not join its cgroup (runs without)
  };
  int32_t kind;
  int32_t value;
};

struct SpawnRequest {
  std::string executable;          // passed to execve as is
  std::vector<std::string> argv;
  std::vector<std::string> env;    // "KEY=VALUE"
  bool stdinFromDevNull = false;   // else the launcher's stdin is inherited
  WorkerCgroup cgroup;             // the worker's cgroup (job_cgroup.h); no dir: none
  // The worker starts under SCHED_IDLE (it runs only on a CPU nothing else wants): a hot spare
  // started while training runs (docs/recovery.md#hot-spares).
  bool idlePriority = false;
  // A descriptor the worker gets as kPassedFd (the launcher keeps its own; the guard holds no
  // copy once the worker runs): the spare template's socket (spare_template.h). -1: none.
  int passFd = -1;
  // The guard is a child subreaper (above). Off only for the spare template, whose forked
  // spares must leave it for the launcher (spare_template.h); its guard still kills its
  // process group and the descendants still below it.
  bool subreaper = true;
};

// The descriptor number SpawnRequest::passFd has in the worker.
constexpr int kPassedFd = 5;

struct GuardedProcess {
  pid_t guardPid = -1;      // also the process group id of the worker and its children
  UniqueFd control;         // write end: close it to kill the worker and all it started
  UniqueFd status;          // read end: GuardRecords
  UniqueFd stdoutRead;      // the worker's stdout
  UniqueFd stderrRead;      // the worker's stderr
};

// Written on the control pipe before the launcher closes it on purpose.
constexpr char kReleaseByte = 'R';

// Stops the worker for good: the release byte, then the control pipe closed (the
// guard kills the worker and all it started, reports, and exits). Idempotent.
void releaseGuard(UniqueFd& control) noexcept;

// Forks the guard, which forks and execs the worker. Returns at once (the Started record
// arrives on `status`). Throws ddprun::Error naming the failed system call.
GuardedProcess spawnGuarded(const SpawnRequest& request);

}  // namespace ddprun::launcher
