// ddprun [OPTIONS] PROGRAM [ARGS...]: start, supervise and restart distributed training
// workers on this node -- a drop-in for torchrun. See docs/launcher.md.
//
// Exit codes: 0 success; the root cause worker's exit code, or 128 + its signal number;
// 128 + N when ddprun itself was stopped by signal N; 2 bad flags or configuration;
// 126/127 PROGRAM not executable / not found; 1 any other failure of the launcher.
#include <csignal>
#include <iostream>

#include "launcher/agent.h"
#include "launcher/launcher_error_file.h"
#include "launcher/options.h"
#include "launcher/worker_command.h"
#include "base/errors.h"

namespace {

using namespace ddprun;
using namespace ddprun::launcher;

int exitCodeFor(const std::exception& e) {
  if (const auto* p = dynamic_cast<const ProgramError*>(&e)) return p->exitCode();
  if (dynamic_cast<const ConfigError*>(&e)) return 2;
  return 1;
}

int run(int argc, char** argv, const Environment& env, std::string& record);

}  // namespace

int main(int argc, char** argv) {
  // A closed console must not kill the launcher (and with it the workers' supervision).
  std::signal(SIGPIPE, SIG_IGN);
  const Environment env = currentEnvironment();
  std::string record;
  const int code = run(argc, argv, env, record);
  // torchrun's entry point is @record-decorated: on failure, the root cause goes to the
  // launcher's own TORCHELASTIC_ERROR_FILE (launcher_error_file.h).
  const auto path = env.find("TORCHELASTIC_ERROR_FILE");
  if (code != 0 && path != env.end() && !path->second.empty()) {
    writeLauncherErrorFile(path->second,
                           record.empty() ? generatedErrorRecord("ddprun failed", code) : record);
  }
  return code;
}

namespace {

int run(int argc, char** argv, const Environment& env, std::string& record) {
  try {
    ParseOutcome parsed = parseLaunchOptions(std::vector<std::string>(argv, argv + argc), env);
    if (!parsed.options) {
      std::cout << parsed.message;
      return 0;
    }
    Agent agent(std::move(*parsed.options), env);
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
