#pragma once
// Killing every descendant of the calling process, wherever it went: the sweep of a process
// guard (launcher/guarded_process.h, worker_runtime/spare_template.h).
//
// A descendant can leave the guard's process group (setsid, setpgid), and a double fork
// re-parents it -- but a guard is a child subreaper, so orphans are re-parented to the
// guard, never past it: every process the worker started, directly or not, stays a
// descendant of the guard until it is reaped. The sweep reads the parent of every process
// in /proc (raw syscalls, no allocation: a guard is a fork of a threaded process, or of a
// LibTorch program), SIGKILLs every descendant; the caller reaps what died and starts over
// until it has no child left. A process killed while forking leaves its new child to the
// guard, which finds it in the next round.
#include <cstddef>

namespace ddprun {

// SIGKILLs every live descendant of the calling process; returns how many were still alive.
// Async-signal-safe (open, getdents64, read, kill on static buffers): for a forked guard only,
// as it is not reentrant.
size_t killDescendants() noexcept;

}  // namespace ddprun
