#pragma once
// main() of a bundled trainer (mnist_mlp, mnist_cnn): flags and config file -> settings ->
// data -> ddprun::init() -> train() -> summary. Bad settings and bad data are reported before
// the worker joins its group, in one line naming the setting or the file, with exit code 2; so
// is a checkpoint that does not fit. Other failures (a peer died, a checkpoint cannot be
// written) exit with 1, so the launcher restarts the group when it has restarts left. Either way
// the error goes to the launcher's error file (runtime/error_file.h), marked retryable or not.
#include "worker_runtime/runtime.h"  // runtime::exitProcess, for main()

namespace ddprun::trainers {

struct TrainerSpec {
  const char* name;         // the executable, e.g. "mnist_mlp"
  const char* model;        // the model it trains: "mlp" or "cnn"
  const char* description;  // first line of --help
};

// The trainers' main() passes its result to runtime::exitProcess (runtime.h): by then it has
// joined its threads, written its checkpoints, files and error file, and shut the runtime down.
int trainerMain(int argc, char** argv, const TrainerSpec& spec);

}  // namespace ddprun::trainers
