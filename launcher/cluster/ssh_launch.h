#pragma once
// One command for several hosts: `ddprun --hosts h1:2,h2:2 [FLAGS] PROGRAM [ARGS]` (or
// --hostfile FILE) starts one agent per host over OpenSSH and stays in the foreground:
//
//   local ddprun ──ssh h1── ddprun --remote-agent ... (hosts the rendezvous store, port 0:
//        │                    a free one, reported back)  ── workers
//        └─────────ssh h2── ddprun --remote-agent --rdzv-endpoint=h1:PORT ...  ── workers
//
// - Each remote agent gets the local command line's flags (those given on the command line,
//   in --config or as PET_*), its place in the list as node rank (--node-rank, which a remote
//   agent's c10d rendezvous keeps), the host's slots as --nproc-per-node, --nnodes = the number of
//   hosts (unless given), --rdzv-backend=c10d, one run id (--rdzv-id, else a random one) and
//   the endpoint: the first host hosts the store on a free port, unless --rdzv-endpoint names
//   one. The exported environment (remote_protocol.h) goes over ssh's stdin, never argv.
// - ssh runs as `ssh [DDPRUN_SSH's words | ssh] [-o OPT for each --ssh-option] -T
//   -o BatchMode=yes -- HOST 'cd DIR; exec DDPRUN --remote-agent ...'`, DIR being the local
//   working directory (the login directory where the host has none), DDPRUN this executable's
//   path.
// - Output of every host reaches this terminal as whole lines: worker lines as
//   "[node N rank R]: ...", the remote agents' own lines as "[HOST]: ...".
// - A host that cannot be reached (or whose agent does not start) fails the job at once with
//   one line naming the host and ssh's message; exit 1.
// - The exit code is the root cause's (with the host that had it named), else the first
//   non-zero code of a remote agent, else 0. A remote agent that ends with an error in a job
//   of fixed size makes the others stop (SIGTERM), as the job cannot go on.
// - SIGINT/SIGTERM/SIGHUP/SIGQUIT are relayed to every remote agent ("signal N" on stdin),
//   which forwards them to its workers; a second one kills at once; ddprun exits 128 + N.
//   If ddprun dies, even by SIGKILL, every ssh's stdin reaches EOF and each remote agent stops
//   its workers and exits.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/cluster/hosts.h"
#include "launcher/options.h"

namespace ddprun::launcher::cluster {

// The hosts of --hosts or --hostfile (ConfigError when both or neither are set).
std::vector<HostSlots> launchHosts(const LaunchOptions& o);

struct RemoteAgentInputs {
  std::string ddprunPath;                                     // the executable on the host
  std::vector<std::pair<std::string, std::string>> given;     // ParseOutcome::given
  const HostSlots* host = nullptr;
  int nodeRank = 0;               // the host's place in the list: its node rank
  int hostCount = 0;
  std::string runId;
  std::string endpoint;           // HOST:PORT (port 0 on the host that binds a free one)
  std::optional<bool> isHost;     // is_host for --rdzv-conf (unset with --rdzv-endpoint)
  std::string program;
  std::vector<std::string> programArgs;
};
// The remote agent's argv (pure): ddprunPath --remote-agent FLAGS PROGRAM ARGS.
std::vector<std::string> remoteAgentArgv(const RemoteAgentInputs& in);

// ssh's argv (pure). `sshCommand`: DDPRUN_SSH's words, empty for plain "ssh".
std::vector<std::string> sshArgv(const std::vector<std::string>& sshCommand,
                                 const std::vector<std::string>& sshOptions,
                                 const std::string& destination, const std::string& command);

// Splits DDPRUN_SSH at blanks ("ssh -F /etc/ddprun/ssh_config" -> 3 words).
std::vector<std::string> splitWords(const std::string& text);

// Runs the launch to its end; returns ddprun's exit code. Throws ConfigError on bad input.
int runSshLaunch(const LaunchOptions& options,
                 const std::vector<std::pair<std::string, std::string>>& given,
                 const Environment& env);

}  // namespace ddprun::launcher::cluster
