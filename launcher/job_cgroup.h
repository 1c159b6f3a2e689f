#pragma once
// A cgroup v2 per job: the final sweep that nothing a worker started escapes.
//
// Each worker's guard (guarded_process.h) is a child subreaper and kills everything below
// it; what it cannot reach is a process that is no longer below a live guard -- its guard
// was killed from outside, say. A cgroup holds every process forked inside it, whatever it
// does with its parent, session or process group, and writing "1" to its `cgroup.kill`
// (Linux >= 5.14) SIGKILLs all of them, in child cgroups too, atomically (no fork races).
// So where ddprun finds a writable cgroup v2 hierarchy with cgroup.kill it creates
//
//   <ddprun's own cgroup>/ddprun-<run id>-<pid>/     the job: no controllers, no process
//        └── workers-<n>/                           where every worker starts
//
// once, and every worker of every round starts in workers-<n> (its guard forks it with
// clone3(CLONE_INTO_CGROUP), or where that is refused the worker writes "0" to cgroup.procs
// before exec); the guards and ddprun stay outside. One cgroup for all the job's workers, not
// one per worker: creating and removing a cgroup and starting the first process in a new one
// cost ~130 us per worker here, starting a process in an existing one ~30 us. A cgroup that
// was killed is not reused (on some kernels cgroup.kill also kills every process started in
// it later), so a sweep that had to kill replaces workers-<n> with workers-<n+1>.
// Who sweeps it:
//   - ddprun, whenever a group has stopped (every guard reaped), before the next round:
//     sweep() kills whatever is still in workers-<n> (the escapees of a guard killed from
//     outside), waits until it is empty and replaces it; and at its end it removes the job's.
//   - the guards, when ddprun died (their control pipe reached EOF without the release byte,
//     guarded_process.h): each kills the whole cgroup -- every worker of the job is being
//     killed anyway -- waits until it is empty and removes it, so after `kill -9` of ddprun
//     nothing is left, the directory included.
// The graceful stop does not change (the stop signal to the worker's process group, SIGKILL
// after --shutdown-timeout); cgroup.kill is the sweep after it, not a replacement.
//
// Without cgroup v2 (or not mounted), read-only or not writable for us, without cgroup.kill,
// or with DDPRUN_CGROUP=0 in ddprun's environment there is no job cgroup (a debug line says
// why) and the guards alone sweep, as before.
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace ddprun::launcher {

// Where this process's cgroup v2 directory is, from the text of /proc/self/mountinfo and
// /proc/self/cgroup (its "0::/path" line): `dir` is the directory, or empty and `whyNot` says
// why there is none. Pure; exposed for tests.
struct CgroupLookup {
  std::string dir;
  std::string whyNot;
};
CgroupLookup findOwnCgroup2(std::string_view mountinfo, std::string_view procSelfCgroup);
// The same from this process's /proc files.
CgroupLookup findOwnCgroup2();

// The paths a worker's guard needs, prepared before fork: the functions taking it are
// async-signal-safe (open, write, read, rmdir, getdents64 on these strings; no allocation).
struct WorkerCgroup {
  std::string dir;     // where the worker starts (workers-<n>); empty: no cgroup for it
  std::string jobDir;  // the job's cgroup
  std::string procs;   // dir + "/cgroup.procs"
  std::string kill;    // jobDir + "/cgroup.kill": every worker of the job
};
// In the worker, before exec: moves the calling process into the cgroup. Returns 0 or errno.
int joinCgroup(const WorkerCgroup& cg) noexcept;
// Writes the job's cgroup.kill: SIGKILL to every worker of the job and all they started,
// without waiting.
void killCgroup(const WorkerCgroup& cg) noexcept;
// Removes `dir`; unless that works at once (it is empty, no child cgroup), SIGKILLs
// everything in it and its child cgroups, waits until it is empty (at most `boundMs`) and
// removes it with its child cgroups. Returns true when the directory is gone
// (also when it was already). Async-signal-safe.
bool killAndRemoveCgroup(const char* dir, int boundMs) noexcept;

// The job's cgroup. Not thread-safe; lives on the agent's thread.
class JobCgroup {
 public:
  // Creates <own cgroup>/ddprun-<runId>-<pid>; null (with a debug log line saying why) when
  // cgroups cannot be used here or `disabled`.
  static std::unique_ptr<JobCgroup> create(const std::string& runId, bool disabled);
  // Kills whatever is left in the job's cgroup and removes it.
  ~JobCgroup();
  JobCgroup(const JobCgroup&) = delete;
  JobCgroup& operator=(const JobCgroup&) = delete;

  const std::string& dir() const { return dir_; }
  // Where a worker starts: workers-<n> (no dir when it could not be made: a warning said so).
  const WorkerCgroup& workerCgroup() const { return worker_; }
  // Once a group has stopped (its guards reaped) and before the next starts: kills what is
  // still in workers-<n>, waits until it is empty (at most kSweepBoundMs; a warning if it is
  // not) and replaces it with workers-<n+1>. One read of cgroup.events when it is empty, the
  // usual case.
  void sweep();
  static constexpr int kSweepBoundMs = 2000;

 private:
  explicit JobCgroup(std::string dir) : dir_(std::move(dir)) {}
  // Creates workers-<generation_> and points worker_ at it (or at nothing, with a warning).
  bool makeWorkersCgroup();
  std::string dir_;
  int generation_ = 0;
  WorkerCgroup worker_;
};

}  // namespace ddprun::launcher
