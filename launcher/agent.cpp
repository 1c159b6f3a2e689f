#include "launcher/agent.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <sched.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <tuple>

#include "launcher/failure_report.h"
#include "launcher/hot_spares.h"
#include "launcher/job_cgroup.h"
#include "launcher/launcher_error_file.h"
#include "launcher/option_values.h"
#include "launcher/progress_watch.h"
#include "launcher/rendezvous_handler.h"
#include "launcher/run_directory.h"
#include "launcher/worker_command.h"
#include "launcher/worker_env.h"
#include "launcher/timeline/exchange.h"
#include "launcher/timeline/merge.h"
#include "launcher/worker_group.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/store_server.h"
#include "base/errors.h"
#include "rendezvous/grow_record.h"
#include "base/log.h"
#include "base/progress_file.h"
#include "base/timeline.h"

namespace ddprun::launcher {

namespace asio = boost::asio;
// base/timeline.h: this process's track of the job's timeline (launcher/timeline/ merges them).
namespace events = ddprun::timeline;

namespace {
// Leaving on a signal: the timeline's exchange gets this much per store call, and the writer
// waits this long for the bundles of the nodes that were signalled too.
constexpr std::chrono::milliseconds kSignalExchangeCall{2'000};
constexpr std::chrono::milliseconds kSignalCollectWait{3'000};

std::string hostName() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}
}  // namespace

class Agent::Impl {
 public:
  Impl(LaunchOptions options, Environment env, AgentLink* link)
      : options_(std::move(options)), env_(std::move(env)), link_(link), signals_(io_) {
    // --rdzv-conf token_file reaches the workers as DDPRUN_STORE_TOKEN_FILE, so that every
    // client of the job's store (agents and workers) holds the same token.
    for (const auto& [k, v] : options_.rdzvConf)
      if (k == "token_file") env_["DDPRUN_STORE_TOKEN_FILE"] = v;
  }

  int run();
  const std::string& errorRecord() const { return errorRecord_; }

 private:
  enum class State { Rendezvous, Running, Stopping, Finishing, Leaving, Closing, Done };
  // Why a running group is being stopped; decides what follows once it has stopped.
  enum class StopReason { None, WorkerFailed, Decision, Signal, Error };

  void waitForSignal();
  void onSignal(int sig);
  void nextRound();
  void startWorkers(const RoundInfo& round);
  std::vector<WorkerLaunch> makeLaunches(const RoundInfo& round);
  // Local rank `lr`'s launch in `round`; `generation` > 0: a replacement (in-process recovery);
  // `spareId` >= 0: hot spare <spareId> (in no rank, hot_spares.h).
  WorkerLaunch makeLaunch(const RoundInfo& round, int lr, int generation, int spareId = -1);
  // ---- Hot spares (--spares, docs/recovery.md#hot-spares) ----
  // Whether this group may have spares; else `why` (said once per job).
  bool sparesUsable(std::string& why) const;
  // A key a worker SET in the agent's store: once every worker of the group has announced
  // in-process recovery (its program runs the runtime's elastic loop), the spares start.
  void onStoreSet(const std::string& key);
  // Starts one spare; `idle`: under SCHED_IDLE (training is running, hot_spares.h).
  void startSpare(bool idle);
  // A waiting spare's exit: restarted when the group still runs (no restart spent).
  void onSpareExited(const WorkerResult& r);
  // The pid of a waiting spare to give a dead rank to (a ready one first), or -1.
  pid_t pickSpare(int& id);
  void onWorkerStarted(const WorkerResult& r);
  // Moves the waiting spares out of SCHED_IDLE (before they are stopped).
  void unidleSpares();
  std::string progressTablePath() const;
  // --stall-warning / --peer-timeout over the group's workers as they are now.
  void watchProgress();
  void onWorkerExited(const WorkerResult& r);
  // In-process recovery (docs/recovery.md): whether the death of `r` can be healed without
  // stopping the others, then the budget, then the replacement and the new generation.
  bool canRecoverInProcess(const WorkerResult& r);
  void recoverInProcess(const WorkerResult& r);
  void replaceWorker(const WorkerResult& r, const JobDecision& d);
  // --recovery-policy=shrink: the survivors go on without `r`, renumbered densely.
  // `budgetSpent`: the death spent a restart (d.restartCount); a replacement that died before
  // it healed spends none.
  void shrinkGroup(const WorkerResult& r, const JobDecision& d, bool budgetSpent = true);
  // ---- Grow back (--recovery-policy=shrink, docs/recovery.md#grow-back) ----
  // Whether a shrunk group may take replacements back in; else `why`.
  bool growBackUsable(std::string& why) const;
  // Starts a replacement in the background (a hot spare under SCHED_IDLE) for each rank the
  // group lacks and that no waiting one stands for (tryGrow: once the survivors re-formed).
  void startReplacements();
  // When a replacement is ready and every worker is in the newest generation: publishes the
  // generation with one rank more (the workers take it at their next commit) and gives the
  // replacement its rank. When the joining one has healed: done. Called on the keys the workers
  // set (ready, announcements), never on a timer.
  void tryGrow();
  void growGroup(pid_t sparePid, int spareId);
  // The joining replacement died before it healed: the group goes on without it (no restart
  // spent) and grows back no more.
  void abandonGrow(const WorkerResult& r);
  // The console prefix of a worker that now has global rank `rank` in local rank slot `lr`.
  std::string prefixFor(int rank, int lr) const;
  // SCHED_IDLE for background spares and replacements: decided once per job.
  bool backgroundIdle();
  // The workers of the group now (running, not spares): its world size in-process.
  int liveWorkers(pid_t except = -1) const;
  // The dead rank's new process: a waiting spare (true) or none to be had (false).
  bool giveRankToSpare(const WorkerResult& r, int generation, int& spareId, pid_t& sparePid);
  // --peer-timeout: the worker stopped beating (progress_watch.h); kill it, a failure.
  void onWorkerSilent(const ProgressWatch::Worker& w, long pid, double silentSeconds);
  void onHandlerDecision(const JobDecision& d);
  void onGroupStopped();
  void stoppedNotRunning();  // onGroupStopped() of a group ddprun stopped
  void afterLocalFailure(const JobDecision& d);
  void apply(const JobDecision& d);
  void stopGroup(StopReason reason, int sig);
  // Leaves the job for a signal, then exits with `code`. `groupStopped`: the signal stopped the
  // running group (then the timeline's events are exchanged first, bounded in time).
  void leaveAndExit(int code, bool groupStopped = false);
  void leave(int code);
  // The job has ended for this node: print the summary (multi-node), let the handler tell the
  // other nodes (asyncShutdown), then exit with `code`.
  void endJob(int code, const std::string& summary);
  // Every local worker of the group exited 0 on its own (before ddprun stopped anything).
  bool localSuccess() const;
  // Every started worker process is gone already (its exit not processed yet).
  bool workersAlreadyGone() const;
  void finish(int code);
  void fail(std::exception_ptr e);
  // --timeline: this agent's track and the workers' part directory; mergeTimeline() writes the
  // trace (at the end, and after each group so a job that dies leaves one). Never throws.
  void openTimeline();
  void mergeTimeline();
  // --timeline on several nodes (c10d, static, etcd-v3 with the agent store): the agent of node
  // rank 0 writes FILE; every other agent ships its node's events to it through the round's
  // shared store (timeline/exchange.h).
  bool timelineAcrossNodes() const;
  bool timelineWriter() const { return round_.nodeRank == 0; }
  // "<run id>/<round>": the worker group of the round, which names the bundles' keys.
  std::string timelineGroup() const { return round_.runId + "/" + std::to_string(round_.round); }
  // Runs `job` on the exchange thread, then `then` on the I/O thread.
  void onExchange(std::function<void()> job, std::function<void()> then);
  // The job that ships this node's events as they are now (the values copied: it runs on the
  // exchange thread).
  std::function<void()> shipTimeline(
      std::optional<rendezvous::TcpStoreOptions> via = std::nullopt) const;
  // The writer: the collected bundles, with the ranks each node may hold.
  void takeBundles(timeline::Collected collected);
  // The exit barrier (asyncFinish), once the group has stopped with every worker succeeding.
  void exitBarrier();
  // Runs fn on the I/O thread; an exception is kept (and rethrown by run()), never thrown.
  template <typename Fn>
  void guarded(Fn&& fn) {
    try {
      fn();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  LaunchOptions options_;
  Environment env_;
  AgentLink* link_;
  asio::io_context io_{1};
  asio::signal_set signals_;
  std::unique_ptr<RendezvousHandler> handler_;
  std::unique_ptr<RunDirectory> runDir_;
  WorkerCommand command_;
  std::unique_ptr<JobCgroup> cgroup_;  // before group_: outlives the workers' guards
  std::shared_ptr<WorkerGroup> group_;
  std::unique_ptr<ProgressWatch> progressWatch_;  // while the group runs (--stall-warning)
  RoundInfo round_;
  State state_ = State::Rendezvous;
  StopReason stopReason_ = StopReason::None;
  std::string timelineParts_;      // --timeline: where every process writes its part file
  int64_t timelineSince_ = 0;      // parts of processes started before this are older runs'
  int64_t rendezvousStartUs_ = 0;  // for the "rendezvous" span
  int signal_ = 0;
  std::optional<WorkerResult> rootCause_;
  JobDecision pending_;  // StopReason::Decision: what to do once the group has stopped
  // In-process recovery: the group's generation (0 at each start of the group), the
  // generation each local rank's current process was started in, a budget decision pending,
  // and a failure whose budget decision was taken before the group was stopped.
  int generation_ = 0;
  std::vector<int> startedGeneration_;
  bool recoveryPending_ = false;
  // Another worker died while that decision was pending: the group restarts on the decision
  // already taken (one restart for the window, not two).
  bool restartOnDecision_ = false;
  int recoveryRestarts_ = 0;  // the job's restarts spent after this round's last recovery
  std::optional<JobDecision> decidedFailure_;
  // Hot spares: ids are unique in the job (their store keys are too); the group's spares have
  // started; spares that died before they were ready, in a row (3: no more for this group).
  int nextSpareId_ = 0;
  bool sparesStarted_ = false;
  int sparesDiedUnready_ = 0;
  bool sparesNoted_ = false;     // the line saying spares cannot be used was printed
  int idleSpares_ = -1;          // -1: not decided; 0: spares start at normal priority; 1: idle
  // Grow back: the replacement joining now (-1: none), its rank and the generation it joins;
  // grow back given up for this group (a replacement died before it healed).
  pid_t growPid_ = -1;
  int growRank_ = -1;
  int growGeneration_ = 0;
  bool growBackOff_ = false;
  bool growBackNoted_ = false;  // the line saying why there is no grow back was printed
  int exitCode_ = 1;
  std::exception_ptr error_;
  std::string errorRecord_;  // ddprun's own error file, when the job fails
  std::string timelineNode_;               // this agent's track: "agent <node>"
  std::vector<timeline::ReceivedBundle> timelineBundles_;  // the writer: the other nodes' events
  std::vector<std::string> timelineMissing_;  // the writer: nodes that sent none
  // The round's store the nodes' events go through (RendezvousHandler::sharedStore); none: each
  // node writes its own FILE.
  std::optional<rendezvous::TcpStoreOptions> timelineStore_;
  bool timelineShipped_ = false;  // this round's bundle went out before the exit barrier
  // Last member: destroyed (its queue run, its thread joined) while io_ is still alive.
  std::unique_ptr<timeline::ExchangeThread> exchange_;
};

int Agent::Impl::run() {
  command_ = buildWorkerCommand(options_, env_);
  handler_ = makeRendezvousHandler(io_, options_);
  runDir_ = std::make_unique<RunDirectory>(options_.logDir, options_.rdzvId);
  bool filesWanted = !options_.localRanksFilter.empty();
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
    filesWanted = filesWanted || options_.redirects.forRank(lr) || options_.tee.forRank(lr);
  }
  if (filesWanted) runDir_->keep();
  {
    const auto off = env_.find("DDPRUN_CGROUP");
    cgroup_ = JobCgroup::create(options_.rdzvId, off != env_.end() && off->second == "0");
  }
  openTimeline();
  if (setsOmpNumThreads(env_, options_.nprocPerNode)) {
    DDPRUN_LOG(WARN, "launcher") << "setting OMP_NUM_THREADS=1 for each of the "
                                 << options_.nprocPerNode
                                 << " workers (it is unset); set it yourself to tune";
  }
  handler_->setListener(
      [this](const JobDecision& d) { guarded([&] { onHandlerDecision(d); }); });
  for (int sig : options_.signalsToHandle) signals_.add(sig);
  waitForSignal();
  if (link_) {
    link_->attach(io_, [this](int sig) { guarded([&] { onSignal(sig); }); },
                  handler_->hostedStorePort());
  }
  nextRound();
  io_.run();

  if (group_) group_->killAll();
  if (error_) std::rethrow_exception(error_);
  return exitCode_;
}

void Agent::Impl::waitForSignal() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    guarded([&] { onSignal(sig); });
    if (state_ != State::Done) waitForSignal();
  });
}

