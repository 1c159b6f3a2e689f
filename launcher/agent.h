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
#include <functional>
#include <memory>

#include "launcher/options.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::launcher {

struct WorkerResult;

// Something outside the agent that drives it and hears from it: the remote side of an ssh
// launch (launcher/cluster/remote_agent.h), which turns commands from the launching ddprun
// into signals and reports back. Every call is made on the agent's io_context thread.
class AgentLink {
 public:
  virtual ~AgentLink() = default;
  // Once, when the rendezvous handler exists and before the first round. `deliver(sig)`, called
  // on the io_context, makes the agent act as if signal `sig` had arrived. `hostedStorePort`
  // is the port of the rendezvous store this node hosts (0: none).
  virtual void attach(boost::asio::io_context& io, std::function<void(int)> deliver,
                      uint16_t hostedStorePort) = 0;
  // A worker of this node is the root cause of the job's failure; ddprun exits with exitCode.
  virtual void rootCause(const WorkerResult& worker, int exitCode) = 0;
  // The prefix of a worker's console lines.
  virtual std::string linePrefix(int nodeRank, int rank, int localRank) = 0;
};

class Agent {
 public:
  // `link` (optional, not owned) must outlive run().
  Agent(LaunchOptions options, Environment env, AgentLink* link = nullptr);
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
