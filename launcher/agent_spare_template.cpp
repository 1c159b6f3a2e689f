// The spare template of a group (launcher/spare_template.h, docs/recovery.md#spare-template):
// one more process of the worker program, started with the group's first spares (or alone,
// under --recovery-policy=shrink without spares), from which every later spare -- a grow back's
// replacement is one -- is forked instead of exec'd. Whatever goes wrong with it, the spares are
// exec'd as before: the template only ever saves a start-up, it never holds one up. Under
// shrink without spares on one node it is not a process of its own but a fork of local rank 0,
// made at the rank's init() (templateFromRank): nothing loads the program a second time.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "launcher/agent_impl.h"
#include "rendezvous/spare_fork.h"

namespace ddprun::launcher {

void Agent::Impl::startSpareTemplate(bool idle) {
  if (spareTemplate_ || spareTemplateOff_ || !groupRunning()) return;
  if (auto it = env_.find("DDPRUN_SPARE_TEMPLATE"); it != env_.end() && it->second == "0") {
    DDPRUN_LOG(INFO, "launcher") << "DDPRUN_SPARE_TEMPLATE=0: no spare template, every spare "
                                 << "is started as a process";
    spareTemplateOff_ = true;
    return;
  }
  std::string why;
  if (!SpareTemplate::enableSubreaper(why)) {
    DDPRUN_LOG(WARN, "launcher") << "no spare template (spares are started as processes): "
                                 << why;
    spareTemplateOff_ = true;
    return;
  }
  auto tmpl = std::make_unique<SpareTemplate>();
  // A spare's launch, in the directory spare_template, without DDPRUN_SPARE.
  WorkerLaunch l = makeLaunch(round_, 0, 0, kSpareTemplateLaunchId);
  l.spareId = -1;
  l.sparesTemplate = true;
  const std::string spareVar = "DDPRUN_SPARE=" + std::to_string(kSpareTemplateLaunchId);
  std::erase(l.spawn.env, spareVar);
  l.spawn.env.push_back(std::string(rendezvous::spare_fork::kTemplateFdVariable) + "=" +
                        std::to_string(kPassedFd));
  // One thread per pool, whatever the ranks get: OpenBLAS starts its pool as the library loads
  // (at --nproc-per-node=1 a rank has no OMP_NUM_THREADS, so on 2 CPUs the template had 2
  // threads at init() and could not fork). Each forked spare sizes its pools again from its own
  // environment, as a rank's process would (worker_runtime/thread_pools.h).
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    const std::string prefix = std::string(name) + "=";
    std::erase_if(l.spawn.env, [&](const std::string& v) { return v.rfind(prefix, 0) == 0; });
    l.spawn.env.push_back(prefix + "1");
  }
  l.spawn.passFd = tmpl->templateFd();
  l.spawn.subreaper = false;  // its forks' guards go to the agent, out of its tree
  // With the group's first spares, at normal priority: part of the job's start, and loaded as
  // soon as they are, so that the next spare is a fork. Alone (shrink without spares), idle:
  // it is for a death that may never come, so it must not slow the training.
  l.spawn.idlePriority = idle;
  if (idle) {
    l.spawn.env.push_back(std::string(rendezvous::spare_fork::kTemplateIdleVariable) + "=1");
  }
  l.stdoutTargets.prefix = l.stderrTargets.prefix = "[spare template]: ";
  group_->add(std::move(l));
  tmpl->templateSpawned();
  spareTemplate_ = std::move(tmpl);
  DDPRUN_LOG(INFO, "launcher") << "starting the spare template" << (idle ? " in the background (SCHED_IDLE)" : "")
                               << ": once loaded, the "
                               << (growTemplateStarted_ ? "replacements that grow a shrunk group back"
                                                        : "spares started later")
                               << " are forks of it";
}

std::unique_ptr<SpareTemplate> Agent::Impl::templateFromRank(WorkerLaunch& rank0) {
  std::string why;
  if (options_.spares > 0 || options_.recoveryPolicy != LaunchOptions::RecoveryPolicy::Shrink ||
      spareTemplateOff_ || round_.worldSize < 2 || !growBackUsable(why)) {
    return nullptr;
  }
  if (auto it = env_.find("DDPRUN_SPARE_TEMPLATE"); it != env_.end() &&
                                                     (it->second == "0" || it->second == "exec")) {
    return nullptr;  // off, or exec'd once every rank announced (startSpareTemplate)
  }
  if (!SpareTemplate::enableSubreaper(why)) return nullptr;  // startSpareTemplate says it
  auto tmpl = std::make_unique<SpareTemplate>();
  const bool idle = backgroundIdle();
  auto& env = rank0.spawn.env;
  env.push_back(std::string(rendezvous::spare_fork::kTemplateForkFdVariable) + "=" +
                std::to_string(kPassedFd));
  if (idle) env.push_back(std::string(rendezvous::spare_fork::kTemplateIdleVariable) + "=1");
  rank0.spawn.passFd = tmpl->templateFd();
  // Its orphans go past its guard to this process (a child subreaper): the template, and the
  // guards of the spares it forks, which this process reaps. The guard still kills the rank's
  // process group and what is below it when it ends; a job cgroup sweeps the rest.
  rank0.spawn.subreaper = false;
  // Its own lines go to ddprun's stderr (not the rank's pipes, which it would hold open).
  // (Said once every rank announced in-process recovery, in maybeStartSpares(): a program
  // without the runtime, a Python script, ignores the variable and forks none.)
  if (!tmpl->sendOutput(STDERR_FILENO)) {
    DDPRUN_LOG(WARN, "launcher") << "the spare template forked from rank " << rank0.globalRank
                                 << " will print nothing: its socket refused ddprun's stderr";
  }
  return tmpl;
}