void Agent::Impl::onSignal(int sig) {
  switch (state_) {
    case State::Running:
      DDPRUN_LOG(WARN, "launcher") << "received " << signalName(sig)
                                   << ": forwarding it to the workers";
      stopGroup(StopReason::Signal, sig);
      break;
    case State::Stopping:
      if (stopReason_ == StopReason::Signal) {
        DDPRUN_LOG(WARN, "launcher") << "received " << signalName(sig)
                                     << " again: killing the workers now";
        group_->stop(SIGKILL, std::chrono::milliseconds(0));
      } else {
        stopReason_ = StopReason::Signal;
        signal_ = sig;
        group_->stop(sig, options_.shutdownTimeout);
      }
      break;
    case State::Rendezvous:
    case State::Finishing:
      DDPRUN_LOG(WARN, "launcher") << "received " << signalName(sig) << ": leaving the job";
      signal_ = sig;
      leaveAndExit(128 + sig);
      break;
    case State::Leaving:
    case State::Closing:
      finish(128 + sig);  // a second signal does not wait for a clean leave
      break;
    case State::Done:
      break;
  }
}

void Agent::Impl::nextRound() {
  if (group_) mergeTimeline();  // a trace up to this restart, should the job die in the next
  state_ = State::Rendezvous;
  stopReason_ = StopReason::None;
  rootCause_.reset();
  rendezvousStartUs_ = events::nowUs();
  handler_->asyncNextRound(options_.nprocPerNode, [this](std::exception_ptr e, RoundInfo info) {
    guarded([&] {
      if (state_ != State::Rendezvous) return;  // a signal arrived meanwhile
      if (!e) {
        events::span("rendezvous", "agent", rendezvousStartUs_,
                       events::nowUs() - rendezvousStartUs_,
                       events::Args()
                           .add("round", info.round)
                           .add("attempt", info.restartCount)
                           .add("node_rank", info.nodeRank)
                           .add("nodes", info.nodeCount)
                           .add("world_size", info.worldSize));
      }
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const JobEnded& ended) {
          DDPRUN_LOG(WARN, "launcher") << ended.what();
          endJob(ended.exitCode(), ended.summary());
          return;
        }
      }
      startWorkers(info);
    });
  });
}

std::string Agent::Impl::progressTablePath() const {
  // The job's progress table (base/progress_file.h), when a watch reads it.
  return options_.stallWarning != 0 || options_.peerTimeout > 0 ? runDir_->path() + "/progress"
                                                                 : std::string();
}

std::vector<WorkerLaunch> Agent::Impl::makeLaunches(const RoundInfo& round) {
  // The job's progress table, its records reset for this round.
  const std::string progressTable = progressTablePath();
  if (!progressTable.empty()) {
    progress::writeProgressTable(progressTable, options_.nprocPerNode,
                                 FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
  }
  std::vector<WorkerLaunch> launches;
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) launches.push_back(makeLaunch(round, lr, 0));
  return launches;
}

