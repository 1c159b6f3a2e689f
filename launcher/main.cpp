// ddprun [OPTIONS] PROGRAM [ARGS...]: start, supervise and restart distributed training
// workers on this node -- a drop-in for torchrun. See docs/launcher.md.
//
// Exit codes: 0 success; the root cause worker's exit code, or 128 + its signal number;
// 128 + N when ddprun itself was stopped by signal N; 2 bad flags or configuration;
// 126/127 PROGRAM not executable / not found; 1 any other failure of the launcher.
#include <csignal>
#include <iostream>

#include "base/errors.h"
#include "base/log.h"
#include "launcher/agent.h"
#include "launcher/cluster/slurm.h"
#include "launcher/options.h"
#include "launcher/worker_command.h"

int main(int argc, char** argv) {
  using namespace ddprun;
  using namespace ddprun::launcher;
  // A closed console must not kill the launcher (and with it the workers' supervision).
  std::signal(SIGPIPE, SIG_IGN);
  try {
    Environment env = currentEnvironment();
    // Under srun, Slurm's step supplies the rendezvous flags' defaults (launcher/cluster/).
    const std::optional<cluster::SlurmStep> slurm = cluster::readSlurmStep(env);
    SchedulerDefaults scheduler;
    if (slurm) scheduler = cluster::slurmDefaults(*slurm, cluster::scontrolNodeAddresses);
    ParseOutcome parsed =
        parseLaunchOptions(std::vector<std::string>(argv, argv + argc), env, scheduler);
    if (!parsed.options) {
      std::cout << parsed.message;
      return 0;
    }
    if (slurm && !parsed.fromScheduler.empty()) {
      DDPRUN_LOG(INFO, "launcher") << cluster::describeSlurmDefaults(
          *slurm, scheduler, parsed.fromScheduler, parsed.options->rdzvBackend);
    }
    Agent agent(std::move(*parsed.options), std::move(env));
    return agent.run();
  } catch (const ProgramError& e) {
    std::cerr << "ddprun: " << e.what() << "\n";
    return e.exitCode();
  } catch (const ConfigError& e) {
    std::cerr << "ddprun: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun: " << e.what() << "\n";
    return 1;
  }
}
