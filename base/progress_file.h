#pragma once
// The progress file: how a worker tells its agent that it is making progress, at no cost to the
// training step and without the agent ever waiting on the worker.
//
// The agent keeps one small table per job, the *progress table* (ProgressTable below: an
// anonymous memory file, no file on disk): one 32-byte record per local rank, record i at offset
// 32 x i, each with the magic below and zero counters (rewritten in place at every round's start:
// nothing is created per worker or per round, which on ext4 costs ~0.1 ms each). It passes its
// path as DDPRUN_PROGRESS_FILE and the worker's record as DDPRUN_PROGRESS_SLOT (its local rank). The worker maps the file shared and
// bumps counters in its record in place (a relaxed atomic add: no system call); the agent reads
// it with pread on a timer (a page-cache read of 32 bytes), so a stalled, stopped or dead worker
// cannot block it. Record layout (host byte order; both ends are on one machine), 32 bytes:
//    0  u64 magic     kProgressMagic, written by the agent
//    8  u64 steps     units of progress so far (an optimizer step, an evaluation batch)
//   16  u64 waiting   collectives the worker is blocked in now (waiting for its peers)
//   24  u64 heartbeat bits 0-31: the heartbeat period the agent asks for, in ms (0: none),
//                     written by the agent; bits 32-63: the beats of the worker's heartbeat
//                     thread so far (0: it has none, yet or at all)
// Steps say that the training moves; heartbeats only that the process is scheduled: a thread
// of its own beats every period, through a long step, a slow data load or a long collective,
// and stops when the whole process stops (SIGSTOP, a frozen cgroup, a debugger, a machine too
// loaded to schedule it). The agent's --stall-warning watches the steps and only warns; its
// --peer-timeout watches the heartbeats and kills a worker that stops beating.
// A worker started without DDPRUN_PROGRESS_FILE (another launcher, both watches off), or whose
// file is missing, too short for its slot or not of this layout, reports nothing; progress
// reporting never fails. Without DDPRUN_PROGRESS_SLOT the slot is 0.
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/unique_fd.h"

namespace ddprun::progress {

constexpr uint64_t kProgressMagic = 0x314752504e555244ULL;  // the bytes "DRUNPRG1"
constexpr size_t kProgressRecordSize = 32;
constexpr const char* kProgressFileEnv = "DDPRUN_PROGRESS_FILE";
constexpr const char* kProgressSlotEnv = "DDPRUN_PROGRESS_SLOT";
constexpr int kMaxProgressSlots = 1 << 16;

constexpr uint64_t kHeartbeatPeriodMask = 0xffffffffULL;  // word 3: the period...
constexpr uint64_t kHeartbeatBeat = uint64_t{1} << 32;      // ...and one beat

struct ProgressSample {
  uint64_t steps = 0;
  uint64_t waiting = 0;
  uint64_t heartbeats = 0;  // beats so far (0: the worker has no heartbeat, yet or at all)
};

// Agent side: writes `slots` records (the magic, zero counters, the heartbeat period the workers
// should beat at: 0 none) to `path`, creating it the first time. Throws ddprun::Error naming
// the path when it cannot.
void writeProgressTable(const std::string& path, int slots, uint32_t heartbeatPeriodMs = 0);
// Agent side: rewrites record `slot` alone of an existing table (as writeProgressTable does), for
// a worker that replaces a dead one while the others keep counting in theirs.
void resetProgressRecord(const std::string& path, int slot, uint32_t heartbeatPeriodMs = 0);

// Agent side: the job's progress table, open for the agent's life. Where the system allows it
// an anonymous memory file (memfd_create) that the workers open as /proc/<agent pid>/fd/<n>, so
// that nothing is created on disk or deleted at the end (on ext4 each such inode scans the
// inodes deleted in its block group in the last 30 s: docs/rendezvous.md, "What an agent
// process costs"); it goes when the agent and every worker that mapped it have ended. Where
// memfd_create is refused (an old kernel, a seccomp filter) or /proc does not show it, the
// file `fallbackPath()` names, created as writeProgressTable does. Throws ddprun::Error naming
// the file when neither can be opened.
class ProgressTable {
 public:
  explicit ProgressTable(const std::function<std::string()>& fallbackPath);
  // What DDPRUN_PROGRESS_FILE names; readable with open(2) like a file.
  const std::string& path() const { return path_; }
  // The records writeProgressTable writes, and resetProgressRecord's rewrite of one record.
  void write(int slots, uint32_t heartbeatPeriodMs = 0);
  void reset(int slot, uint32_t heartbeatPeriodMs = 0);

 private:
  UniqueFd fd_;
  std::string path_;
};

// Agent side: the counters of record `slot` of an open progress table, or nullopt when it is not
// one (short, wrong magic, unreadable). Never blocks on the worker.
std::optional<ProgressSample> readProgressRecord(int fd, int slot);

// Worker side: record DDPRUN_PROGRESS_SLOT of the file named by DDPRUN_PROGRESS_FILE, mapped
// once (thread-safe). Every call is a no-op when there is none.
class ProgressWriter {
 public:
  // The process-wide writer (opened on first use from the environment). While a ProgressHold
  // lives: a no-op writer, and the process's own is not opened.
  static ProgressWriter& instance();
  ProgressWriter(const std::string& path, int slot);  // empty path: a no-op writer
  ~ProgressWriter();
  ProgressWriter(const ProgressWriter&) = delete;
  ProgressWriter& operator=(const ProgressWriter&) = delete;

  bool active() const { return words_ != nullptr; }
  void step();          // one more unit of progress
  void enterWait();     // blocked in a collective from now on...
  void leaveWait();     // ...until this
  // Starts the heartbeat thread at the period the agent wrote in the file; idempotent, a no-op
  // when the agent asked for none (or there is no file). The thread is detached and lives until
  // the process ends (it only sleeps and bumps the word; the mapping then is never unmapped),
  // so nothing at exit waits for it, and a child forked later has none (it is not the worker).
  // Returns the period in ms (0: no heartbeat).
  uint32_t startHeartbeat();

 private:
  std::atomic<bool> beating_{false};
  void* map_ = nullptr;        // the file, from offset 0 to the end of our record
  size_t mapBytes_ = 0;
  uint64_t* words_ = nullptr;  // our record: magic, steps, waiting, heartbeat
};

// While one lives, ProgressWriter::instance() is a no-op writer and does not open the process's
// writer. Why: the writer binds to DDPRUN_PROGRESS_SLOT on first use, for the process's life; a
// hot spare has no slot until it takes a rank (the launcher drops the variable), yet its warm-up
// runs DDP, which reports progress (worker_runtime/runtime.cpp, InitOptions::spareWarmup).
// Opened there, the writer would take slot 0's record: rank 0's. Holds nest; thread-safe.
class ProgressHold {
 public:
  ProgressHold();
  ~ProgressHold();
  ProgressHold(const ProgressHold&) = delete;
  ProgressHold& operator=(const ProgressHold&) = delete;
};

}  // namespace ddprun::progress