WorkerLaunch Agent::Impl::makeLaunch(const RoundInfo& round, int lr, int generation,
                                     int spareId) {
  const int nproc = options_.nprocPerNode;
  // A background group must not read a tty; a linked agent's stdin is its link's.
  const bool devNullStdin = link_ != nullptr || ::isatty(STDIN_FILENO) == 1;
  auto templ = env_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  const std::string progressTable = progressTablePath();
  const int rank = round.rankOffset + lr;
  std::string dir = runDir_->workerDir(round.round, lr);
  if (spareId >= 0) {
    // A spare keeps its error file and logs in a directory of its own, whatever rank it takes.
    dir = runDir_->path() + "/attempt_" + std::to_string(round.round) + "/spare_" +
          std::to_string(spareId);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
  } else if (generation > 0) {
    // A replacement keeps its own error file and logs next to the dead worker's.
    dir += "/generation_" + std::to_string(generation);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
  }
  WorkerLaunch l;
  l.localRank = lr;
  l.globalRank = rank;
  l.errorFile = dir + "/error.json";
  l.progressFile = progressTable;  // this worker's record: its local rank
  Environment overlay = workerEnvOverlay(WorkerEnvInputs{
      .base = env_, .round = round, .localRank = lr, .localWorldSize = nproc,
      .maxRestarts = options_.maxRestarts, .role = options_.role, .errorFile = l.errorFile,
      .progressFile = l.progressFile});
  // docs/recovery.md: what the runtime's elastic run does after a peer's death, and which
  // generation of the group a replacement joins. In the overlay, so that they replace a value
  // of the same name in ddprun's own environment instead of coming after it.
  overlay["DDPRUN_RECOVERY"] =
      options_.recovery == LaunchOptions::Recovery::Restart     ? "restart"
      : options_.recovery == LaunchOptions::Recovery::InProcess ? "in-process"
                                                                : "auto";
  if (generation > 0) overlay["DDPRUN_GENERATION"] = std::to_string(generation);
  l.spawn = SpawnRequest{.executable = command_.executable,
                         .argv = argvForRank(command_, lr),
                         .env = mergeEnvironment(env_, overlay),
                         .stdinFromDevNull = devNullStdin};
  if (cgroup_) l.spawn.cgroup = cgroup_->workerCgroup();
  // The worker group a rank's collectives belong to (ddprun-trace compares their calls).
  if (!timelineParts_.empty()) {
    l.spawn.env.push_back("DDPRUN_TIMELINE_GROUP=" + round.runId + "/" +
                          std::to_string(round.round));  // = timelineGroup() of the round
  }
  if (spareId >= 0) {
    l.spareId = spareId;
    l.localRank = l.globalRank = -1;
    l.spawn.env = spareEnvironment(l.spawn.env, spareId);
  }

  const std::string prefix =
      spareId >= 0 ? "[spare " + std::to_string(spareId) + "]: "
      : link_      ? link_->linePrefix(round.nodeRank, rank, lr)
                   : linePrefix(templ != env_.end() ? &templ->second : nullptr, options_.role,
                                rank, lr, round.worldSize);
  const bool filteredOut =
      !options_.localRanksFilter.empty() && options_.localRanksFilter.count(lr) == 0;
  auto targets = [&](uint8_t bit, int consoleFd, const char* file, size_t tail) {
    const StreamRoute route = routeStream(bit, options_.redirects.forRank(lr),
                                          options_.tee.forRank(lr), filteredOut);
    return StreamTargets{.consoleFd = route.console ? consoleFd : -1,
                         .prefix = prefix,
                         .filePath = route.file ? dir + "/" + file : "",
                         .tailLines = tail};
  };
  l.stdoutTargets = targets(kStdOut, STDOUT_FILENO, "stdout.log", 0);
  l.stderrTargets = targets(kStdErr, STDERR_FILENO, "stderr.log", WorkerGroup::kTailLines);
  return l;
}

void Agent::Impl::startWorkers(const RoundInfo& round) {
  round_ = round;
  timelineStore_ = handler_->sharedStore(round);
  timelineShipped_ = false;
  auto launches = makeLaunches(round);
  generation_ = 0;
  startedGeneration_.assign(launches.size(), 0);
  recoveryPending_ = false;
  restartOnDecision_ = false;
  recoveryRestarts_ = round.restartCount;
  decidedFailure_.reset();
  sparesStarted_ = false;
  sparesDiedUnready_ = 0;
  growPid_ = -1;
  growRank_ = -1;
  growGeneration_ = 0;
  growBackOff_ = false;
  bool observe = false;
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
    std::string why;
    observe = growBackUsable(why);
  }
  if (options_.spares > 0) {
    std::string why;
    if (!sparesUsable(why)) {
      if (!sparesNoted_) {
        DDPRUN_LOG(WARN, "launcher") << "--spares=" << options_.spares << ": no spares for this "
                                     << "job: " << why;
      }
      sparesNoted_ = true;
    } else {
      // Spares start once every worker has announced in-process recovery: a program without
      // the runtime (a Python script, a shell worker) never gets one.
      observe = true;
    }
  }
  if (auto* store = handler_->workerStore(); store && observe) {
    store->setObserver([this](const std::string& key) {
      asio::post(io_, [this, key] { guarded([&] { onStoreSet(key); }); });
    });
  }
  auto group = std::make_shared<WorkerGroup>(
      io_, WorkerGroup::Callbacks{
               .exited = [this](const WorkerResult& r) { guarded([&] { onWorkerExited(r); }); },
               .started = [this](const WorkerResult& r) { guarded([&] { onWorkerStarted(r); }); },
               .stopped = [this] { guarded([&] { onGroupStopped(); }); }});
  // Callbacks only come from the io_context, after start() returns. If start() throws, it
  // has killed and reaped what it started; the error ends the job (fail()).
  group->start(std::move(launches));
  group_ = std::move(group);
  state_ = State::Running;
  if (timelineAcrossNodes() && !timelineWriter()) {
    // This machine's offset to node rank 0's (its ranks measure theirs too, from init()).
    std::string host = round.masterAddr;  // "[::1]" -> "::1"
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    rendezvous::TcpStoreOptions workerStore{
        .host = host, .port = round.masterPort,
        .dialect = rendezvous::StoreDialect::Ddprun, .tokenFromEnvironment = false};
    // Rank 0's store (--no-agent-store) takes the job's token, as the rendezvous store does.
    if (!round.useAgentStore) workerStore.authToken = timelineStore_->authToken;
    exchange_->post([workerStore] { timeline::measureClock(workerStore); });
  }
  watchProgress();
  // The attempt is the workers' TORCHELASTIC_RESTART_COUNT (what a trainer prints); a
  // membership change starts a new round of the same attempt.
  DDPRUN_LOG(INFO, "launcher") << "started " << options_.nprocPerNode << " worker(s) of "
                               << round.worldSize << " (attempt " << round.restartCount
                               << ", round " << round.round << ": " << round.restartCount << "/"
                               << options_.maxRestarts << " restarts used; "
                               << handler_->describe() << ")";
}

void Agent::Impl::watchProgress() {
  progressWatch_.reset();
  const std::string table = progressTablePath();
  if (table.empty() || !group_) return;
  std::vector<ProgressWatch::Worker> watched;
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
    // The rank the slot's process has now (a shrink renumbers); a slot a shrink left empty is
    // not watched.
    int rank = round_.rankOffset + lr;
    bool live = false, any = false;
    for (const auto& w : group_->results()) {
      if (w.spare || w.localRank != lr) continue;
      any = true;
      if (!w.ended) {
        live = true;
        rank = w.globalRank;
      }
    }
    if (any && !live && generation_ > 0 &&
        options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
      continue;
    }
    watched.push_back({rank, lr, table});
  }
  progressWatch_ = std::make_unique<ProgressWatch>(
      io_, ProgressWatch::Options{
               .policy = {.thresholdSeconds = std::max(0.0, options_.stallWarning)},
               .warnStalls = options_.stallWarning != 0,
               .freeze = {.timeoutSeconds = options_.peerTimeout},
               .nodeRank = round_.nodeRank,
               .host = hostName(),
               .workers = std::move(watched),
               .pidOf = [g = std::weak_ptr<WorkerGroup>(group_)](int localRank) -> long {
                 auto group = g.lock();
                 if (!group) return -1;
                 // The running process of the local rank (a replacement, or a spare that took
                 // the rank, runs after the dead); 0 when every process of it ended.
                 long found = -1;
                 for (const auto& r : group->results()) {
                   if (r.localRank != localRank || r.spare) continue;
                   if (!r.ended) return r.pid;
                   found = 0;
                 }
                 return found;
               },
               .onSilent =
                   [this](const ProgressWatch::Worker& w, long pid, double silent) {
                     guarded([&] { onWorkerSilent(w, pid, silent); });
                   }});
}

void Agent::Impl::onWorkerExited(const WorkerResult& r) {
  if (r.spare) {
    onSpareExited(r);
    return;
  }
  // The last worker: the group closes now and kills its waiting spares; one under SCHED_IDLE
  // would on a busy node wait long for the CPU time its own exit takes, holding the job's end.
  if (group_->runningCount() == 0) unidleSpares();
  events::instant("worker exit", "agent",
                    events::Args()
                        .add("rank", r.globalRank)
                        .add("pid", static_cast<int64_t>(r.pid))
                        .add("failed", r.failed() && r.stopSignal == 0 ? 1 : 0)
                        .add("stopped_by_ddprun", r.stopSignal != 0 ? 1 : 0)
                        .add("result", r.describe()));
  if (state_ != State::Running || !r.failed()) return;
  if (recoveryPending_) {
    // A second failure in the window of one recovery's budget decision: that decision (one
    // restart) covers both; the group restarts on it (recoverInProcess).
    restartOnDecision_ = true;
    DDPRUN_LOG(ERROR, "launcher") << "rank " << r.globalRank << " (local rank " << r.localRank
                                  << ", pid " << r.pid << ") failed too: " << r.describe()
                                  << "; the group restarts instead of recovering in process";
    return;
  }
  if (r.pid == growPid_) {
    abandonGrow(r);
    return;
  }
  if (canRecoverInProcess(r)) {
    recoverInProcess(r);
    return;
  }
  rootCause_ = r;
  DDPRUN_LOG(ERROR, "launcher") << "rank " << r.globalRank << " (local rank " << r.localRank
                                << ", pid " << r.pid << ") failed: " << r.describe()
                                << "; stopping the other workers";
  stopGroup(StopReason::WorkerFailed, SIGTERM);
}

