#pragma once
// main() of a bundled trainer (mnist_mlp, mnist_cnn): flags and config file -> settings ->
// data -> ddprun::init() -> train() -> summary. Bad settings and bad data are reported before
// the worker joins its group, in one line naming the setting or the file, with exit code 2; so
// is a checkpoint that does not fit. Other failures (a peer died, a checkpoint cannot be
// written) exit with 1, so the launcher restarts the group when it has restarts left. Either way
// the error goes to the launcher's error file (runtime/error_file.h), marked retryable or not.
namespace ddprun::trainers {

struct TrainerSpec {
  const char* name;         // the executable, e.g. "mnist_mlp"
  const char* model;        // the model it trains: "mlp" or "cnn"
  const char* description;  // first line of --help
};

int trainerMain(int argc, char** argv, const TrainerSpec& spec);

// Ends the process with `code` after trainerMain has returned: output flushed, then _Exit, so
// LibTorch's static destructors do not run. They free the operator registry chunk by chunk,
// 0.1-0.9 s a process on a VM where a page's first write is dear, and more in a process that
// shares its pages with a fork (rank 0 and the spare template forked from it, a replacement
// forked from the template: each free is then a copy-on-write fault); the job's end waits for
// the slowest rank's. Nothing of the trainer's is left for them: trainerMain has joined its
// threads, written its checkpoints, files and error file, and shut the runtime down (each
// timeline event is one write(2), never buffered).
[[noreturn]] void exitProcess(int code);

}  // namespace ddprun::trainers
