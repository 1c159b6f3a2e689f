#pragma once
// Whether another process is still alive, as the transports and the recovery code ask it; and
// whether this one may leave idle priority.
#include <cstdint>
#include <string>

namespace ddprun {

// True when process `pid` is gone, or is a zombie not yet reaped (PID 1 of a container may reap
// orphans late, and a dead worker stays a zombie until its guard waits for it). False for a
// pid <= 0 (not known yet) and for a live process, stopped ones included.
bool processDead(int32_t pid);

// True when process `pid` will never run its own code again: processDead(), or it has begun to
// exit -- its main thread is exiting (PF_EXITING in the flags of /proc/<pid>/stat) or a SIGKILL
// is pending for it. Why: a process SIGKILLed while it holds much memory becomes a zombie only
// once the kernel has freed that memory, which for a LibTorch process takes tens of ms (measured
// here: SIGKILL pending and PF_EXITING 0-4 ms after the kill, the zombie 100-133 ms after it, for
// a process holding 400 MB), and a peer waiting for it in a collective need not wait that long.
// False for a pid <= 0, a live process and a stopped one (a SIGSTOP is not an exit).
bool processExiting(int32_t pid);

// Process `pid` is about to be reported dead of a failure: a SIGKILL is pending for it
// (/proc/<pid>/status SigPnd or ShdPnd: it dies as soon as the kernel runs it, whatever it
// does), or it is a zombie whose wait status is not a clean exit 0. False for one that is gone
// (reaped: its reaper knows how it ended), a live one, a clean exit. A process whose main thread
// has begun to exit (PF_EXITING) with a non-zero exit code counts too, with that status (the
// kernel sets it before it frees the memory; the zombie comes after). For a launcher that decides
// about several deaths at once (two ranks SIGKILLed together, whose exit reports arrive apart).
// `waitStatus`, when given and the answer is true: the status as from waitpid (a zombie's own;
// SIGKILL's for a pending SIGKILL).
bool processDying(int32_t pid, int* waitStatus = nullptr);

// Whether this process may move a SCHED_IDLE process of its user (itself included) back to
// SCHED_OTHER, nice 0: CAP_SYS_NICE in its effective set, or RLIMIT_NICE >= 20 (which children
// inherit; a capability may not survive an exec). `why` says why not.
bool canLeaveIdlePriority(std::string& why);

}  // namespace ddprun