bool Agent::Impl::canRecoverInProcess(const WorkerResult& r) {
  if (options_.recovery == LaunchOptions::Recovery::Restart) return false;
  const bool asked = options_.recovery == LaunchOptions::Recovery::InProcess;
  auto refuse = [&](const std::string& why) {
    if (asked) {
      DDPRUN_LOG(WARN, "launcher") << "--recovery=in-process: " << why
                                   << "; restarting the group instead";
    }
    return false;
  };
  rendezvous::StoreServer* store = handler_->workerStore();
  if (store == nullptr || round_.nodeCount != 1 || !round_.useAgentStore) {
    return refuse("only a single node whose workers use the agent's store recovers in process");
  }
  // Every worker the recovery relies on holds the training state of its current process: the
  // dead one's rank (so its program runs the elastic loop) and each one still running (the
  // survivors heal the replacement from their memory).
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  auto holdsState = [&](const WorkerResult& w) {
    const auto v = store->get(prefix + rendezvous::recovery::announceKey(w.globalRank));
    if (!v) return false;
    const size_t lr = static_cast<size_t>(w.localRank);
    const int since = lr < startedGeneration_.size() ? startedGeneration_[lr] : 0;
    return std::atoi(v->c_str()) >= since;
  };
  // The dead rank's program runs the elastic loop when a process of that rank announced it,
  // this one or an earlier (a replacement or spare that died before it healed: the survivors
  // still hold the state, the next generation gets a new process).
  if (!store->get(prefix + rendezvous::recovery::announceKey(r.globalRank))) {
    return refuse("rank " + std::to_string(r.globalRank) + " had not announced in-process "
                  "recovery (its program does not run the runtime's elastic loop, or it died "
                  "before it held the training state)");
  }
  int survivors = 0;
  for (const auto& w : group_->results()) {
    if (w.ended || w.pid == r.pid || w.spare) continue;
    if (!holdsState(w)) {
      return refuse("rank " + std::to_string(w.globalRank) + " (pid " + std::to_string(w.pid) +
                    ") does not hold the training state yet");
    }
    ++survivors;
  }
  if (survivors == 0) return refuse("no worker survived to heal a replacement from");
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      survivors < options_.shrinkMinRanks) {
    // Below the job's minimum the group restarts at full size (or ends: the budget decides).
    DDPRUN_LOG(WARN, "launcher") << "--recovery-policy=shrink: without rank " << r.globalRank
                                 << " the group would have " << survivors << " rank(s), below "
                                 << "the job's minimum of " << options_.shrinkMinRanks
                                 << "; restarting the group instead";
    return false;
  }
  return true;
}

int Agent::Impl::liveWorkers(pid_t except) const {
  int n = 0;
  for (const auto& w : group_->results()) {
    if (!w.ended && !w.spare && w.pid != except) ++n;
  }
  return n;
}

void Agent::Impl::recoverInProcess(const WorkerResult& r) {
  recoveryPending_ = true;
  const std::string what = "rank " + std::to_string(r.globalRank) + " failed (" + r.describe() + ")";
  const ErrorFile ef = readErrorFile(r.errorFile);
  const bool retryable = ef.retryable.value_or(true);
  // The budget first (--max-restarts counts each recovery): NextRound means one was left.
  handler_->asyncReportFailure(
      r.exitCode(), retryable ? what : what + ": " + ef.message, retryable,
      [this, r](std::exception_ptr e, JobDecision d) {
        guarded([&] {
          recoveryPending_ = false;
          if (state_ != State::Running) return;
          if (e) std::rethrow_exception(e);
          if (d.kind == JobDecision::Kind::NextRound && group_->runningCount() > 0 &&
              !restartOnDecision_) {
            if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
              shrinkGroup(r, d);
            } else {
              replaceWorker(r, d);
            }
            return;
          }
          // The budget is spent (or the error cannot be retried), or every other worker ended
          // or another one died meanwhile: the group stops as after any failure, with this death as its root cause,
          // and the decision taken stands (no second restart counted): a restart, or the end.
          rootCause_ = r;
          decidedFailure_ = d;
          DDPRUN_LOG(ERROR, "launcher") << "rank " << r.globalRank << " (local rank "
                                        << r.localRank << ", pid " << r.pid << ") failed: "
                                        << r.describe() << "; stopping the other workers";
          stopGroup(StopReason::WorkerFailed, SIGTERM);
        });
      });
}

void Agent::Impl::replaceWorker(const WorkerResult& r, const JobDecision& d) {
  const int generation = ++generation_;
  recoveryRestarts_ = d.restartCount;
  const int lr = r.localRank;
  const std::string table = progressTablePath();
  if (!table.empty()) {
    progress::resetProgressRecord(table, lr, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
  }
  int spareId = -1;
  pid_t sparePid = -1;
  if (!giveRankToSpare(r, generation, spareId, sparePid)) {
    group_->add(makeLaunch(round_, lr, generation));
  }
  startedGeneration_[static_cast<size_t>(lr)] = generation;
  const std::string cause = "rank " + std::to_string(r.globalRank) + " (pid " +
                            std::to_string(r.pid) + ") failed: " + r.describe();
  handler_->workerStore()->set(
      rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
          rendezvous::recovery::generationKey(generation),
      rendezvous::recovery::formatGenerationRecord({.generation = generation,
                                                    .replaced = {r.globalRank},
                                                    .cause = cause,
                                                    .spare = spareId}));
  events::instant("recovery", "agent",
                  events::Args()
                      .add("cause", cause)
                      .add("generation", generation)
                      .add("rank", r.globalRank)
                      .add("spare", spareId)
                      .add("restarts_spent", d.restartCount));
  const std::string taker =
      spareId >= 0 ? "spare " + std::to_string(spareId) + " (pid " + std::to_string(sparePid) +
                         ") takes rank " + std::to_string(r.globalRank)
                   : "a new rank " + std::to_string(r.globalRank) + " is starting";
  DDPRUN_LOG(WARN, "launcher") << "rank " << r.globalRank << " (local rank " << lr << ", pid "
                               << r.pid << ") failed: " << r.describe()
                               << "; recovering in process (generation " << generation
                               << "): the other workers keep running, " << taker << " (restart "
                               << d.restartCount << " of " << options_.maxRestarts << " spent)";
  if (spareId >= 0) {
    events::instant("spare assign", "agent",
                    events::Args()
                        .add("spare", spareId)
                        .add("pid", static_cast<int64_t>(sparePid))
                        .add("rank", r.globalRank)
                        .add("local_rank", lr)
                        .add("generation", generation));
    startSpare(/*idle=*/idleSpares_ == 1);  // in the background: the next failure's
  }
  watchProgress();  // the new process is watched from its first beat
}

void Agent::Impl::shrinkGroup(const WorkerResult& r, const JobDecision& d, bool budgetSpent) {
  const int generation = ++generation_;
  recoveryRestarts_ = d.restartCount;
  const int before = liveWorkers() + 1;  // the dead one has ended
  const int after = before - 1;
  // The survivors keep their order: rank q > r becomes q - 1 (recovery_keys.h shrinkRank), in
  // the agent's books as in each survivor's runtime, which reads the same record.
  std::vector<std::pair<pid_t, int>> renumbered;
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare) continue;
    const int rank = rendezvous::recovery::shrinkRank(w.globalRank, {r.globalRank});
    if (rank != w.globalRank) renumbered.emplace_back(w.pid, rank);
  }
  for (const auto& [pid, rank] : renumbered) {
    group_->renumber(pid, rank);
    for (const auto& w : group_->results()) {
      if (w.pid == pid && !w.ended) group_->setPrefix(pid, prefixFor(rank, w.localRank));
    }
  }
  const std::string cause = "rank " + std::to_string(r.globalRank) + " (pid " +
                            std::to_string(r.pid) + ") failed: " + r.describe();
  handler_->workerStore()->set(
      rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
          rendezvous::recovery::generationKey(generation),
      rendezvous::recovery::formatGenerationRecord({.generation = generation,
                                                    .cause = cause,
                                                    .removed = {r.globalRank},
                                                    .worldSize = after}));
  events::instant("recovery", "agent",
                  events::Args()
                      .add("cause", cause)
                      .add("generation", generation)
                      .add("rank", r.globalRank)
                      .add("policy", "shrink")
                      .add("world_size", after)
                      .add("restarts_spent", d.restartCount));
  DDPRUN_LOG(WARN, "launcher") << "rank " << r.globalRank << " (local rank " << r.localRank
                               << ", pid " << r.pid << ") failed: " << r.describe()
                               << "; recovering in process (generation " << generation
                               << "): the group shrinks from " << before << " to " << after
                               << " rank(s), the others keep running ("
                               << (budgetSpent ? "restart " + std::to_string(d.restartCount) +
                                                     " of " + std::to_string(options_.maxRestarts) +
                                                     " spent"
                                               : std::string("no restart spent"))
                               << ")";
  watchProgress();  // the dead rank's slot is no longer watched; the others by their new ranks
  // The replacement starts once the survivors have re-formed (tryGrow, on their announcements):
  // starting a process takes this loop, which serves the store their re-form goes through.
}

