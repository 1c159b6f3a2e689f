// ddprun [OPTIONS] PROGRAM [ARGS...]: start, supervise and restart distributed training
// workers on this node -- a drop-in for torchrun. See docs/launcher.md.
//
// Exit codes: 0 success; the root cause worker's exit code, or 128 + its signal number;
// 128 + N when ddprun itself was stopped by signal N; 2 bad flags or configuration;
// 126/127 PROGRAM not executable / not found; 1 any other failure of the launcher.
#include <malloc.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "base/errors.h"
#include "base/log.h"
#include "launcher/agent.h"
#include "launcher/output.h"
#include "launcher/launcher_error_file.h"
#include "launcher/cluster/remote_agent.h"
#include "launcher/cluster/slurm.h"
#include "launcher/cluster/ssh_launch.h"
#include "launcher/options.h"
#include "launcher/worker_command.h"

namespace {

using namespace ddprun;
using namespace ddprun::launcher;

int exitCodeFor(const std::exception& e) {
  if (const auto* p = dynamic_cast<const ProgramError*>(&e)) return p->exitCode();
  if (dynamic_cast<const ConfigError*>(&e)) return 2;
  return 1;
}

int run(int argc, char** argv, std::string& record) {
  try {
    std::vector<std::string> args(argv, argv + argc);
    // Started over ssh by another ddprun (launcher/cluster/remote_agent.h): the exported
    // environment comes first on stdin, then commands; the link reports back.
    std::unique_ptr<cluster::RemoteAgentLink> link;
    if (args.size() > 1 && args[1] == cluster::kRemoteAgentFlag) {
      args.erase(args.begin() + 1);
      auto [exported, pending] = cluster::readEnvBlock(STDIN_FILENO);
      for (const auto& [name, value] : exported) ::setenv(name.c_str(), value.c_str(), 1);
      link = std::make_unique<cluster::RemoteAgentLink>(std::move(pending));
    }
    Environment env = currentEnvironment();
    // Under srun, Slurm's step supplies the rendezvous flags' defaults (launcher/cluster/).
    const std::optional<cluster::SlurmStep> slurm =
        link ? std::nullopt : cluster::readSlurmStep(env);
    SchedulerDefaults scheduler;
    if (slurm) scheduler = cluster::slurmDefaults(*slurm, cluster::scontrolNodeAddresses);
    ParseOutcome parsed = parseLaunchOptions(args, env, scheduler);
    if (!parsed.options) {
      std::cout << parsed.message;
      return 0;
    }
    // --hosts/--hostfile: this ddprun starts one remote agent per host and relays them.
    if (!link && (!parsed.options->hosts.empty() || !parsed.options->hostfile.empty())) {
      return cluster::runSshLaunch(*parsed.options, parsed.given, env);
    }
    if (slurm && !parsed.fromScheduler.empty()) {
      DDPRUN_LOG(INFO, "launcher") << cluster::describeSlurmDefaults(
          *slurm, scheduler, parsed.fromScheduler, parsed.options->rdzvBackend);
    }
    // The launching ddprun gave this agent its node rank (its host's place in the list).
    if (link) parsed.options->schedulerNodeRank = parsed.options->nodeRank;
    Agent agent(std::move(*parsed.options), std::move(env), link.get());
    const int code = agent.run();
    record = agent.errorRecord();
    return code;
  } catch (const std::exception& e) {
    const int code = exitCodeFor(e);
    std::cerr << "ddprun: " << e.what() << "\n";
    record = generatedErrorRecord(std::string("ddprun: ") + e.what(), code);
    return code;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // One malloc arena for all of the agent's threads. glibc gives each new thread that allocates
  // an arena of its own (mmap of 128 MB reserved, two munmaps to align it, an mprotect, its
  // first pages faulted in): 4-5% of the CPU an agent of a 2-node job takes, for threads that
  // allocate little and seldom at once (docs/rendezvous.md, "What an agent process costs").
  // Before any thread exists; the workers (exec'd) are not affected.
  ::mallopt(M_ARENA_MAX, 1);
  // A closed console must not kill the launcher (and with it the workers' supervision).
  std::signal(SIGPIPE, SIG_IGN);
  std::string record;
  const int code = run(argc, argv, record);
  for (const auto& lost : ddprun::launcher::Console::flushAll(ddprun::launcher::kConsoleFlushBound)) {
    DDPRUN_LOG(WARN, "launcher") << lost;
  }
  // torchrun's entry point is @record-decorated: on failure, the root cause goes to the
  // launcher's own TORCHELASTIC_ERROR_FILE (launcher_error_file.h). Read now: a remote agent gets
  // its environment over stdin inside run().
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (code != 0 && path != nullptr && *path != '\0') {
    writeLauncherErrorFile(path, record.empty() ? generatedErrorRecord("ddprun failed", code) : record);
  }
  return code;
}
