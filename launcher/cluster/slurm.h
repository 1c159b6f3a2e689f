#pragma once
// Under Slurm: `srun -N4 --ntasks-per-node=1 ddprun --nproc-per-node=8 train.py` needs no
// rendezvous flags. Each ddprun reads the step from Slurm's environment and turns it into
// flag defaults (SchedulerDefaults, options.h), below anything given explicitly:
//
//   --rdzv-backend=c10d --rdzv-id=$SLURM_JOB_ID.$SLURM_STEP_ID --nnodes=<nodes of the step>
//   --rdzv-endpoint=<first node's address>:<29400 + (10 x SLURM_JOB_ID + SLURM_STEP_ID) mod 1000>
//   --local-addr=<this node's address>, node rank = SLURM_NODEID (kept by the rendezvous)
//   (--master-addr, --master-port and --node-rank likewise, for --rdzv-backend=static)
//   --nproc-per-node=gpu|cpu|auto count what Slurm gave the node (SLURM_GPUS_ON_NODE,
//   SLURM_CPUS_ON_NODE)
//
// A node's address is its NodeAddr as `scontrol show node` reports it, else its name (resolved
// when used); names that are IP addresses are taken as they are. The first node of the step's hostlist hosts the store: it is the node whose
// address is the endpoint's. The port depends on the job and the step, so two jobs sharing a
// node, and two steps of one job running at once (`srun ... & srun ... &` in a batch script),
// do not collide: each step has its own store and run id.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/options.h"

namespace ddprun::launcher::cluster {

struct SlurmStep {
  std::string jobId;               // SLURM_JOB_ID
  unsigned long long stepId = 0;   // SLURM_STEP_ID
  int nodeCount = 0;               // SLURM_STEP_NUM_NODES, else SLURM_NNODES
  int nodeId = 0;                  // SLURM_NODEID
  std::string nodeName;            // SLURMD_NODENAME: this node
  std::vector<std::string> nodes;  // SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), expanded
  std::optional<int> gpus;         // SLURM_GPUS_ON_NODE
  std::optional<int> cpus;         // SLURM_CPUS_ON_NODE
};

// The step this process runs in, or nullopt when it was not started by srun (no SLURM_JOB_ID
// or no SLURM_STEP_ID: an sbatch script or an salloc shell runs on one node only). Throws
// ConfigError naming the variable and its value when one is malformed, and when srun started
// more than one task on a node (ddprun starts the workers itself: --ntasks-per-node=1).
std::optional<SlurmStep> readSlurmStep(const Environment& env);

// Node name -> NodeAddr for the nodes Slurm knows among `names` (missing ones are absent).
using NodeAddressLookup =
    std::function<std::map<std::string, std::string>(const std::vector<std::string>& names)>;
// Asks `scontrol show node -o NAME,...` (bounded to 5 s; empty on any failure: scontrol
// without a configuration retries for a minute).
std::map<std::string, std::string> scontrolNodeAddresses(const std::vector<std::string>& names);
// `scontrol show node -o` output -> NodeName -> NodeAddr (pure).
std::map<std::string, std::string> parseScontrolNodes(const std::string& text);

// 29400 + (10 x job id + step id) mod 1000: jobs with neighbouring ids and the first ten steps
// of one job get distinct ports.
int slurmStorePort(const std::string& jobId, unsigned long long stepId);

// "<job>.<step>", Slurm's own name for a step (sacct, squeue -s): the run id.
std::string slurmRunId(const SlurmStep& step);

// The step as flag defaults (pure but for `lookup`).
SchedulerDefaults slurmDefaults(const SlurmStep& step, const NodeAddressLookup& lookup);

// "taken from Slurm step 12.0 (node 1 of 2, n2): --rdzv-backend=c10d ...": the one log line
// naming the flags that Slurm supplied (`used`, from ParseOutcome::fromScheduler) and that
// the chosen `backend` reads.
std::string describeSlurmDefaults(const SlurmStep& step, const SchedulerDefaults& defaults,
                                  const std::vector<std::string>& used,
                                  const std::string& backend);

}  // namespace ddprun::launcher::cluster