// ---- Grow back ----
//
// After a shrink, once the survivors have re-formed (each announced the new generation), the
// agent starts a replacement as it starts a hot spare in the background
// (hot_spares.h: loaded, connected, waiting in the store, under SCHED_IDLE so that the
// survivors' steps are not slowed). Nothing waits for it. When its ready key is set and every
// worker has announced the newest generation (no recovery in flight), the agent publishes the
// grow record (rendezvous/grow_record.h) and the spare's assignment in one turn of its loop; each
// worker's runtime sees the record through its watch thread and takes it at its next commit
// (runElastic), so the survivors have nothing to roll back; the replacement heals from the
// lowest rank's memory and the trainers split the rest of the epoch over the larger group.
// A grow is no failure: it spends no restart. The joining replacement's death before it
// healed spends none either (the survivors lose no step, they re-form at a commit): the group
// goes on without it, and grows back no more (one line says so), so a replacement that cannot
// join costs a bounded number of re-forms. After it healed it is a worker like any other.

bool Agent::Impl::growBackUsable(std::string& why) const {
  if (options_.recovery == LaunchOptions::Recovery::Restart) {
    why = "--recovery=restart";
    return false;
  }
  if (handler_->workerStore() == nullptr || round_.nodeCount != 1 || !round_.useAgentStore) {
    why = "only a single node whose workers use the agent's store recovers in process";
    return false;
  }
  return true;
}

bool Agent::Impl::backgroundIdle() {
  if (idleSpares_ < 0) {
    std::string why;
    idleSpares_ = canLeaveIdlePriority(why) ? 1 : 0;
    if (idleSpares_ == 0) {
      DDPRUN_LOG(WARN, "launcher") << "spares and replacements started while training runs "
                                   << "start at normal priority, not SCHED_IDLE: " << why;
    }
  }
  return idleSpares_ == 1;
}

void Agent::Impl::startReplacements() {
  std::string why;
  if (!growBackUsable(why) || growBackOff_) return;
  const int missing = options_.nprocPerNode - liveWorkers() -
                      static_cast<int>(group_->waitingSpares().size());
  for (int i = 0; i < missing; ++i) {
    const bool idle = backgroundIdle();
    DDPRUN_LOG(INFO, "launcher") << "grow back: a replacement starts in the background"
                                 << (idle ? " (SCHED_IDLE)" : "") << "; the group takes it in at "
                                 << "a commit once it is ready, nothing waits for it";
    startSpare(idle);
  }
}

void Agent::Impl::tryGrow() {
  if (state_ != State::Running || !group_ || recoveryPending_ || growBackOff_) return;
  rendezvous::StoreServer* store = handler_->workerStore();
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  auto announced = [&](int rank) {
    const auto v = store->get(prefix + rendezvous::recovery::announceKey(rank));
    return v ? std::atoi(v->c_str()) : -1;
  };
  if (growPid_ > 0) {
    // Joining: done once it announced that it holds the state in its generation (or later).
    if (announced(growRank_) < growGeneration_) return;
    DDPRUN_LOG(INFO, "launcher") << "grow back: rank " << growRank_ << " (pid " << growPid_
                                 << ") healed; the group has " << liveWorkers() << " rank(s)";
    growPid_ = -1;
  }
  if (liveWorkers() >= options_.nprocPerNode) return;
  // Every worker in the newest generation: no recovery is under way.
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare) continue;
    if (announced(w.globalRank) < generation_) return;
  }
  startReplacements();  // the ones the group lacks, if not started yet
  for (const auto& s : group_->waitingSpares()) {
    if (s.pid <= 0) continue;
    if (!store->get(prefix + rendezvous::recovery::spareReadyKey(s.spareId))) continue;
    growGroup(s.pid, s.spareId);
    return;
  }
}

void Agent::Impl::growGroup(pid_t sparePid, int spareId) {
  // The replacement takes the lowest slot without a running worker, and the rank that keeps
  // the ranks in slot order: once every slot is filled again, every rank is its slot's.
  int slot = -1;
  for (int lr = 0; lr < options_.nprocPerNode && slot < 0; ++lr) {
    bool taken = false;
    for (const auto& w : group_->results()) taken = taken || (!w.ended && !w.spare && w.localRank == lr);
    if (!taken) slot = lr;
  }
  DDPRUN_CHECK(slot >= 0, "a group that grows has a free slot");
  int rank = round_.rankOffset;
  for (const auto& w : group_->results()) {
    if (!w.ended && !w.spare && w.localRank < slot) ++rank;
  }
  const int before = liveWorkers();
  const int after = before + 1;
  const int generation = ++generation_;
  std::vector<std::tuple<pid_t, int, int>> renumbered;  // pid, new rank, slot
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare) continue;
    const int now = rendezvous::recovery::growRank(w.globalRank, rank);
    if (now != w.globalRank) renumbered.emplace_back(w.pid, now, w.localRank);
  }
  for (const auto& [pid, now, lr] : renumbered) {
    group_->renumber(pid, now);
    group_->setPrefix(pid, prefixFor(now, lr));
  }
  const std::string table = progressTablePath();
  if (!table.empty()) {
    progress::resetProgressRecord(table, slot, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
  }
  DDPRUN_CHECK(group_->assign(sparePid, slot, rank), "a waiting spare takes the rank");
  group_->setPrefix(sparePid, prefixFor(rank, slot));
  if (schedulingPolicy(sparePid) == SCHED_IDLE) {
    std::string error;
    leaveIdlePriority(sparePid, error);
    if (!error.empty()) {
      DDPRUN_LOG(WARN, "launcher") << "grow back: the replacement (pid " << sparePid
                                   << ") takes rank " << rank << " but stays at idle priority: "
                                   << error;
    }
  }
  startedGeneration_[static_cast<size_t>(slot)] = generation;
  growPid_ = sparePid;
  growRank_ = rank;
  growGeneration_ = generation;
  const std::string cause = "grow back: spare " + std::to_string(spareId) + " (pid " +
                            std::to_string(sparePid) + ") takes rank " + std::to_string(rank);
  // The record first: the replacement reads it as soon as it has its assignment.
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  rendezvous::StoreServer* store = handler_->workerStore();
  store->set(prefix + rendezvous::recovery::generationKey(generation),
             rendezvous::recovery::formatGrowRecord({.generation = generation,
                                                 .added = rank,
                                                 .worldSize = after,
                                                 .spare = spareId,
                                                 .cause = cause}));
  store->set(prefix + rendezvous::recovery::spareAssignKey(spareId),
             rendezvous::recovery::formatSpareAssignment(
                 {.generation = generation, .rank = rank, .localRank = slot}));
  events::instant("grow", "agent",
                  events::Args()
                      .add("generation", generation)
                      .add("rank", rank)
                      .add("spare", spareId)
                      .add("pid", static_cast<int64_t>(sparePid))
                      .add("world_size", after));
  DDPRUN_LOG(WARN, "launcher") << "grow back (generation " << generation << "): spare "
                               << spareId << " (pid " << sparePid << ") is ready and takes rank "
                               << rank << " (local rank " << slot << "); the group grows from "
                               << before << " to " << after << " rank(s) at the workers' next "
                               << "commit (no restart spent)";
  watchProgress();
}

