#pragma once
// The spare template (ddprun --spares; docs/recovery.md#spare-template): a worker program,
// loaded, that forks hot spares on the agent's request instead of the agent exec'ing the
// program again.
//
// Why: a spare exec'd while training runs loads the process, LibTorch and the data again --
// about a CPU-second, which under SCHED_IDLE still slowed the training ranks by ~10% (memory,
// page faults and the kernel's share are not idle priority). A fork of a process that already
// did all that costs a few milliseconds: the page tables, and the pages the spare writes.
//
// The template is started like a spare (its guard, its process group, the job's cgroup) with
// DDPRUN_SPARE_TEMPLATE_FD=<fd> instead of DDPRUN_SPARE. Its program loads as usual and calls
// init(), which lands here before anything of the runtime has started a thread: the template
// checks it has exactly one thread (/proc/self/task; a fork copies only the calling thread,
// and a lock or pool of another one would be broken in the child), says Ready on the socket,
// and serves requests until the agent closes the socket. For each request (rendezvous/spare_fork.h)
// it makes three processes:
//
//   template ──vfork──> X ──fork──> guard G (own process group, subreaper) ──fork──> spare W
//                       X exits at once: G is orphaned and re-parented to the agent, which is a
//                       child subreaper; the template's own guard is not, so G leaves its tree
//
// (X shares the template's memory, so the program's image is copied twice per spare, for G
// and W, not three times: each copy of its page tables costs milliseconds of a training core.)
//
// G does what a launcher guard does (launcher/guarded_process.h) with the descriptors the agent
// sent: reports W's start and exit on the status pipe, ignores the stop signals meant for W,
// and when the control socket reaches EOF kills every descendant (base/sweep.h) and its process
// group. So the agent supervises a forked spare exactly like an exec'd one, and its death, the
// template's or the agent's leave nothing behind. W gets the spare's output pipes and
// environment, and SCHED_IDLE or not as asked; it returns from serveSpareForks() with its id
// and goes on as a spare (connects to the store, waits for a rank).
//
// The warm-up (InitOptions::spareWarmup) runs in the template, once, before it says Ready: a
// spare forked from it inherits the kernels, autograd, OpenBLAS's buffers and the allocator's
// state that warm-up initialised, so it does not run the warm-up again. That takes the warm-up
// (tens of milliseconds, on the CPU the ranks train on) off the path from a death to the fork's
// rank (a shrunk group's grow back waits for it). The warm-up must leave the template with one
// thread, as the program had; one that leaves more makes it exit 3, like a threaded program.
// The caller may skip it (a death already waits for the template: runtime.cpp); the spares it
// forks then run their own.
//
// A template forked from a rank also records the pages its warm-up wrote (the ones it no longer
// shares with the rank), and each spare it forks copies them before it says ready, so that its
// heal and first steps do not fault them in while the group waits (written_pages.h). And it
// keeps one guard and spare forked ahead of the next request (spare_guard.h: the first before it
// says Ready, the next a second after one was handed over), so that a grow back's replacement --
// for which the shrunk group trains one rank short -- is ready without two forks and that copy
// on its path: from a death to the grow back published 75-90 ms before, 16-25 ms since.
#include <functional>

namespace ddprun::runtime {

// A spare forked from the template: its id, and whether the template's warm-up ran (then the
// spare starts warm and runs none of its own).
struct ForkedSpare {
  int id = -1;
  bool warm = false;
};

// The template forked from a rank (shrink without spares, one node; docs/recovery.md#spare-
// template): ddprun gives local rank 0 the socket as DDPRUN_SPARE_TEMPLATE_FORK_FD instead of
// exec'ing one more process of the program, which under SCHED_IDLE took a second or more to
// load while the ranks trained (a death before that waited for it). At init(), before the
// runtime starts a thread, the rank forks twice (rank -> X -> template; X exits at once, and
// the rank's guard is no subreaper for this rank, so the template is re-parented to the
// launcher, out of the rank's tree: the rank's death and its guard's sweep leave it alone) and
// goes on as the rank. The template leaves the rank's process group (not its session: the
// scheduler's autogroups are per session) and output (its own lines go to
// the descriptor the launcher sends first: ddprun's stderr), enters SCHED_IDLE when `idle`, and serves
// forks as an exec'd template does. Returns true in the template (the caller goes on with
// serveSpareForks(fd, ...)), false in the rank, which has closed `fd` -- also when it has more
// than one thread or the fork failed (one line says so; ddprun then exec's the template).
bool forkTemplateFromRank(int fd, bool idle);

struct ServeOptions {
  // How a spare's guard G is made. false: the template forks X, X forks G and exits, so G is
  // re-parented to the nearest child subreaper, the agent (the exec'd template is its guard's
  // child). true, for a template forked from a rank: it was re-parented to that subreaper
  // itself, so G is made its sibling at once (clone with CLONE_PARENT): one fork of the
  // program's image per spare instead of two, and the answer does not wait for X.
  bool guardsAsSiblings = false;
  // With guardsAsSiblings: keep one spare forked ahead of the request (spare_guard.h), so that
  // a grow back's replacement is ready without the forks and the copy of the written pages.
  // false (DDPRUN_SPARE_TEMPLATE_AHEAD=0): every spare is forked on request.
  bool forkAhead = true;
};

// After a spare forked ahead was handed over, the template forks the next one once this long
// has passed without a request: not on the CPU the grow back it served needs.
inline constexpr int kForkAheadDelayMs = 1000;

// Runs the template on socket `fd`: `warmUp` once (true: it warmed the process up), then serves
// forks. Returns only in a forked spare (its environment is then the spare's, sent by the
// agent). The template itself exits: 0 when the agent closed the socket, 3 when it has more than
// one thread before or after `warmUp` (it cannot be a template; the agent exec's its spares then).
ForkedSpare serveSpareForks(int fd, const std::function<bool()>& warmUp,
                            const ServeOptions& options = {});

// The threads of this process (entries of /proc/self/task); -1 if unreadable.
int threadCount();

}  // namespace ddprun::runtime
