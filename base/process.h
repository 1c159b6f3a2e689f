#pragma once
// Whether another process is still alive, as the transports and the recovery code ask it.
#include <cstdint>

namespace ddprun {

// True when process `pid` is gone, or is a zombie not yet reaped (PID 1 of a container may reap
// orphans late, and a dead worker stays a zombie until its guard waits for it). False for a
// pid <= 0 (not known yet) and for a live process, stopped ones included.
bool processDead(int32_t pid);

}  // namespace ddprun