void Agent::Impl::abandonGrow(const WorkerResult& r) {
  growPid_ = -1;
  growBackOff_ = true;
  DDPRUN_LOG(ERROR, "launcher") << "grow back: the replacement, rank " << r.globalRank
                                << " (local rank " << r.localRank << ", pid " << r.pid
                                << "), died before it healed: " << r.describe() << "; the group "
                                << "goes on without it and grows back no more (see its log in "
                                << runDir_->path() << ")";
  JobDecision d;
  d.restartCount = recoveryRestarts_;
  shrinkGroup(r, d, /*budgetSpent=*/false);
}

std::string Agent::Impl::prefixFor(int rank, int lr) const {
  auto templ = env_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  return link_ ? link_->linePrefix(round_.nodeRank, rank, lr)
               : linePrefix(templ != env_.end() ? &templ->second : nullptr, options_.role, rank,
                            lr, round_.worldSize);
}

bool Agent::Impl::giveRankToSpare(const WorkerResult& r, int generation, int& spareId,
                                  pid_t& sparePid) {
  if (!sparesStarted_) return false;
  const pid_t pid = pickSpare(spareId);
  if (pid <= 0 || !group_->assign(pid, r.localRank, r.globalRank)) return false;
  sparePid = pid;
  group_->setPrefix(pid, prefixFor(r.globalRank, r.localRank));
  // A spare started under SCHED_IDLE runs at normal priority from now on: a worker at idle
  // priority would hold back every collective of the group.
  if (schedulingPolicy(pid) == SCHED_IDLE) {
    std::string error;
    leaveIdlePriority(pid, error);
    if (!error.empty()) {
      DDPRUN_LOG(WARN, "launcher") << "spare " << spareId << " (pid " << pid << ") takes rank "
                                   << r.globalRank << " but stays at idle priority: " << error;
    }
  }
  handler_->workerStore()->set(
      rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
          rendezvous::recovery::spareAssignKey(spareId),
      rendezvous::recovery::formatSpareAssignment(
          {.generation = generation, .rank = r.globalRank, .localRank = r.localRank}));
  return true;
}

pid_t Agent::Impl::pickSpare(int& id) {
  rendezvous::StoreServer* store = handler_->workerStore();
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  pid_t best = -1;
  bool bestReady = false;
  for (const auto& s : group_->waitingSpares()) {
    if (s.pid <= 0) continue;  // not exec'd yet
    const bool ready = store->get(prefix + rendezvous::recovery::spareReadyKey(s.spareId)).has_value();
    if (best > 0 && (bestReady || !ready)) continue;
    best = s.pid;
    bestReady = ready;
    id = s.spareId;
  }
  // A spare still loading is taken too: it is further on than a process started now.
  return best;
}

bool Agent::Impl::sparesUsable(std::string& why) const {
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
    why = "--recovery-policy=shrink goes on without the dead rank and starts a replacement "
          "after the shrink (grow back), not before";
    return false;
  }
  if (options_.recovery == LaunchOptions::Recovery::Restart) {
    why = "they take a dead worker's rank only in an in-process recovery, and this job runs "
          "with --recovery=restart";
    return false;
  }
  if (handler_->workerStore() == nullptr || round_.nodeCount != 1 || !round_.useAgentStore) {
    why = "only a single node whose workers use the agent's store recovers in process";
    return false;
  }
  return true;
}

void Agent::Impl::onStoreSet(const std::string& key) {
  if (state_ != State::Running || !group_) return;
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  const bool announce = key.rfind(prefix + "ddprun/recovery/", 0) == 0;
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
    // Grow back: on a spare's ready key or a worker's announcement.
    if (announce || key.rfind(prefix + "ddprun/spare/", 0) == 0) tryGrow();
    return;
  }
  if (sparesStarted_ || options_.spares <= 0) return;
  if (!announce) return;  // announceKey()s only
  rendezvous::StoreServer* store = handler_->workerStore();
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
    if (!store->get(prefix + rendezvous::recovery::announceKey(round_.rankOffset + lr))) return;
  }
  backgroundIdle();  // decided now, for the spares started later
  // Every worker runs the elastic loop: the spares of this group start now, at normal
  // priority (they are part of the job's start, as its workers are).
  sparesStarted_ = true;
  for (int i = 0; i < options_.spares; ++i) startSpare(/*idle=*/false);
}

void Agent::Impl::startSpare(bool idle) {
  if (!group_ || group_->runningCount() == 0 || state_ != State::Running) return;
  const int id = nextSpareId_++;
  WorkerLaunch l = makeLaunch(round_, 0, 0, id);
  l.spawn.idlePriority = idle;
  group_->add(std::move(l));
  DDPRUN_LOG(INFO, "launcher") << "starting spare " << id
                               << (idle ? " in the background (SCHED_IDLE)" : "")
                               << ": it loads and waits for a rank";
}

void Agent::Impl::onSpareExited(const WorkerResult& r) {
  if (r.stopSignal != 0 || state_ != State::Running || group_->runningCount() == 0) return;
  // Shrink: a waiting replacement is started again only while the group lacks a rank.
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      (growBackOff_ || liveWorkers() + static_cast<int>(group_->waitingSpares().size()) >=
                           options_.nprocPerNode)) {
    return;
  }
  // Died while waiting: the training group is not touched and no restart is spent. A spare
  // that dies before it is ready, three times in a row, ends the spares of this group.
  const bool wasReady =
      handler_->workerStore()
          ->get(rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
                rendezvous::recovery::spareReadyKey(r.spareId))
          .has_value();
  sparesDiedUnready_ = wasReady ? 0 : sparesDiedUnready_ + 1;
  events::instant("spare exit", "agent",
                  events::Args().add("spare", r.spareId).add("pid", static_cast<int64_t>(r.pid))
                      .add("result", r.describe()));
  if (sparesDiedUnready_ >= 3) {
    DDPRUN_LOG(ERROR, "launcher") << "spare " << r.spareId << " (pid " << r.pid << ") died "
                                  << "before it was ready (" << r.describe() << "), the third "
                                  << "in a row: no more spares for this group (see its log "
                                  << "in " << runDir_->path() << ")";
    return;
  }
  DDPRUN_LOG(WARN, "launcher") << "spare " << r.spareId << " (pid " << r.pid << ") died while "
                               << "waiting (" << r.describe() << "): starting another; the "
                               << "workers are not touched, no restart is spent";
  startSpare(/*idle=*/idleSpares_ == 1);
}

void Agent::Impl::unidleSpares() {
  if (!group_) return;
  for (const auto& s : group_->waitingSpares()) {
    std::string error;
    if (s.pid > 0) leaveIdlePriority(s.pid, error);  // best effort: they are killed next
  }
}

void Agent::Impl::onWorkerStarted(const WorkerResult& r) {
  if (r.spare) {
    events::instant("spare start", "agent",
                    events::Args()
                        .add("spare", r.spareId)
                        .add("pid", static_cast<int64_t>(r.pid))
                        .add("round", round_.round)
                        .add("attempt", round_.restartCount)
                        .add("idle_priority", schedulingPolicy(r.pid) == SCHED_IDLE ? 1 : 0));
    return;
  }
  const size_t lr = static_cast<size_t>(r.localRank);
  events::instant("worker start", "agent",
                  events::Args()
                      .add("rank", r.globalRank)
                      .add("local_rank", r.localRank)
                      .add("pid", static_cast<int64_t>(r.pid))
                      .add("round", round_.round)
                      .add("attempt", round_.restartCount)
                      .add("generation", lr < startedGeneration_.size() ? startedGeneration_[lr] : 0));
}

void Agent::Impl::onWorkerSilent(const ProgressWatch::Worker& w, long pid, double silent) {
  if (state_ != State::Running) return;
  char why[160];
  std::snprintf(why, sizeof why, "no heartbeat for %.1f s (--peer-timeout=%g)", silent,
                options_.peerTimeout);
  DDPRUN_LOG(ERROR, "launcher") << "rank " << w.rank << " (local rank " << w.localRank
                                << ", pid " << pid << ") on node " << round_.nodeRank
                                << " stopped answering: " << why
                                << "; it is stopped or frozen, not slow (its heartbeat beats "
                                << "through long steps): killing it (SIGKILL)";
  events::instant("worker frozen", "agent",
                  events::Args().add("rank", w.rank).add("pid", static_cast<int64_t>(pid))
                      .add("silent_s", silent));
  group_->kill(w.localRank, why);  // its exit is a failure: the group restarts as for a death
}

