// The pure half of the ssh launch: which hosts, what each remote agent runs, ssh's argv.
// The running half (sessions, relaying, signals, exit code) is in ssh_launch_run.cpp.
#include "launcher/cluster/ssh_launch.h"

#include <set>
#include <sstream>

#include "base/errors.h"
#include "launcher/cluster/remote_agent.h"

namespace ddprun::launcher::cluster {

std::vector<HostSlots> launchHosts(const LaunchOptions& o) {
  if (!o.hosts.empty() && !o.hostfile.empty())
    throw ConfigError("--hosts and --hostfile cannot be used together: give one list of hosts");
  if (!o.hosts.empty()) return parseHosts(o.hosts);
  if (!o.hostfile.empty()) return readHostfile(o.hostfile);
  throw ConfigError("an ssh launch needs --hosts or --hostfile");
}

std::vector<std::string> remoteAgentArgv(const RemoteAgentInputs& in) {
  // Flags the launch sets for each host itself; every other given flag passes through.
  static const std::set<std::string> kOwn = {
      "hosts",      "hostfile",  "nproc-per-node", "rdzv-backend", "rdzv-endpoint",
      "rdzv-id",    "rdzv-conf", "standalone",     "node-rank",    "master-addr",
      "master-port", "local-addr", "nnodes"};
  std::vector<std::string> argv{in.ddprunPath, kRemoteAgentFlag};
  std::string nproc = "1", nnodes = std::to_string(in.hostCount), conf;
  for (const auto& [name, value] : in.given) {
    if (name == "nproc-per-node") nproc = value;
    if (name == "nnodes") nnodes = value;
    if (name == "rdzv-conf") conf = value;
    if (kOwn.count(name)) continue;
    if (value == "1" && (name == "module" || name == "no-python" || name == "run-path" ||
                         name == "pass-local-rank" || name == "no-agent-store")) {
      argv.push_back("--" + name);
    } else if (value == "0" && (name == "module" || name == "no-python" || name == "run-path" ||
                                name == "pass-local-rank" || name == "no-agent-store")) {
      // a switch given as off: the default
    } else {
      argv.push_back("--" + name + "=" + value);
    }
  }
  if (in.host->slots) nproc = std::to_string(*in.host->slots);
  if (in.isHost && conf.find("is_host") == std::string::npos)
    conf += std::string(conf.empty() ? "" : ",") + "is_host=" + (*in.isHost ? "1" : "0");
  argv.push_back("--nnodes=" + nnodes);
  argv.push_back("--nproc-per-node=" + nproc);
  argv.push_back("--rdzv-backend=c10d");
  argv.push_back("--rdzv-endpoint=" + in.endpoint);
  argv.push_back("--rdzv-id=" + in.runId);
  argv.push_back("--node-rank=" + std::to_string(in.nodeRank));
  if (!conf.empty()) argv.push_back("--rdzv-conf=" + conf);
  argv.push_back("--");
  argv.push_back(in.program);
  argv.insert(argv.end(), in.programArgs.begin(), in.programArgs.end());
  return argv;
}

std::vector<std::string> sshArgv(const std::vector<std::string>& sshCommand,
                                 const std::vector<std::string>& sshOptions,
                                 const std::string& destination, const std::string& command) {
  // ssh takes the first value it gets for an option: the user's come before ours.
  std::vector<std::string> argv = sshCommand.empty() ? std::vector<std::string>{"ssh"} : sshCommand;
  for (const auto& o : sshOptions) {
    argv.push_back("-o");
    argv.push_back(o);
  }
  for (const char* a : {"-T", "-o", "BatchMode=yes", "--"}) argv.push_back(a);
  argv.push_back(destination);
  argv.push_back(command);
  return argv;
}

std::vector<std::string> splitWords(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace ddprun::launcher::cluster