void Agent::Impl::endSpareTemplate() {
  // Queued forks were for this group: dropped. An answer still owed is never read (the socket
  // closes below); a guard forked anyway finds its control socket closed and kills its spare.
  forkQueue_.clear();
  forkAsked_ = false;
  ++forkEpoch_;
  if (templateFromRank_ && spareTemplate_) spareTemplate_->ready();  // its pid, if it said it
  const pid_t forked = templateFromRank_ && spareTemplate_ ? spareTemplate_->pid() : -1;
  spareTemplate_.reset();  // its socket closed: a template that reads it exits
  templateFromRank_ = false;
  if (forked <= 0) return;
  // This process's child (re-parented when the rank's fork between exited), so the pid is not
  // reused before it is reaped here. Killed, not waited for: it may be stopped or warming up.
  // Its process group (its own, made by the rank's fork between) also holds the guard and spare
  // it forked ahead of a request, if any (worker_runtime/spare/spare_guard.h): the guard is this
  // process's child too, and the spare becomes one when its guard dies first. Both killed and
  // reaped with it; a spare handed over left the group.
  const pid_t group = ::getpgid(forked);
  ::kill(forked, SIGKILL);
  int st;
  while (::waitpid(forked, &st, 0) < 0 && errno == EINTR) {
  }
  if (group <= 0 || group == ::getpgrp()) return;
  ::kill(-group, SIGKILL);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < until) {
    const pid_t r = ::waitpid(-group, &st, WNOHANG);
    if (r < 0 && errno != EINTR) return;  // ECHILD: none of this process's children is left
    if (r == 0) {
      ::kill(-group, SIGKILL);  // a spare re-parented here after the first kill
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

std::function<GuardedProcess(const SpawnRequest&)> Agent::Impl::spareSpawner(
    int id, std::optional<bool> idleIfForked) {
  if (!spareTemplate_) return {};
  return [this, id, idleIfForked](const SpawnRequest& req) {
    std::string why;
    const bool wasGone = spareTemplate_->gone();
    if (auto p = spareTemplate_->forkSpare(id, idleIfForked.value_or(req.idlePriority), req.env,
                                           why)) {
      DDPRUN_LOG(INFO, "launcher") << "spare " << id << " forked from the spare template (pid "
                                   << spareTemplate_->pid() << "), guard pid " << p->guardPid;
      return std::move(*p);
    }
    sayExecd(id, why, wasGone);
    return spawnGuarded(req);
  };
}

void Agent::Impl::sayExecd(int id, const std::string& why, bool wasGone) {
  if (spareTemplate_ && spareTemplate_->gone() && !wasGone) {
    DDPRUN_LOG(WARN, "launcher") << "spare template (pid " << spareTemplate_->pid() << "): "
                                 << why << "; spare " << id << " and the later ones are "
                                 << "started as processes";
  } else {
    DDPRUN_LOG(INFO, "launcher") << "spare " << id << " is started as a process: " << why;
  }
}

void Agent::Impl::queueFork(WorkerLaunch l, int id, bool idle) {
  forkQueue_.push_back({.launch = std::move(l), .id = id, .idle = idle});
  sendNextFork();
}

void Agent::Impl::sendNextFork() {
  if (!groupRunning()) {  // stopping: no spare will be added, so none is asked
    forkQueue_.clear();
    return;
  }
  while (!forkAsked_ && !forkQueue_.empty()) {
    std::string why = "the spare template is gone";
    const bool wasGone = !spareTemplate_ || spareTemplate_->gone();
    UniqueFd watched(spareTemplate_ ? ::dup(spareTemplate_->fd()) : -1);  // what the loop waits on
    if (spareTemplate_ && !watched) why = std::string("dup: ") + std::strerror(errno);
    if (watched && spareTemplate_->request(forkQueue_.front().id, forkQueue_.front().idle,
                                           forkQueue_.front().launch.spawn.env, why)) {
      forkAsked_ = true;
      const uint64_t epoch = ++forkEpoch_;
      // Whichever comes first (the answer, EOF or the bound) cancels the other and calls
      // onForkAnswer(); the other's call then finds the epoch moved on.
      auto readable = std::make_shared<asio::posix::stream_descriptor>(io_, watched.release());
      auto timer = std::make_shared<asio::steady_timer>(io_);
      readable->async_wait(asio::posix::stream_descriptor::wait_read,
                           [this, readable, timer, epoch](boost::system::error_code ec) {
                             if (ec == asio::error::operation_aborted) return;
                             timer->cancel();
                             onForkAnswer(epoch);
                           });
      armForkTimer(readable, timer, epoch);
      return;
    }
    QueuedFork f = std::move(forkQueue_.front());
    forkQueue_.pop_front();
    sayExecd(f.id, why, wasGone);
    group_->add(std::move(f.launch));  // (the group still runs: nothing above changed it)
  }
}

void Agent::Impl::armForkTimer(std::shared_ptr<asio::posix::stream_descriptor> readable,
                               std::shared_ptr<asio::steady_timer> timer, uint64_t epoch) {
  timer->expires_after(SpareTemplate::kAnswerTimeout);
  timer->async_wait([this, readable, timer, epoch](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted || epoch != forkEpoch_) return;
    // An idle fork waits for the CPU time the ranks leave: checked again every kAnswerTimeout
    // (whether the template was stopped meanwhile) up to kIdleAnswerTimeout.
    if (spareTemplate_ && spareTemplate_->answerOwed() && spareTemplate_->answerMayStillCome()) {
      armForkTimer(readable, timer, epoch);
      return;
    }
    readable->cancel();
    onForkAnswer(epoch);
  });
}

void Agent::Impl::onForkAnswer(uint64_t epoch) {
  if (epoch != forkEpoch_ || !forkAsked_) return;  // answered already, or the group is over
  ++forkEpoch_;  // the other handler of this request does nothing
  forkAsked_ = false;
  QueuedFork f = std::move(forkQueue_.front());
  forkQueue_.pop_front();
  std::string why = "the spare template is gone";
  std::optional<GuardedProcess> p;
  bool wasGone = true;
  auto waited = std::chrono::milliseconds(0);
  if (spareTemplate_ && spareTemplate_->answerOwed()) {
    wasGone = spareTemplate_->gone();
    waited = spareTemplate_->answerWaited();
    // Readable, or the request's bound is over: no wait either way.
    p = spareTemplate_->answer(std::chrono::milliseconds(0), why);
  }
  if (groupRunning()) {
    if (p) {
      // How long an idle fork waited for CPU time, when that was long enough to notice.
      const std::string slow = waited >= SpareTemplate::kAnswerTimeout
                                   ? ", answered after " + std::to_string(waited.count()) + " ms"
                                   : "";
      DDPRUN_LOG(INFO, "launcher") << "spare " << f.id << " forked from the spare template (pid "
                                   << spareTemplate_->pid() << "), guard pid " << p->guardPid
                                   << slow;
      f.launch.spawner = [forked = std::make_shared<GuardedProcess>(std::move(*p))](
                             const SpawnRequest&) { return std::move(*forked); };
    } else {
      sayExecd(f.id, why, wasGone);
    }
    group_->add(std::move(f.launch));
    publishSpares();
  }
  sendNextFork();
}

pid_t Agent::Impl::runningTemplatePid() const {
  if (templateFromRank_) return spareTemplate_ && !spareTemplate_->gone() ? spareTemplate_->pid() : -1;
  if (!group_) return -1;
  for (const auto& r : group_->results()) {
    if (r.sparesTemplate && !r.ended && r.pid > 0) return r.pid;
  }
  return -1;
}

void Agent::Impl::startOwedSpares() {
  if (sparesOwed_ == 0 || state_ != State::Running || !group_ || recoveryPending_) return;
  rendezvous::StoreServer* store = handler_->workerStore();
  if (store == nullptr) return;
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare) continue;
    const auto v = store->get(prefix + rendezvous::recovery::announceKey(w.globalRank));
    if (!v || std::atoi(v->c_str()) < generation_) return;  // still re-forming
  }
  for (; sparesOwed_ > 0; --sparesOwed_) startSpare(/*idle=*/idleSpares_ == 1);
}

void Agent::Impl::onSpareTemplateExited(const WorkerResult& r) {
  if (r.stopSignal != 0 || !groupRunning()) return;
  DDPRUN_LOG(WARN, "launcher") << "the spare template (pid " << r.pid << ") exited ("
                               << r.describe() << "): the spares started from now on are "
                               << "started as processes; the workers and the spares forked "
                               << "from it are not touched (see its log in " << runDir_->path()
                               << ")";
  spareTemplate_.reset();
}

}  // namespace ddprun::launcher