void Agent::Impl::onHandlerDecision(const JobDecision& d) {
  if (state_ != State::Running) return;  // other states get their decision as a completion
  switch (d.kind) {
    case JobDecision::Kind::NextRound:
      events::instant("restart", "agent",
                        events::Args()
                            .add("cause", d.reason)
                            .add("restarts_spent", d.restartCount));
      if (d.restartCount > round_.restartCount) {
        DDPRUN_LOG(WARN, "launcher") << "restarting the workers after a failure on another node "
                                     << "(restart " << d.restartCount << " of "
                                     << options_.maxRestarts << " spent there): " << d.reason;
      } else {
        DDPRUN_LOG(WARN, "launcher") << "restarting the workers (membership changed, no restart "
                                     << "spent): " << d.reason;
      }
      break;
    case JobDecision::Kind::Finished:
      DDPRUN_LOG(WARN, "launcher") << "the job finished while this node was cut off: " << d.reason
                                   << "; stopping what is left of its workers";
      break;
    case JobDecision::Kind::Failed:
      // A lost store has been reported in a line of its own (with its address and why).
      DDPRUN_LOG(ERROR, "launcher") << "stopping the workers: "
                                    << (d.storeLost ? "the rendezvous store is lost" : d.reason);
      break;
  }
  pending_ = d;
  if (workersAlreadyGone()) {
    // They ended on their own while this agent was not looking (it was paused): let their exit
    // records, already waiting in the pipes, arrive instead of signalling them, so that how
    // they ended is known (localSuccess()).
    progressWatch_.reset();
    stopReason_ = StopReason::Decision;
    state_ = State::Stopping;
    return;
  }
  stopGroup(StopReason::Decision, SIGTERM);
}

bool Agent::Impl::workersAlreadyGone() const {
  const auto pids = group_->workerPids();
  if (pids.empty()) return false;
  for (pid_t pid : pids) {
    if (::kill(pid, 0) == 0 || errno != ESRCH) return false;  // the guard reaps at once
  }
  return true;
}

void Agent::Impl::stopGroup(StopReason reason, int sig) {
  progressWatch_.reset();
  unidleSpares();  // they are stopped with the group: their exit must not wait for idle CPU
  stopReason_ = reason;
  if (reason == StopReason::Signal) signal_ = sig;
  state_ = State::Stopping;
  group_->stop(sig, options_.shutdownTimeout);
}

void Agent::Impl::onGroupStopped() {
  // What a guard killed from outside could not sweep dies before anything else starts.
  if (cgroup_) cgroup_->sweep();
  if (state_ == State::Running) {
    // Every worker exited and none failed: the job is done once the other nodes agree.
    progressWatch_.reset();
    state_ = State::Finishing;
    if (timelineAcrossNodes() && !timelineWriter()) {
      // Before the barrier: once the writer has passed it, this node's events are in the store.
      timelineShipped_ = true;
      onExchange(shipTimeline(), [this] { exitBarrier(); });
      return;
    }
    exitBarrier();
    return;
  }
  if (state_ != State::Stopping) return;
  stoppedNotRunning();
}

void Agent::Impl::exitBarrier() {
  if (state_ != State::Finishing) return;  // a signal arrived meanwhile
  handler_->asyncFinish([this](std::exception_ptr e, JobDecision d) {
    guarded([&] {
      if (state_ != State::Finishing) return;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const Error& ex) {
          // As torchrun: a node whose workers all succeeded exits 0 even when the exit barrier
          // cannot complete (the store host is gone, the others did not finish in time).
          DDPRUN_LOG(WARN, "launcher") << "every worker of this node succeeded, but the exit "
                                       << "barrier did not complete: " << ex.what()
                                       << "; exiting 0";
          finish(0);
          return;
        }
      }
      apply(d);
    });
  });
}

void Agent::Impl::stoppedNotRunning() {
  switch (stopReason_) {
    case StopReason::WorkerFailed: {
      // The group's results now carry the complete stderr tails.
      for (const auto& r : group_->results()) {
        if (r.localRank == rootCause_->localRank && r.pid == rootCause_->pid) rootCause_ = r;
      }
      if (decidedFailure_) {
        // In-process recovery asked the budget already: that decision stands.
        afterLocalFailure(*decidedFailure_);
        break;
      }
      std::string what = "rank " + std::to_string(rootCause_->globalRank) + " failed (" +
                         rootCause_->describe() + ")";
      // The worker's error file may say that a restart cannot help (a bad setting, an
      // incompatible checkpoint): then the job ends now, with that message.
      const ErrorFile ef = readErrorFile(rootCause_->errorFile);
      const bool retryable = ef.retryable.value_or(true);
      if (!retryable) {
        what += ": " + ef.message;
        DDPRUN_LOG(ERROR, "launcher") << "rank " << rootCause_->globalRank << " failed with an "
                                      << "error a restart cannot fix: " << ef.message;
      }
      handler_->asyncReportFailure(
          rootCause_->exitCode(), what, retryable,
          [this](std::exception_ptr e, JobDecision d) {
            guarded([&] {
              if (state_ != State::Stopping) return;
              if (e) std::rethrow_exception(e);
              afterLocalFailure(d);
            });
          });
      break;
    }
    case StopReason::Decision:
      if (pending_.storeLost && localSuccess()) {
        // The store went away after every local worker had succeeded: its host exits once the
        // job has ended, so this node's part is done (torchrun exits 0 here too).
        DDPRUN_LOG(WARN, "launcher") << pending_.reason << "; every worker of this node had "
                                     << "succeeded: exiting 0";
        finish(0);
        break;
      }
      apply(pending_);
      break;
    case StopReason::Signal:
      leaveAndExit(128 + signal_, /*groupStopped=*/true);
      break;
    case StopReason::Error:
    case StopReason::None:
      finish(1);
      break;
  }
}

void Agent::Impl::afterLocalFailure(const JobDecision& d) {
  const WorkerResult& rc = *rootCause_;
  if (d.kind == JobDecision::Kind::NextRound) {
    events::instant("restart", "agent",
                      events::Args()
                          .add("cause", "rank " + std::to_string(rc.globalRank) + " failed (" +
                                            rc.describe() + ")")
                          .add("restarts_spent", d.restartCount));
    if (d.restartCount > round_.restartCount) {
      DDPRUN_LOG(WARN, "launcher") << "restarting the worker group after rank " << rc.globalRank
                                   << " failed (" << rc.describe() << "): restart "
                                   << d.restartCount << " of " << options_.maxRestarts
                                   << " spent by this node";
    } else {
      DDPRUN_LOG(WARN, "launcher") << "rank " << rc.globalRank << " failed (" << rc.describe()
                                   << ") after the round had ended (a failure elsewhere spent "
                                   << "the restart): rejoining";
    }
    nextRound();
    return;
  }
  if (d.kind == JobDecision::Kind::Failed) {
    FailureReport report{.program = options_.program,
                         .host = hostName(),
                         .restartCount = std::max(round_.restartCount, recoveryRestarts_),
                         .round = round_.round,
                         .maxRestarts = options_.maxRestarts,
                         .rootCause = rc,
                         .pythonWorker = command_.python};
    for (const auto& r : group_->results()) {
      if (r.localRank != rc.localRank && r.failed() && !r.spare) report.others.push_back(r);
    }
    if (runDir_->temporary()) report.keptDirectory = runDir_->path();
    Console::of(STDERR_FILENO).flush(kConsoleFlushBound);  // workers' lines before the report
    writeFully(STDERR_FILENO, formatFailureReport(report));
    events::instant("failure report", "agent",
                      events::Args().add("root_cause", "rank " + std::to_string(rc.globalRank) +
                                                             ": " + rc.describe()));
    errorRecord_ = workerErrorRecord(readErrorFile(rc.errorFile), rc);
    if (link_) link_->rootCause(rc, d.exitCode);
  }
  apply(d);
}

void Agent::Impl::apply(const JobDecision& d) {
  switch (d.kind) {
    case JobDecision::Kind::NextRound:
      nextRound();
      break;
    case JobDecision::Kind::Finished:
      endJob(0, d.summary);
      break;
    case JobDecision::Kind::Failed:
      endJob(d.exitCode, d.summary);
      break;
  }
}

bool Agent::Impl::localSuccess() const {
  if (!group_ || group_->results().empty()) return false;
  for (const auto& r : group_->results()) {
    if (r.spare) continue;  // a spare stopped with the group is no worker's result
    if (!r.ended || r.failed() || r.stopSignal != 0) return false;
  }
  return true;
}

