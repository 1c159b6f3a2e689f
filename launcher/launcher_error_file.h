#pragma once
// ddprun's own error file, for whoever runs ddprun.
//
// Job schedulers (TorchX, Kubernetes operators, batch wrappers) set TORCHELASTIC_ERROR_FILE for
// the launcher itself and read the job's root cause from it afterwards: torchrun's entry point
// is decorated with @record. ddprun writes the same JSON there, atomically (a temporary file in
// the same directory, then rename), and only when it exits non-zero:
//   - the root-cause worker wrote an error file: that document, with "errorCode" (the exit code
//     ddprun exits with) added to its message object, as torch's ErrorHandler.dump_error_file;
//   - it wrote none, the job failed on another node, ddprun was stopped by a signal, or the
//     launcher itself failed: a generated record in the same format,
//       {"message": {"message": "Signal 9 (SIGKILL) received by PID 4242",
//                    "extraInfo": {"timestamp": "1795311549"}, "errorCode": 137}}
// (The workers get their own paths in their environment, under the run directory.)
#include <string>

#include "launcher/failure_report.h"

namespace ddprun::launcher {

// The record for a failed worker: its own error file's document (errorCode added), or one
// generated from how it ended.
std::string workerErrorRecord(const ErrorFile& ef, const WorkerResult& worker);

// A generated record: `message`, the current time, `errorCode`.
std::string generatedErrorRecord(const std::string& message, int errorCode);

// Writes `record` to `path` atomically. Returns false (and logs why) when it cannot.
bool writeLauncherErrorFile(const std::string& path, const std::string& record);

}  // namespace ddprun::launcher
