#include "worker_runtime/progress.h"

#include "base/progress_file.h"

namespace ddprun::runtime {

void reportProgress() { progress::ProgressWriter::instance().step(); }

void startHeartbeat() { progress::ProgressWriter::instance().startHeartbeat(); }

}  // namespace ddprun::runtime
