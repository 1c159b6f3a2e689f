#pragma once
// The agent's side of the spare template (docs/recovery.md#spare-template; the template's side,
// and why, in worker_runtime/spare/spare_template.h; the wire format in rendezvous/spare_fork.h).
//
// With --spares the agent starts, beside the first spares, one more process of the worker
// program: the template (SpawnRequest::passFd carries its end of a socket pair, as fd
// kPassedFd; its guard is no subreaper). Once it said Ready, every spare the agent starts is
// a fork of it: forkSpare() sends the descriptors a guarded worker has (control socket, status
// pipe, output pipes) with the spare's environment, and gets back the pid of the spare's guard,
// forked by the template and re-parented to the agent -- which must therefore be a child
// subreaper (enableSubreaper()) -- or, by a template forked from a rank (the agent's child
// already), made its sibling: the agent's child at once (worker_runtime/spare/spare_template.h). The result is a GuardedProcess like spawnGuarded()'s: the
// WorkerGroup supervises a forked spare as any worker (status records, kill through the
// control socket, reaping of its guard, output), and the guard sweeps what the spare left.
//
// Whenever the template cannot fork -- still loading, exited, a refused or unanswered request
// -- forkSpare() says why and the caller exec's the spare as before (spawnGuarded), so a rank
// is never lost to it. The agent's loop thread only; the one blocking wait is the template's
// answer to a request (a fork: 1-2 ms here; 80 ms seen at load 90), bounded by kAnswerTimeout.
// A fork asked at idle priority takes only the CPU time the ranks leave: with every CPU busy
// training (SCHED_IDLE's share is about 0.3% of a CPU against one busy rank) its answer took
// over 1 s on this VM, so its bound is kIdleAnswerTimeout, unless the template is stopped.
// The loop also serves the workers' store, so a loaded template is asked with request() and
// its answer() read once the socket is readable (Agent::Impl::queueFork), never waited for;
// and the agent asks for the next failure's spare after a recovery only once every worker
// announced the new generation (Agent::Impl::startOwedSpares): its fork copies page tables on
// the cores they re-form on. A grow back's replacement is asked at the shrink itself: the
// template has one forked ahead of the request (worker_runtime/spare/spare_guard.h).
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "launcher/guarded_process.h"

namespace ddprun::launcher {

// The spare id Agent::makeLaunch() is given for the template's launch: a spare's launch in the
// directory spare_template, whose DDPRUN_SPARE the agent replaces (no spare has this id).
inline constexpr int kSpareTemplateLaunchId = 1 << 30;

class SpareTemplate {
 public:
  static constexpr std::chrono::milliseconds kAnswerTimeout{1000};
  static constexpr std::chrono::milliseconds kIdleAnswerTimeout{30000};

  // The socket pair. Throws ddprun::Error naming socketpair when it fails.
  SpareTemplate();
  // The template's end, for its SpawnRequest::passFd; closed here once it was spawned.
  int templateFd() const { return child_.get(); }
  void templateSpawned() { child_.reset(); }

  // A template forked from a rank: sends it `fd` (dup'ed in the message), where its own lines
  // go. False when the socket refused it (the template's lines then go nowhere).
  bool sendOutput(int fd);

  // Forks spare `spareId` (environment `env`, "KEY=VALUE"; under SCHED_IDLE when `idle`) from
  // the template. nullopt, with `why`, when it cannot; `gone()` then says whether it ever can.
  std::optional<GuardedProcess> forkSpare(int spareId, bool idle,
                                          const std::vector<std::string>& env, std::string& why);
  // forkSpare() in two halves, for a caller that waits for the answer on its own loop:
  // request() sends it (false, with `why`, when it cannot), answer() reads the answer, waiting
  // up to `wait` (0: the socket is readable, or the request's bound is over: no answer then
  // makes the template gone). One request at a time; fd() is the socket to wait on.
  bool request(int spareId, bool idle, const std::vector<std::string>& env, std::string& why);
  std::optional<GuardedProcess> answer(std::chrono::milliseconds wait, std::string& why);
  bool answerOwed() const { return pending_.has_value(); }
  // Whether the caller, kAnswerTimeout after request() and no answer yet, keeps waiting: the
  // request is at idle priority, kIdleAnswerTimeout is not over and the template is not stopped
  // (SIGSTOP, a debugger: it would not answer however long the agent waited).
  bool answerMayStillCome() const;
  // How long the owed answer has been waited for (0 when none is owed).
  std::chrono::milliseconds answerWaited() const;
  int fd() const { return agent_.get(); }
  // Whether the template has said Ready (it forks now), reading its answer if one came.
  bool ready() {
    std::string why;
    return !gone_ && checkReady(why);
  }
  // The template exited, broke the protocol or did not answer in time: it forks no more.
  bool gone() const { return gone_; }
  // The template's pid, once it said Ready or Loading (-1 before).
  pid_t pid() const { return pid_; }

  // Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER), so that the guards the
  // template forks are re-parented to it. False, with `why`, when refused.
  static bool enableSubreaper(std::string& why);

 private:
  bool checkReady(std::string& why);
  // Whether the template's process is stopped (state T or t in /proc/<pid>/stat).
  bool stopped() const;
  // The agent's ends of the descriptors a request sent, until its answer came.
  struct Pending {
    UniqueFd control, status, out, err;
    bool idle = false;
    std::chrono::steady_clock::time_point asked;
  };
  std::optional<Pending> pending_;
  UniqueFd agent_, child_;
  bool ready_ = false;
  bool loadingSeen_ = false;
  bool gone_ = false;
  pid_t pid_ = -1;
};

}  // namespace ddprun::launcher
