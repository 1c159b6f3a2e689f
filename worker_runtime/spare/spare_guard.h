#pragma once
// How the spare template (spare_template.h) turns one of the agent's requests into a guarded
// spare: the guard G, which the agent supervises as it does a launcher guard, and the spare W,
// G's child, which returns into the runtime with the spare's id. Internal to worker_runtime:
// spare_template.cpp is the only user.
//
// Two ways, the same processes in the end:
// - On request: the request arrives, the template forks G, G forks W, W copies the pages the
//   template's warm-up wrote (written_pages.h) and goes on. Two copies of the program's page
//   tables and the page copy lie between the request and W's ready key.
// - Ahead of the request (a template forked from a rank, where a grow back's group trains one
//   rank short until the replacement is ready: docs/recovery.md#spare-template): the template
//   forks G and W while nothing waits, W copies the pages, and both wait. The request then goes
//   to G on a socket pair (`Prepared::link`), G hands W its output and environment, and W goes
//   on: the forks and the copy are off the grow back's path. While they wait, G and W stay in
//   the template's process group (the agent kills that group with the template at the group's
//   end), W at the template's priority; on the hand-over G makes their own group, as on request.
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "rendezvous/spare_fork.h"
#include "worker_runtime/spare/written_pages.h"

namespace ddprun::runtime::spare {

// One request: the header with its four descriptors, then the environment.
struct Request {
  rendezvous::spare_fork::Request head;
  int fds[4] = {-1, -1, -1, -1};  // control (read), status (write), stdout, stderr
  std::vector<char> env;
  void closeFds();
};

// Reads one request from `fd`. False on EOF (the peer closed the socket) or a malformed request
// (logged); the descriptors received are then closed.
bool receive(int fd, Request& r);

// Sends `r` (header, descriptors, environment) on `fd`, as the agent does; false on a closed
// peer or an error. The caller still owns the descriptors.
bool send(int fd, const Request& r);

// What the spare W returns into the runtime with.
struct Spare {
  int id = -1;
};

// In G, just forked from the template (one thread, its sibling or orphaned to the agent):
// makes G's own process group, forks W at the priority asked, and never returns in G (it
// guards W until the control socket closes). Returns in W, whose environment and output are
// then the spare's, and which has copied `written` (see the header). `idleFork`: the template
// may fork at idle priority (it can come back); `policy`: the template's scheduling policy,
// which G goes back to.
Spare becomeGuardAndSpare(int templateFd, Request& r, pid_t templatePid, bool idleFork,
                          int policy, const WrittenPages& written);

// A G and W forked ahead of a request. `link`: the template's end of the socket to G.
struct Prepared {
  pid_t guard = -1;
  int link = -1;
};

// Forks G as the template's sibling (CLONE_PARENT), and in G, W, which copies `written` and
// waits. The forks and the copy run at the template's priority; with `leaveIdle` (the process
// may leave SCHED_IDLE) G and W then wait at normal priority, so that the hand-over wakes them
// at once. Returns nothing in the template, where `prepared` is set (guard -1: the fork failed,
// errno logged); returns the spare in W once G handed it a request. G never returns.
std::optional<Spare> prepare(int templateFd, pid_t templatePid, const WrittenPages& written,
                             bool leaveIdle, Prepared& prepared);

// Hands `r` to the prepared G (then closes the link). False when G is gone: the caller forks on
// request instead. The caller still owns r's descriptors.
bool handOver(Prepared& prepared, const Request& r);

// fork(), but the child's parent is this process's parent (CLONE_PARENT), which reaps it.
pid_t forkAsSibling();

}  // namespace ddprun::runtime::spare
