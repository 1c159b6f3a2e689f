#pragma once
// A Communicator that records every collective on this rank's timeline track (base/timeline.h,
// docs/timeline.md) and forwards it unchanged. init() wraps the job's communicator in one when
// the job runs with `ddprun --timeline`; without it nothing is wrapped and nothing is paid.
//
// Each collective is one span (category "collective") from the call to its completion, with the
// operation, bytes, dtype, backend, a sequence number and the worker group (DDPRUN_TIMELINE_GROUP,
// set by the agent per round): ranks of one group number their collectives alike, which is how
// ddprun-trace matches one collective's calls across ranks. An async collective's span ends
// when its completion is observed (wait() returns, or completed() first says true).
#include <memory>
#include <string>

#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

std::shared_ptr<Communicator> makeTracedCommunicator(std::shared_ptr<Communicator> inner,
                                                     std::string group);

}  // namespace ddprun::runtime