void Agent::Impl::endJob(int code, const std::string& summary) {
  state_ = State::Closing;
  events::instant("job end", "agent",
                    events::Args().add("exit_code", code).add("summary", summary));
  if (code != 0 && errorRecord_.empty()) {
    // The job failed on another node: the reason every node reports.
    errorRecord_ = generatedErrorRecord(summary.empty() ? "the job failed" : summary, code);
  }
  if (!summary.empty()) writeFully(STDERR_FILENO, "ddprun: " + summary + "\n");
  auto shutdown = [this, code] {
    if (state_ != State::Closing) return;
    handler_->asyncShutdown([this, code](std::exception_ptr) {
      if (state_ == State::Closing) finish(code);
    });
  };
  if (!timelineAcrossNodes() || !group_) {
    shutdown();
  } else if (!timelineWriter()) {
    if (code == 0 && timelineShipped_) {
      // Shipped before the exit barrier, which the writer has passed too: it reads the bundles
      // now, so a second one would race its read (and with etcd-v3 the store it goes through
      // ends with the writer, which does not wait for this node).
      shutdown();
    } else {
      onExchange(shipTimeline(), shutdown);  // with the job's end: a failure's events
    }
  } else {
    // Before the shutdown: the store host (maybe this agent) keeps the store up until every
    // node has recorded the end, so the bundles are readable now. After a success each one
    // was shipped before the exit barrier; after a failure, a node still shipping has a while.
    const auto store = *timelineStore_;
    const std::string runId = timelineGroup();
    const int nodes = round_.nodeCount;
    auto collected = std::make_shared<timeline::Collected>();
    onExchange(
        [store, runId, nodes, collected] {
          *collected = timeline::collect(store, runId, nodes, std::chrono::seconds(5));
        },
        [this, collected, shutdown] {
          takeBundles(std::move(*collected));
          shutdown();
        });
  }
}

void Agent::Impl::takeBundles(timeline::Collected collected) {
  timelineBundles_ = std::move(collected.bundles);
  // What each node may hold: its agent's track and its own ranks'.
  for (auto& b : timelineBundles_) {
    if (b.nodeRank < 0 || b.nodeRank >= static_cast<int>(round_.nodeWorkers.size())) continue;
    b.firstRank = 0;
    for (int k = 0; k < b.nodeRank; ++k) b.firstRank += round_.nodeWorkers[k];
    b.ranks = round_.nodeWorkers[b.nodeRank];
  }
  timelineMissing_ = std::move(collected.missing);
}

bool Agent::Impl::timelineAcrossNodes() const {
  return !timelineParts_.empty() && exchange_ && round_.nodeCount > 1 && timelineStore_;
}

void Agent::Impl::onExchange(std::function<void()> job, std::function<void()> then) {
  exchange_->post([this, job = std::move(job), then = std::move(then)] {
    job();
    asio::post(io_, [this, then] { guarded(then); });
  });
}

std::function<void()> Agent::Impl::shipTimeline(
    std::optional<rendezvous::TcpStoreOptions> via) const {
  return [store = via ? *via : *timelineStore_, key = timeline::bundleKey(timelineGroup(), round_.nodeRank),
          bundle = timeline::BundleOptions{.partsDir = timelineParts_, .node = timelineNode_,
                                           .sinceUs = timelineSince_}] {
    timeline::ship(store, key, bundle);
  };
}

void Agent::Impl::leaveAndExit(int code, bool groupStopped) {
  state_ = State::Leaving;
  errorRecord_ = generatedErrorRecord("ddprun received " + signalName(signal_) + ": it stopped "
                                      "its workers and left the job", code);
  if (groupStopped) {
    events::instant("job end", "agent",
                    events::Args().add("exit_code", code).add(
                        "summary", signalName(signal_) + " on this node: it left the job"));
  }
  if (!groupStopped || !timelineAcrossNodes()) {
    leave(code);
    return;
  }
  // The signal stopped this node's running group (a job cancelled on every node gets it on
  // every node at once): the trace gets this node's events up to here, within a short bound
  // (a second signal cuts the wait for the exchange short; the ExchangeThread's join does not
  // outlast it).
  auto store = *timelineStore_;
  store.timeout = store.connectTimeout = kSignalExchangeCall;
  if (!timelineWriter()) {
    // An agent that hosts the store the writer reads (c10d) keeps it up until the writer says
    // it has read the bundles, or at most the writer's own bound.
    const bool hostsStore = handler_->hostedStorePort() != 0;
    onExchange(
        [ship = shipTimeline(store), hostsStore, store, group = timelineGroup()] {
          ship();
          if (hostsStore) {
            timeline::awaitCollected(store, group, kSignalCollectWait + kSignalExchangeCall);
          }
        },
        [this, code] {
          if (state_ == State::Leaving) leave(code);
        });
    return;
  }
  // The writer: the bundles of the nodes that stop now too, waited for at most
  // kSignalCollectWait (a node that goes on is named missing).
  const std::string runId = timelineGroup();
  const int nodes = round_.nodeCount;
  auto collected = std::make_shared<timeline::Collected>();
  onExchange(
      [store, runId, nodes, collected] {
        *collected = timeline::collect(store, runId, nodes, kSignalCollectWait);
      },
      [this, collected, code] {
        if (state_ != State::Leaving) return;
        takeBundles(std::move(*collected));
        leave(code);
      });
}

void Agent::Impl::leave(int code) {
  handler_->asyncLeave(signalName(signal_) + " on this node", [this, code](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        DDPRUN_LOG(WARN, "launcher") << "leaving the job: " << ex.what();
      } catch (...) {
        DDPRUN_LOG(WARN, "launcher") << "leaving the job failed";
      }
    }
    if (state_ == State::Leaving) finish(code);
  });
}

void Agent::Impl::finish(int code) {
  progressWatch_.reset();
  exitCode_ = code;
  state_ = State::Done;
  mergeTimeline();
  // The error files and logs a failure report points to must outlive ddprun (torchrun keeps
  // them too): a temporary run directory is deleted only after a success.
  if (code != 0 && runDir_) runDir_->keep();
  boost::system::error_code ec;
  signals_.cancel(ec);
  io_.stop();
}

void Agent::Impl::fail(std::exception_ptr e) {
  if (!error_) error_ = e;
  if (group_ && group_->runningCount() > 0 && state_ != State::Done) {
    // Stop the workers the usual way (signal, grace, SIGKILL); run() rethrows afterwards.
    if (state_ != State::Stopping) stopGroup(StopReason::Error, SIGTERM);
    stopReason_ = StopReason::Error;
    return;
  }
  finish(1);
}

void Agent::Impl::openTimeline() {
  if (options_.timeline.empty()) return;
  // Parts go next to FILE, in a directory per agent (two agents of the job may share a
  // machine and FILE): it and its workers write one file each.
  timelineParts_ = options_.timeline + ".parts/agent-" + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directories(timelineParts_, ec);
  if (ec) {
    throw ConfigError("--timeline=" + options_.timeline + ": cannot create " + timelineParts_ +
                      ": " + ec.message());
  }
  timelineSince_ = events::nowUs();
  env_[events::kTimelineDirEnv] = timelineParts_;
  const std::string node = options_.localAddr.empty() ? hostName() : options_.localAddr;
  timelineNode_ = "agent " + node;
  events::open(timelineParts_, timelineNode_, "agent");
  // Idle unless the job spans several nodes (it ships and collects their events).
  exchange_ = std::make_unique<timeline::ExchangeThread>();
}

void Agent::Impl::mergeTimeline() {
  if (timelineParts_.empty()) return;
  // On several nodes only node rank 0's agent writes FILE (the others ship their events to it).
  if (timelineAcrossNodes() && !timelineWriter()) return;
  try {
    const auto r = timeline::mergeTimeline({.partsDir = timelineParts_,
                                            .output = options_.timeline,
                                            .sinceUs = timelineSince_,
                                            .bundles = timelineBundles_,
                                            .missingNodes = timelineMissing_});
    DDPRUN_LOG(DEBUG, "launcher") << "timeline: " << r.events << " events of " << r.tracks
                                  << " tracks written to " << options_.timeline
                                  << " (clock offset bound " << r.offsetBoundUs << " us)";
    if (!r.refused.empty()) {
      DDPRUN_LOG(WARN, "launcher") << "timeline: refused " << r.badBundles << " bundle(s) and "
                                   << r.refusedTracks << " track(s) other nodes sent (first: "
                                   << r.refused.front() << "); " << options_.timeline
                                   << " says otherData.refused";
    }
    if (r.partsCut > 0) {
      DDPRUN_LOG(WARN, "launcher") << "timeline: " << r.partsCut
                                   << " part file(s) read only in part (256 MiB a file, 512 MiB "
                                      "in all); " << options_.timeline << " says parts_cut";
    }
  } catch (const std::exception& e) {
    DDPRUN_LOG(WARN, "launcher") << "timeline: " << e.what();
  }
}

Agent::Agent(LaunchOptions options, Environment env, AgentLink* link)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(env), link)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
std::string Agent::errorRecord() const { return impl_->errorRecord(); }

}  // namespace ddprun::launcher
