#pragma once
// Agent: ddprun's loop on one node.
//
//        ┌──────────────────────────────────────────────────────────────┐
//        v                                                              │
//   Rendezvous ──round──> Running ──a worker fails──> Stopping ──restart allowed──┘
//        │                  │  │                         │
//        │                  │  └─ restart requested ──> Stopping ──> Rendezvous (no restart spent)
//        │                  └─ all succeeded ──> Finishing (exit barrier) ──> exit 0
//        └─ signal ──> leave ──> exit 128+signal     budget spent ──> report ──> exit code of root cause
//
// Everything runs on one io_context, on the calling thread: the hosted store (inside the
// rendezvous handler), the signal_set, timers, the workers' status and output pipes. The
// agent wakes when something happens (a worker exits, a signal arrives, a round completes);
// it never polls. Signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT by default) are forwarded to every
// worker's process group; --shutdown-timeout later the rest is killed; a second signal kills
// at once.
#include <memory>

#include "launcher/options.h"

namespace ddprun::launcher {

class Agent {
 public:
  Agent(LaunchOptions options, Environment env);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end and returns ddprun's exit code: 0, the root cause's exit code,
  // or 128 + signal number. Throws (ConfigError, NetworkError, ...) when the launcher itself
  // fails; no worker is left running either way.
  int run();

  // After run() returned non-zero (or threw): what ddprun writes to its own
  // TORCHELASTIC_ERROR_FILE (launcher_error_file.h); empty when run() did not get that far.
  std::string errorRecord() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::launcher
