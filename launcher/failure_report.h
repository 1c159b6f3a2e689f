#pragma once
// The failure report ddprun prints on stderr when the job fails: the root cause (the first
// worker to fail) in full -- rank, local rank, pid, exit code or signal, time, the error file
// that PyTorch's @record wrote to TORCHELASTIC_ERROR_FILE, the last lines of its stderr --
// and one line for every other worker that did not succeed.
#include <optional>
#include <string>
#include <vector>

#include "launcher/worker_group.h"

namespace ddprun::launcher {

// The error file as PyTorch's @record writes it:
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
// or anything else (then `raw` holds it, shortened).
// The worker controls this file: it is read only when it is a regular file (opened
// non-blocking, so a FIFO never blocks the launcher, and checked with fstat, so a link to
// /dev/zero is refused) and only up to kMaxErrorFileBytes.
inline constexpr size_t kMaxErrorFileBytes = 64 * 1024;
struct ErrorFile {
  bool present = false;
  std::string unreadable;  // why an existing file was not read ("not a regular file (FIFO)")
  bool cut = false;        // longer than kMaxErrorFileBytes: only the start was read
  uint64_t size = 0;       // its size as fstat saw it
  std::string message;
  std::string traceback;
  std::string timestamp;  // seconds since the epoch, as written
  std::string raw;        // when it is not in PyTorch's format
  // Written by ddprun::runtime (worker_runtime/error_file.h) into extraInfo:
  std::string exceptionType;       // "ddprun::runtime::IncompatibleCheckpoint"
  std::optional<bool> retryable;   // false: a restart cannot fix it (ends the job at once)
  std::string json;  // the whole document, when it is a JSON object with "message" (compact)
};
ErrorFile readErrorFile(const std::string& path);

struct FailureReport {
  std::string program;
  std::string host;
  // The attempt is TORCHELASTIC_RESTART_COUNT, the number the workers see (restarts spent);
  // the round counts every start of the worker group, membership changes included.
  int restartCount = 0;
  uint64_t round = 0;
  int maxRestarts = 0;
  WorkerResult rootCause;
  std::vector<WorkerResult> others;  // failed or stopped workers besides the root cause
  bool pythonWorker = false;         // the @record hint is only for Python programs
  std::string keptDirectory;         // the run directory kept for this failure (temporary one)
};

std::string formatFailureReport(const FailureReport& report);

// "2026-11-22 01:20:03.123" in local time.
std::string formatTime(std::chrono::system_clock::time_point t);

}  // namespace ddprun::launcher
