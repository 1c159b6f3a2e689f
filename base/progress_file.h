#pragma once
// The progress file: how a worker tells its agent that it is making progress, at no cost to the
// training step and without the agent ever waiting on the worker.
//
// The agent creates one small file per worker in the worker's run directory, with the magic
// below and zero counters, and passes its path as DDPRUN_PROGRESS_FILE. The worker maps it
// shared and bumps counters in place (a relaxed atomic add: no system call); the agent reads
// it with pread on a timer (a page-cache read of 32 bytes), so a stalled, stopped or dead
// worker cannot block it. Layout (host byte order; both ends are on one machine), 32 bytes:
//    0  u64 magic     kProgressMagic, written by the agent
//    8  u64 steps     units of progress so far (an optimizer step, an evaluation batch)
//   16  u64 waiting   collectives the worker is blocked in now (waiting for its peers)
//   24  u64 reserved  0
// A worker started without DDPRUN_PROGRESS_FILE (another launcher, --stall-warning=0), or whose
// file is missing or not of this layout, reports nothing; progress reporting never fails.
#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::progress {

constexpr uint64_t kProgressMagic = 0x314752504e555244ULL;  // the bytes "DRUNPRG1"
constexpr size_t kProgressFileSize = 32;
constexpr const char* kProgressFileEnv = "DDPRUN_PROGRESS_FILE";

struct ProgressSample {
  uint64_t steps = 0;
  uint64_t waiting = 0;
};

// Agent side: creates (or truncates) `path` with the magic and zero counters. Throws
// ddprun::Error naming the path when it cannot.
void createProgressFile(const std::string& path);
// Agent side: the counters of an open progress file, or nullopt when it is not one (short,
// wrong magic, unreadable). Never blocks on the worker.
std::optional<ProgressSample> readProgressFile(int fd);

// Worker side: the file named by DDPRUN_PROGRESS_FILE, mapped once (thread-safe). Every call is
// a no-op when there is none.
class ProgressWriter {
 public:
  // The process-wide writer (opened on first use from the environment).
  static ProgressWriter& instance();
  explicit ProgressWriter(const std::string& path);  // empty path: a no-op writer
  ~ProgressWriter();
  ProgressWriter(const ProgressWriter&) = delete;
  ProgressWriter& operator=(const ProgressWriter&) = delete;

  bool active() const { return words_ != nullptr; }
  void step();          // one more unit of progress
  void enterWait();     // blocked in a collective from now on...
  void leaveWait();     // ...until this

 private:
  uint64_t* words_ = nullptr;  // the mapping: magic, steps, waiting, reserved
};

}  // namespace ddprun::progress
