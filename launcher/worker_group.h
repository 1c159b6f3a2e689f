#pragma once
// WorkerGroup: this node's workers of one round, started, watched and stopped as a unit.
//
// Everything is event-driven on the agent's io_context: each worker's guard reports the
// worker's exit on a status pipe (guarded_process.h), its stdout/stderr are pipes, and the
// shutdown grace is a timer. There is no polling.
//
// Life of a group:
//   start() ─> workers run ─> each exit is reported through Callbacks::exited
//   stop(sig, grace): sig to every running worker's process group, SIGKILL after grace
//   once every worker has exited, the group closes itself: the guards' control pipes are
//   closed (so whatever the workers left behind in their process groups is killed), the
//   guards are reaped, the output pipes drained; then Callbacks::stopped fires, once.
// Output never blocks the loop: a worker's pipe whose console is congested (output.h,
// Console) is not read until the console drains; the worker blocks on its full pipe.
// The destructor kills and reaps whatever is still there, synchronously.
#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/guarded_process.h"
#include "launcher/output.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::launcher {

struct WorkerLaunch {
  int localRank = 0;
  int globalRank = 0;
  // >= 0: a hot spare (docs/recovery.md#hot-spares) with this id, in no rank until assign()ed
  // (localRank and globalRank are -1 until then).
  int spareId = -1;
  // The spare template (spare_template.h): counted as a waiting spare nowhere (never assigned,
  // not in waitingSpares()), stopped with the group as the spares are.
  bool sparesTemplate = false;
  SpawnRequest spawn;
  // How the process starts: spawnGuarded(spawn) when empty (a fork of the spare template
  // otherwise, which falls back to spawnGuarded itself).
  std::function<GuardedProcess(const SpawnRequest&)> spawner;
  StreamTargets stdoutTargets;
  StreamTargets stderrTargets;
  std::string errorFile;  // TORCHELASTIC_ERROR_FILE of this worker
  std::string progressFile;  // DDPRUN_PROGRESS_FILE of this worker (empty: not watched)
};

// How one worker ended.
struct WorkerResult {
  int localRank = 0;
  int globalRank = 0;
  int spareId = -1;           // started as hot spare <id> (-1: started for a rank)
  bool spare = false;         // a spare still waiting (not assigned): in no rank
  bool sparesTemplate = false;  // the spare template (also `spare`: in no rank)
  pid_t pid = -1;             // the worker's pid (-1 if it never started)
  bool ended = false;
  int waitStatus = 0;         // as from waitpid
  int execErrno = 0;          // execve failed with this errno
  bool guardLost = false;     // the guard died on its own; the group was killed
  int stopSignal = 0;         // the signal ddprun sent to stop it (0: none)
  std::string killedBecause;  // ddprun killed this one worker (kill()): why, for describe()
  std::chrono::system_clock::time_point endTime;
  std::string errorFile;
  std::deque<std::string> stderrTail;  // complete once the group has stopped

  bool failed() const;
  // The exit code ddprun reports for it: the exit code, or 128 + signal number.
  int exitCode() const;
  // "exit code 3", "signal 9 (SIGKILL)", "could not execute: No such file or directory".
  std::string describe() const;
};

class WorkerGroup : public std::enable_shared_from_this<WorkerGroup> {
 public:
  struct Callbacks {
    std::function<void(const WorkerResult&)> exited;  // a worker's process ended
    std::function<void(const WorkerResult&)> started;  // it exec'd: its pid is known (optional)
    std::function<void()> stopped;                    // everything reaped and drained
  };
  static constexpr size_t kTailLines = 20;

  WorkerGroup(boost::asio::io_context& io, Callbacks callbacks);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Spawns every worker. On failure, kills the ones already started and rethrows.
  void start(std::vector<WorkerLaunch> launches);
  // Starts one more worker while the others run: a replacement for one that died (in-process
  // recovery, docs/recovery.md). It gets a slot and a result of its own (results() keeps the
  // dead one's); its exit comes through Callbacks::exited like any other. Only before the
  // group has begun to close (some worker still running). Throws what the spawn throws.
  void add(WorkerLaunch launch);
  // A waiting spare (started by add() with a spareId) takes local rank `localRank`, global
  // rank `globalRank`: from now on it is that rank's worker. False when `pid` is no waiting
  // spare of this group (it ended meanwhile).
  bool assign(pid_t pid, int localRank, int globalRank);
  // A running worker's global rank changes (--recovery-policy=shrink renumbers the survivors;
  // its local rank, the slot of its logs and progress record, stays). False when `pid` is no
  // running worker of this group.
  bool renumber(pid_t pid, int globalRank);
  // Worker `pid` (running, not a waiting spare) is known to have ended with `waitStatus` before
  // its guard reports it (its zombie's status, read from /proc: base/process.h processDying):
  // it ends now, as if reported (the `exited` callback runs), and the guard's report, when it
  // comes, changes nothing. False when no such worker runs.
  bool endEarly(pid_t pid, int waitStatus);
  // The console prefix of the lines of worker `pid` (a spare, or a running worker) from now on:
  // the launcher's books follow a rank change, the process's own RANK variable cannot (its
  // environment is fixed at exec; a program reads Runtime::rank()). No-op for an unknown pid.
  void setPrefix(pid_t pid, const std::string& prefix);
  // Sends `sig` to every worker still running (its whole process group); those still
  // running after `grace` get SIGKILL.
  void stop(int sig, std::chrono::milliseconds grace);
  // SIGKILL to one running worker and everything it started, through its guard's sweep (the
  // guard is sent SIGCONT too, in case its process group was stopped with it). Its exit comes
  // through Callbacks::exited as a failure that describe()s `why`. The others are left alone.
  void kill(int localRank, const std::string& why);
  // SIGKILL to every process group and reap the guards, synchronously (teardown).
  void killAll();

  const std::vector<WorkerResult>& results() const { return results_; }
  // Workers running, spares still waiting not counted: once none is left, the group closes
  // (the waiting spares are stopped with it; their results say stopSignal SIGKILL).
  size_t runningCount() const;
  // The waiting spares still running.
  std::vector<WorkerResult> waitingSpares() const;
  // pids of the workers that have started, waiting spares not included (for logs and tests).
  std::vector<pid_t> workerPids() const;

 private:
  // Starts one worker with its output sinks; its slot and result are appended (not yet read).
  void spawnSlot(WorkerLaunch& launch);
  struct Slot;
  void readStatus(size_t i);
  void readOutput(size_t i, bool isStderr);
  void onRecord(size_t i, const GuardRecord& r);
  void onWorkerEnded(size_t i);
  void onGuardGone(size_t i);
  void closeControls();
  void checkStopped();
  void finishOutputs();
  struct ConsoleWait;
  void waitForConsole(size_t i, bool isStderr);
  void armConsoleWait(ConsoleWait& w);

  boost::asio::io_context& io_;
  Callbacks callbacks_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<WorkerResult> results_;
  struct Timers;
  std::unique_ptr<Timers> timers_;
  std::vector<std::unique_ptr<ConsoleWait>> consoleWaits_;  // one per congested console
  bool controlsClosed_ = false;
  bool stoppedFired_ = false;
  bool drainArmed_ = false;
  int stopSignal_ = 0;
};

}  // namespace ddprun::launcher
