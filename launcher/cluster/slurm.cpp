#include "launcher/cluster/slurm.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <sstream>

#include "base/errors.h"
#include "launcher/cluster/command.h"
#include "launcher/cluster/hostlist.h"

namespace ddprun::launcher::cluster {
namespace {

const std::string* find(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int number(const Environment& env, const char* name, int min) {
  const std::string* v = find(env, name);
  int n = 0;
  if (v) {
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec == std::errc() && end == v->data() + v->size() && n >= min) return n;
  }
  throw ConfigError(std::string("Slurm: ") + name + "=" + (v ? *v : "") +
                    ": expected an integer >= " + std::to_string(min) +
                    " (ddprun reads the step's layout from Slurm's environment)");
}

// SLURM_STEP_TASKS_PER_NODE: "1(x4)", "2,1", ... -> the largest count.
int maxTasksPerNode(const std::string& text) {
  int most = 0;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int n = 0;
    std::from_chars(item.data(), item.data() + item.size(), n);
    most = std::max(most, n);
  }
  return most;
}

bool isAddress(const std::string& name) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, name.c_str(), buf) == 1 || ::inet_pton(AF_INET6, name.c_str(), buf) == 1;
}

std::string withPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

std::optional<SlurmStep> readSlurmStep(const Environment& env) {
  if (!find(env, "SLURM_JOB_ID") || !find(env, "SLURM_STEP_ID")) return std::nullopt;
  SlurmStep s;
  s.jobId = *find(env, "SLURM_JOB_ID");
  const std::string& stepText = *find(env, "SLURM_STEP_ID");
  const auto [stepEnd, stepErr] =
      std::from_chars(stepText.data(), stepText.data() + stepText.size(), s.stepId);
  if (stepErr != std::errc() || stepEnd != stepText.data() + stepText.size()) {
    throw ConfigError("Slurm: SLURM_STEP_ID=" + stepText +
                      ": expected a step number (ddprun reads the step's layout from Slurm's "
                      "environment)");
  }
  const char* countVar = find(env, "SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  s.nodeCount = number(env, countVar, 1);
  s.nodeId = number(env, "SLURM_NODEID", 0);
  const char* listVar = find(env, "SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                        : find(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                          : "SLURM_NODELIST";
  const std::string* list = find(env, listVar);
  if (!list) throw ConfigError("Slurm: SLURM_JOB_NODELIST is not set (SLURM_JOB_ID is)");
  try {
    s.nodes = expandHostlist(*list);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("Slurm: ") + listVar + ": " + e.what());
  }
  if (static_cast<int>(s.nodes.size()) != s.nodeCount || s.nodeId >= s.nodeCount) {
    throw ConfigError(std::string("Slurm: ") + listVar + "=" + *list + " names " +
                      std::to_string(s.nodes.size()) + " node(s), but " + countVar + "=" +
                      std::to_string(s.nodeCount) + " and SLURM_NODEID=" +
                      std::to_string(s.nodeId));
  }
  s.nodeName = find(env, "SLURMD_NODENAME") ? *find(env, "SLURMD_NODENAME") : s.nodes[s.nodeId];
  const char* tasksVar = find(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                                                                : "SLURM_TASKS_PER_NODE";
  if (const std::string* tasks = find(env, tasksVar); tasks && maxTasksPerNode(*tasks) > 1) {
    throw ConfigError(std::string("Slurm: ") + tasksVar + "=" + *tasks +
                      ": srun started several ddprun on one node; ddprun starts the node's "
                      "workers itself: use srun --ntasks-per-node=1 (and --nproc-per-node)");
  }
  if (find(env, "SLURM_GPUS_ON_NODE")) s.gpus = number(env, "SLURM_GPUS_ON_NODE", 0);
  if (find(env, "SLURM_CPUS_ON_NODE")) s.cpus = number(env, "SLURM_CPUS_ON_NODE", 1);
  return s;
}

std::map<std::string, std::string> parseScontrolNodes(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string word, name, addr;
    while (words >> word) {
      if (word.rfind("NodeName=", 0) == 0) name = word.substr(9);
      if (word.rfind("NodeAddr=", 0) == 0) addr = word.substr(9);
    }
    if (!name.empty() && !addr.empty() && addr != "(null)") out[name] = addr;
  }
  return out;
}

std::map<std::string, std::string> scontrolNodeAddresses(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ",") + n;
  auto text = runCommand({"scontrol", "show", "node", "-o", list}, std::chrono::seconds(5));
  return text ? parseScontrolNodes(*text) : std::map<std::string, std::string>{};
}

int slurmStorePort(const std::string& jobId, unsigned long long stepId) {
  unsigned long long id = 0;
  std::from_chars(jobId.data(), jobId.data() + jobId.size(), id);
  return 29400 + static_cast<int>((id % 1000 * 10 + stepId % 1000) % 1000);
}

std::string slurmRunId(const SlurmStep& step) {
  return step.jobId + "." + std::to_string(step.stepId);
}

SchedulerDefaults slurmDefaults(const SlurmStep& step, const NodeAddressLookup& lookup) {
  const std::string& first = step.nodes.front();
  // Names that are addresses already need no NodeAddr; one node hosts its own store: no
  // address to agree on, no query to slurmctld.
  std::vector<std::string> ask;
  for (const std::string* n : {&first, &step.nodeName}) {
    if (!isAddress(*n) && std::find(ask.begin(), ask.end(), *n) == ask.end()) ask.push_back(*n);
  }
  const auto addrs = step.nodeCount > 1 && !ask.empty() ? lookup(ask)
                                                        : std::map<std::string, std::string>{};
  auto address = [&](const std::string& name) {
    auto it = addrs.find(name);
    return it == addrs.end() ? name : it->second;
  };
  const std::string storeHost = address(first);
  const int port = slurmStorePort(step.jobId, step.stepId);
  SchedulerDefaults d;
  d.source = "Slurm step " + slurmRunId(step);
  d.flags = {{"rdzv-backend", "c10d"},
             {"rdzv-endpoint", withPort(storeHost, port)},
             {"rdzv-id", slurmRunId(step)},
             {"nnodes", std::to_string(step.nodeCount)},
             {"local-addr", address(step.nodeName)},
             {"node-rank", std::to_string(step.nodeId)},
             {"master-addr", storeHost},
             {"master-port", std::to_string(port)}};
  d.gpus = step.gpus;
  d.cpus = step.cpus;
  d.nodeRank = step.nodeId;
  return d;
}

std::string describeSlurmDefaults(const SlurmStep& step, const SchedulerDefaults& defaults,
                                  const std::vector<std::string>& used,
                                  const std::string& backend) {
  std::string line = "taken from " + defaults.source + " (node " + std::to_string(step.nodeId) +
                     " of " + std::to_string(step.nodeCount) + ", " + step.nodeName + "):";
  // Only what the chosen backend reads: c10d the endpoint, static master-addr/port/node-rank.
  const bool isStatic = backend == "static";
  for (const auto& name : used) {
    const bool staticOnly = name == "node-rank" || name == "master-addr" || name == "master-port";
    if (staticOnly != isStatic && name != "rdzv-id" && name != "nnodes" && name != "local-addr" &&
        name != "rdzv-backend")
      continue;
    line += " --" + name + "=" + defaults.flags.at(name);
  }
  if (!isStatic && step.nodeCount > 1) line += " (node rank " + std::to_string(step.nodeId) + ")";
  if (used.empty()) line += " nothing (every rendezvous flag was given)";
  return line;
}

}  // namespace ddprun::launcher::cluster
