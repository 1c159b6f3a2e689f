#pragma once
// Whether another process is still alive, as the transports and the recovery code ask it.
#include <cstdint>

namespace ddprun {

// True when process `pid` is gone, or is a zombie not yet reaped (PID 1 of a container may reap
// orphans late, and a dead worker stays a zombie until its guard waits for it). False for a
// pid <= 0 (not known yet) and for a live process, stopped ones included.
bool processDead(int32_t pid);

// Process `pid` is about to be reported dead of a failure: a SIGKILL is pending for it
// (/proc/<pid>/status SigPnd or ShdPnd: it dies as soon as the kernel runs it, whatever it
// does), or it is a zombie whose wait status is not a clean exit 0. False for one that is gone
// (reaped: its reaper knows how it ended), a live one, a clean exit. For a launcher that decides
// about several deaths at once (two ranks SIGKILLed together, whose exit reports arrive apart).
bool processDying(int32_t pid);

}  // namespace ddprun
