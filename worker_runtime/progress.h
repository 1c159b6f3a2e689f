#pragma once
// reportProgress(): tells the agent that this worker made progress, for ddprun's progress watch
// (--stall-warning, docs/launcher.md#progress-watch). DistributedDataParallel calls it once per
// synchronised backward; a program without it calls it once per step (or per evaluation batch).
// A relaxed atomic add in the file the agent created for this worker (DDPRUN_PROGRESS_FILE,
// base/progress_file.h); a no-op when there is none (another launcher, --stall-warning=0).
// Thread-safe, never throws.
namespace ddprun::runtime {

void reportProgress();

}  // namespace ddprun::runtime
