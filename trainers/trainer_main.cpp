#include "trainers/trainer_main.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <iostream>
#include <string>
#include <vector>

#include "base/log.h"
#include "trainers/threads.h"
#include "trainers/train_loop.h"
#include "worker_runtime/error_file.h"
#include "worker_runtime/runtime.h"

namespace ddprun::trainers {
namespace {

// Every setting is also a flag (--batch-size for batch_size); values stay text here and are
// converted by loadTrainConfig, so a flag gets the same checks and messages as the file.
struct CommandLine {
  ConfigSources sources;
  std::vector<std::string> values;  // one slot per setting, indexed like settings()
};

void addSettingFlags(CLI::App& app, CommandLine& cl) {
  const auto& all = settings();
  cl.values.resize(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    app.add_option(flagName(all[i].name), cl.values[i], all[i].help)->type_name(all[i].type);
  }
}

void collectFlags(const CLI::App& app, CommandLine& cl) {
  const auto& all = settings();
  for (size_t i = 0; i < all.size(); ++i) {
    if (app.get_option(flagName(all[i].name))->count() > 0) {
      cl.sources.flags.emplace_back(all[i].name, cl.values[i]);
    }
  }
}

// One line on stderr and the error file the launcher reads (TORCHELASTIC_ERROR_FILE): exit code 2
// and not retryable for what a restart cannot fix (settings, data, an incompatible checkpoint),
// 1 and retryable for the rest (a peer died, a timeout, an I/O error), so the launcher restarts.
int fail(const TrainerSpec& spec, const std::exception& e, std::optional<bool> retryable = {}) {
  const bool retry = retryable.value_or(runtime::isRetryable(e));
  runtime::recordError(e, retry);
  std::fprintf(stderr, "%s: error: %s\n", spec.name, e.what());
  return retry ? 1 : 2;
}

}  // namespace

int trainerMain(int argc, char** argv, const TrainerSpec& spec) {
  CLI::App app{std::string(spec.description) +
                   "\nRun it under ddprun: ddprun --nproc-per-node=2 " + spec.name +
                   " --config configs/mnist_" + spec.model + ".json",
               spec.name};
  CommandLine cl;
  app.add_option("--config", cl.sources.file, "JSON settings file; flags override it")
      ->type_name("FILE");
  addSettingFlags(app, cl);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error
    if (code == 0) return 0;
    runtime::writeErrorFile(std::string("ConfigError: ") + e.what(), "CLI::ParseError", false);
    return 2;
  }
  collectFlags(app, cl);

  TrainConfig config;
  TrainData data;
  std::shared_ptr<Classifier> model;
  try {
    TrainConfig defaults;
    defaults.model = spec.model;
    config = loadTrainConfig(cl.sources, defaults);
    if (config.model != spec.model) {
      throw ConfigError(std::string("model = \"") + config.model + "\", but " + spec.name +
                        " trains the " + spec.model + " model (use mnist_" + config.model + ")");
    }
    data = loadTrainData(config);
    model = buildModel(config);  // before init(): see train_loop.h
  } catch (const ConfigError& e) {
    return fail(spec, e);
  } catch (const DataError& e) {
    return fail(spec, e, /*retryable=*/false);
  }

  try {
    // A hot spare (ddprun --spares) runs the training step once while it waits for a rank.
    auto rt = ddprun::init({.spareWarmup = [&](const std::shared_ptr<runtime::Communicator>& comm) {
      const char* local = std::getenv("LOCAL_WORLD_SIZE");
      configureThreads(local ? std::max(1, std::atoi(local)) : 1);
      warmUpSpare(config, data, comm);
    }});
    const ThreadSetup threads = configureThreads(rt->env().localWorldSize);
    if (rt->isMaster()) {
      DDPRUN_LOG(INFO, "trainer") << spec.name << ": world size " << rt->worldSize()
                                  << ", attempt " << rt->attempt() << ", BLAS " << threads.blas;
      if (!threads.openblas) DDPRUN_LOG(WARN, "trainer") << "slow BLAS: " << threads.blas;
    }
    const TrainResult result = train(config, data, std::move(model), *rt);
    if (rt->isMaster()) {
      std::printf("done: %lld steps, %.1f s, %.0f samples/s, final loss %.4f",
                  static_cast<long long>(result.steps), result.trainSeconds, result.samplesPerSec,
                  result.finalLoss);
      if (result.testAccuracy >= 0) std::printf(", test accuracy %.4f", result.testAccuracy);
      std::printf("\n");
      std::fflush(stdout);
    }
    rt->shutdown();
  } catch (const std::exception& e) {
    return fail(spec, e);
  }
  return 0;
}

}  // namespace ddprun::trainers
