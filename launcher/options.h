#pragma once
// LaunchOptions: everything `ddprun [OPTIONS] PROGRAM [ARGS...]` was asked to do, validated.
//
// Every torchrun flag is accepted in both spellings (--nproc-per-node and --nproc_per_node).
// A flag's value comes from, in order of precedence:
//   1. the command line,
//   2. the --config FILE.json (keys are flag names without the dashes, either spelling),
//   3. the environment variable PET_<NAME> (PET_NPROC_PER_NODE, as torchrun reads them),
//   4. torchrun's default.
// parseLaunchOptions() turns argv into LaunchOptions or throws ConfigError with one line that
// names the flag, the value, where it came from and what is allowed (main exits 2 on it).
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::launcher {

// A snapshot of environment variables (the launcher's own, or one given by a test).
using Environment = std::map<std::string, std::string>;
Environment currentEnvironment();

// Bits of a worker's standard streams: 1 = stdout, 2 = stderr, 3 = both.
enum StdStream : uint8_t { kStdNone = 0, kStdOut = 1, kStdErr = 2, kStdAll = 3 };

// --redirects / --tee: one value for every local rank ("3"), or per local rank ("0:1,1:2";
// ranks not listed get 0), exactly as torchrun reads them.
struct StreamSelection {
  uint8_t all = kStdNone;
  std::map<int, uint8_t> perRank;  // when not empty, replaces `all`
  uint8_t forRank(int localRank) const;
};

struct LaunchOptions {
  // ---- What each worker runs ----
  std::string program;                   // PROGRAM as given (a path, a name on PATH, a module)
  std::vector<std::string> programArgs;  // ARGS...
  bool module = false;                   // -m: PROGRAM is a Python module
  bool noPython = false;                 // --no-python: exec PROGRAM even when it ends in .py
  bool runPath = false;                  // --run-path: accepted; runs like a .py PROGRAM
  bool passLocalRank = false;            // --pass-local-rank: add --local_rank=N (old launch API)
  std::string startMethod = "spawn";     // --start-method: accepted, Python entry points only

  // ---- How many workers, and how the nodes find each other ----
  int nprocPerNode = 1;
  int minNodes = 1;
  int maxNodes = 1;
  bool standalone = false;
  std::string rdzvBackend = "static";    // static | c10d
  std::string rdzvEndpoint;              // "host[:port]" or empty
  std::string rdzvId = "none";
  std::vector<std::pair<std::string, std::string>> rdzvConf;  // --rdzv-conf k=v,... in order
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;                // 0 picks a free port
  std::string localAddr;
  bool agentStore = true;                // false with --no-agent-store
  std::string role = "default";
  int schedulerNodeRank = -1;            // the node rank a scheduler gave (SLURM_NODEID); the
                                         // c10d rendezvous keeps it (-1: none)

  // ---- One command for several hosts over ssh (launcher/cluster/) ----
  std::string hosts;                     // --hosts h1:2,h2:2
  std::string hostfile;                  // --hostfile FILE (lines "host slots=N")
  std::vector<std::string> sshOptions;   // --ssh-option OPT (repeatable): ssh -o OPT
  std::vector<std::string> exports;      // --export VAR[=VALUE] (repeatable)

  // ---- Supervision ----
  int maxRestarts = 0;
  double monitorInterval = 0.1;          // accepted; unused (supervision is event-driven)
  std::chrono::milliseconds shutdownTimeout{30'000};
  std::vector<int> signalsToHandle;      // filled by the parser (SIGTERM, SIGINT, SIGHUP, SIGQUIT)
  // --stall-warning: a worker without progress for this many seconds gets a warning line
  // (progress_watch.h). -1: auto (a multiple of its step time, with a floor); 0: off.
  double stallWarning = -1;
  // --peer-timeout: a worker whose heartbeat (worker_runtime/progress.h) stops for this many
  // seconds is killed and counts as failed (progress_watch.h). 0: off. Workers without a
  // heartbeat (no runtime) are never killed by it.
  double peerTimeout = 5.0;
  // --recovery (docs/recovery.md): what a worker's death costs the others. Restart: every
  // worker is stopped and the group started again (torchrun's way). InProcess: the others keep
  // running, a replacement takes the dead rank and heals from their memory, when every worker's
  // runtime announced it can (else restart). Auto: the same, without the warning line when
  // restart it is. One node with the agent's store only; elsewhere restart.
  enum class Recovery { Restart, InProcess, Auto };
  Recovery recovery = Recovery::Auto;
  // --recovery-policy (docs/recovery.md#shrink): what an in-process recovery does with the dead
  // rank. Replace: a spare or a new process takes it (world size and shards stay). Shrink: the
  // survivors go on without it at N-1 ranks, renumbered densely, and the sampler splits the rest
  // of the epoch over them; not below shrinkMinRanks (then the group restarts, as today).
  enum class RecoveryPolicy { Replace, Shrink };
  RecoveryPolicy recoveryPolicy = RecoveryPolicy::Replace;
  // The job's minimum world size for shrink: --nnodes' lower bound of nodes with one rank each
  // (in-process recovery runs on one node: 1), or M from --recovery-policy=shrink:M.
  int shrinkMinRanks = 1;
  // --spares: hot spares per node (docs/recovery.md#hot-spares): started once every worker of
  // the group announced in-process recovery, loaded, waiting for a rank; an in-process recovery
  // gives the dead rank to one of them instead of starting a process. Unused (one line says so)
  // under --recovery=restart or on several nodes.
  int spares = 0;

  // ---- Output ----
  std::string logDir;                    // empty: a temporary directory
  std::string timeline;                  // --timeline FILE (docs/timeline.md); empty: none
  StreamSelection redirects;
  StreamSelection tee;
  std::set<int> localRanksFilter;        // empty: every local rank reaches the console
};

// Defaults that a cluster scheduler supplies (launcher/cluster/slurm.h reads Slurm's). They
// rank between PET_* and the built-in defaults: a flag given on the command line, in --config
// or as PET_* wins over them.
struct SchedulerDefaults {
  std::string source;                         // "Slurm step 1234.0", for messages
  std::map<std::string, std::string> flags;   // flag name (dash spelling) -> value
  std::optional<int> gpus;                    // devices it gave this node, for
  std::optional<int> cpus;                    //   --nproc-per-node=gpu|cpu|auto
  int nodeRank = -1;                          // -> LaunchOptions::schedulerNodeRank
};

// What main() should do besides launching: print help or the version and exit.
struct ParseOutcome {
  std::optional<LaunchOptions> options;  // set when a launch was asked for
  std::string message;                   // help or version text (options unset)
  // The flags whose value did not come from a default: name (dash spelling) -> text, as given
  // on the command line, in --config or as PET_*; switches as "1"/"0". In the table's order.
  std::vector<std::pair<std::string, std::string>> given;
  std::vector<std::string> fromScheduler;  // flags whose value the scheduler supplied
};

// Parses argv (argv[0] is the program name). `env` supplies PET_* and the values behind
// --nproc-per-node=gpu|auto checks are done here too. Throws ConfigError on bad input.
ParseOutcome parseLaunchOptions(const std::vector<std::string>& argv, const Environment& env,
                                const SchedulerDefaults& scheduler = {});

// "ddprun 0.1.0 (git 1a2b3c4)": what --version prints.
std::string versionText();

}  // namespace ddprun::launcher
