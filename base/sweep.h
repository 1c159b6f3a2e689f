#pragma once
// What every process guard does (launcher/guarded_process.h; the guards the spare template
// forks, worker_runtime/spare/spare_template.h): take its signals from the parent it was forked
// from, and at the end kill every descendant of the calling process, wherever it went.
//
// A descendant can leave the guard's process group (setsid, setpgid), and a double fork
// re-parents it -- but a guard is a child subreaper, so orphans are re-parented to the
// guard, never past it: every process the worker started, directly or not, stays a
// descendant of the guard until it is reaped. The sweep reads the parent of every process
// in /proc (raw syscalls, no allocation: a guard is a fork of a threaded process, or of a
// LibTorch program), SIGKILLs every descendant; the caller reaps what died and starts over
// until it has no child left. A process killed while forking leaves its new child to the
// guard, which finds it in the next round.
#include <csignal>
#include <cstddef>

namespace ddprun {

// The signals a guard ignores and leaves to the worker it guards (a terminal's or a launcher's
// signal to the process group must not end the guard before it reports the worker's exit); the
// worker gets them back at their defaults.
inline constexpr int kGuardForwardedSignals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,
                                                 SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU,
                                                 SIGUSR1, SIGUSR2, SIGALRM};

// A guard just forked: every handler inherited from its parent reset to the default (the
// parent's would write into the parent's event loop through an inherited pipe), the forwarded
// signals ignored, SIGCHLD caught by `onChild` (which only has to interrupt the guard's
// ppoll()). Call it with every signal blocked. Async-signal-safe (sigaction only).
void takeGuardSignals(void (*onChild)(int)) noexcept;

// SIGKILLs every live descendant of the calling process; returns how many were still alive.
// Async-signal-safe (open, getdents64, read, kill on static buffers): for a forked guard only,
// as it is not reentrant.
size_t killDescendants() noexcept;

}  // namespace ddprun
