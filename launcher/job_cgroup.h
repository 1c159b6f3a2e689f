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
//        └── round-<round>-rank-<local rank>/        one per worker, made before its spawn
//
// The worker starts in its cgroup (its guard forks it with clone3(CLONE_INTO_CGROUP), or where
// that is refused the worker writes "0" to cgroup.procs before exec); its guard stays outside. When the guard stops its worker it writes cgroup.kill, waits
// (bounded) until cgroup.events says "populated 0" (a zombie counts as gone), removes the
// worker's directory and tries the job's, which succeeds once the last worker's is gone: so
// after `kill -9` of ddprun the guards still leave nothing behind. ddprun itself kills and
// removes the cgroup of a worker whose guard died, and at its end the job's whole cgroup.
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

// The paths one worker's cgroup needs, prepared before fork: the functions taking it are
// async-signal-safe (open, write, read, rmdir, getdents64 on these strings; no allocation).
struct WorkerCgroup {
  std::string dir;     // empty: no cgroup for this worker
  std::string jobDir;  // its parent
  std::string procs, kill;  // dir + "/cgroup.procs", dir + "/cgroup.kill"
};
// In the worker, before exec: moves the calling process into the cgroup. Returns 0 or errno.
int joinCgroup(const WorkerCgroup& cg) noexcept;
// Writes cgroup.kill: SIGKILL to everything in the worker's cgroup, without waiting.
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
  // Creates the cgroup of one worker (and the job's again, which the guards remove each time
  // the last worker of a group is gone). On failure: a warning, and a WorkerCgroup without
  // dir (the worker runs without one).
  WorkerCgroup makeWorkerCgroup(int round, int localRank);

 private:
  explicit JobCgroup(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  bool warned_ = false;
};

}  // namespace ddprun::launcher
