#pragma once
// Agent::Impl, the agent's state and event handlers, shared by the files that implement it:
//   agent.cpp           the loop: rounds, starting and watching workers, their exits, decisions
//   agent_recovery.cpp  in-process recovery: the deaths, the budget, replace, shrink
//   agent_spares.cpp    the processes that join a running group: grow back, hot spares
//   agent_nodes.cpp     in-process recovery on several nodes (node 0's workers' store via the link)
//   agent_node_loss.cpp a lost node recovered in process (node rank 0's agent)
//   agent_end.cpp       stopping the group, the exit barrier, the end of the job, the timeline
// Private to launcher/ (not installed); the public face is agent.h.
#include "launcher/agent.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <sched.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "launcher/failure_report.h"
#include "launcher/hot_spares.h"
#include "launcher/job_cgroup.h"
#include "launcher/launcher_error_file.h"
#include "launcher/option_values.h"
#include "launcher/progress_watch.h"
#include "launcher/rendezvous_handler.h"
#include "launcher/run_directory.h"
#include "launcher/spare_template.h"
#include "launcher/worker_command.h"
#include "launcher/worker_env.h"
#include "launcher/timeline/exchange.h"
#include "launcher/timeline/merge.h"
#include "launcher/worker_group.h"
#include "launcher/worker_store_link.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/progress_file.h"
#include "base/timeline.h"
#include "rendezvous/grow_record.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/store_server.h"

namespace ddprun::launcher {

namespace asio = boost::asio;
// base/timeline.h: this process's track of the job's timeline (launcher/timeline/ merges them).
namespace events = ddprun::timeline;

// This machine's host name, for the timeline and the progress watch.
inline std::string agentHostName() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

// Generation records on several nodes (agent_nodes.cpp): each node's worker count as
// ddprun/node_workers and a record's nodes= hold it ("2,0,2"), and record g read once it is
// there (bounded: a TimeoutError naming the generation).
std::vector<int> parseCounts(const std::string& text);
std::string awaitRecord(rendezvous::Store& s, int g);
// Node rank 0, a lost node under replace (agent_node_loss.cpp): up to `wanted` ready spares that
// no assignment names yet, of the nodes not in `lost`, node by node from node rank 0.
std::vector<rendezvous::recovery::MovedRank> readySpares(rendezvous::Store& s, int nodes,
                                                         const std::set<int>& lost, int wanted);

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
  // A survivor's collective failed (recovery_keys.h suspectKey): a worker of this group that is
  // dying (base/process.h processDying: a zombie whose status is not exit 0, a SIGKILL pending)
  // is handled now as if its guard had reported its exit, which for a LibTorch process comes
  // tens of ms later (the kernel frees its memory before the parent can reap it).
  void noticeDyingWorkers();
  // Starts the group's --spares once every worker has announced (once per group).
  void maybeStartSpares();
  // Starts one spare; `idle`: under SCHED_IDLE (training is running, hot_spares.h).
  // `idleIfForked`: the priority of a fork of the template when it differs from an exec'd
  // one's (grow back: a fork runs at normal priority, an exec'd one loads in the background).
  void startSpare(bool idle, std::optional<bool> idleIfForked = std::nullopt);
  // A waiting spare's exit: restarted when the group still runs (no restart spent).
  void onSpareExited(const WorkerResult& r);
  // Then, once its ready key was read: another spare, unless it is the third in a row that
  // died before it was ready (`error`: why the key could not be read, for Unknown).
  enum class SpareWas { Ready, NotReady, Unknown };
  void replaceDeadSpare(const WorkerResult& r, SpareWas was, const std::string& error);
  // The spare template (spare_template.h; agent_spare_template.cpp): started with the group's
  // first spares, or alone under shrink without spares (for the replacements that grow the
  // group back); the spares started later are forked from it; its exit makes them exec'd.
  // `idle`: under SCHED_IDLE (alone, in the background of a training that runs).
  void startSpareTemplate(bool idle);
  // Shrink without spares on one node: the template is a fork of local rank 0, made at its
  // init() (worker_runtime/spare/spare_template.h), not a process loading the program again. Returns
  // the template's socket, its end already given to `rank0` (nullptr: not wanted or not
  // possible; then maybeStartSpares() exec's one as before).
  std::unique_ptr<SpareTemplate> templateFromRank(WorkerLaunch& rank0);
  // Closes the group's template's socket (it exits); one forked from a rank, which is this
  // process's child and in no group, is also killed and reaped here.
  void endSpareTemplate();
  // The spares owed since a recovery gave ranks to spares, started once every worker announced
  // the newest generation (the recovery is over: the store is not needed for it any more).
  void startOwedSpares();
  void onSpareTemplateExited(const WorkerResult& r);
  // A spare asked from a loaded template: this loop, which serves the workers' store and sees
  // deaths, must not wait for the answer (a fork at idle priority waits for CPU time the ranks
  // leave; a grow back's replacement is asked while the survivors re-form through the store).
  // queueFork() asks, one request at a time (a spare asked while one is being forked
  // queues behind it); onForkAnswer() adds the spare to the group once the socket is readable
  // or its bound is over (kAnswerTimeout; an idle fork's kIdleAnswerTimeout unless the template
  // is stopped: then, or on any refusal, the spare is exec'd, as spareSpawner() does).
  // endSpareTemplate() drops what is queued, and so does sendNextFork() once the group stops:
  // the group it was for is over.
  void queueFork(WorkerLaunch l, int id, bool idle);
  // The line of spare `id` exec'd instead of forked: why, and once, that the template is gone
  // (`wasGone`: it was before this spare was asked).
  void sayExecd(int id, const std::string& why, bool wasGone);
  void sendNextFork();
  void onForkAnswer(uint64_t epoch);
  // The bound of the fork request `epoch`: checked every kAnswerTimeout while the answer may
  // still come (SpareTemplate::answerMayStillCome), then onForkAnswer().
  void armForkTimer(std::shared_ptr<asio::posix::stream_descriptor> readable,
                    std::shared_ptr<asio::steady_timer> timer, uint64_t epoch);
  // Spares being forked, counted with the waiting ones wherever the agent decides how many
  // to start.
  int sparesForking() const { return static_cast<int>(forkQueue_.size()); }
  // How startSpare() starts spare `id`: a fork of the template, or empty (spawnGuarded).
  std::function<GuardedProcess(const SpawnRequest&)> spareSpawner(int id,
                                                                  std::optional<bool> idleIfForked);
  // The pid of the group's running spare template (its process, once started), or -1: what
  // moves it in or out of SCHED_IDLE (hot_spares.h) acts on.
  pid_t runningTemplatePid() const;
  // The pid of a waiting spare to give a dead rank to (a ready one first, else the one started
  // first), or -1. Ready: its key in the workers' store where this agent hosts it, else in
  // sparesSeenReady_.
  pid_t pickSpare(int& id);
  // Several nodes, an agent without the store: the waiting spares whose ready keys a recovery
  // reads over the link before pickSpare (in start order), empty when the choice needs none
  // (fewer than two to choose from, or one already seen ready).
  std::vector<int> spareReadyKeysToRead() const;
  // Whether pickSpare would find a spare to take a rank now (one waiting and exec'd: a spare
  // being forked from the template has no pid yet).
  bool spareToPick() const;
  // The agent runs its group and at least one worker of it lives: the condition for starting
  // spares or adding them to the group (not while it stops, ends or restarts).
  bool groupRunning() const {
    return state_ == State::Running && group_ && group_->runningCount() > 0;
  }
  // Whether waiting spare `spareId` has set its ready key (it has loaded).
  bool spareReady(int spareId) const;
  // The waiting spares that are loaded (ready key set) and not exiting.
  int loadedSpares() const;
  // --recovery-policy=shrink on one node: whether loaded spares take the dead ranks at once
  // instead (agent_recovery.cpp; logs why when they do).
  bool sparesTakeShrink(const std::vector<WorkerResult>& dead) const;
  void onWorkerStarted(const WorkerResult& r);
  // Moves the waiting spares out of SCHED_IDLE (before they are stopped).
  void unidleSpares();
  std::string progressTablePath() const;
  // --stall-warning / --peer-timeout over the group's workers as they are now.
  void watchProgress();
  void onWorkerExited(const WorkerResult& r);
  // In-process recovery (docs/recovery.md): whether the deaths `dead` (one recovery) can be
  // healed without stopping the others, then the budget, then the replacements or the shrink,
  // and the new generation. Several deaths are one recovery (agent_recovery.cpp).
  bool canRecoverInProcess(const std::vector<WorkerResult>& dead);
  // How the refusal of an in-process recovery is introduced ("--recovery=in-process", or auto
  // when it had chosen in-process for this group), or "" when it was not in effect (auto with a
  // program without the runtime: a restart is then the job's plain semantics, said by no line).
  std::string inProcessInEffect(const std::vector<WorkerResult>& dead) const;
  // "--recovery=in-process"; under auto, the same for auto when `autoChose` (else ""); "" under
  // restart.
  std::string recoveryMode(bool autoChose) const;
  void recoverInProcess(const WorkerResult& r);
  // A death reported while the budget decision of a recovery is pending: recovered with it.
  void addPendingDeath(const WorkerResult& r);
  void onRecoveryDecision(std::vector<WorkerResult> dead, const JobDecision& d);
  // The budget decision, acted on once no running worker's exit is still unreported (its
  // process gone, its guard's report not read yet), or after kExitReportWait.
  void afterExitReports(std::exception_ptr e, JobDecision d,
                        std::chrono::steady_clock::time_point until);
  bool exitUnreported() const;
  static constexpr std::chrono::milliseconds kExitReportWait{200};
  // Every dead rank is taken by a waiting spare or a new process; world size and ranks stay.
  void replaceWorkers(const std::vector<WorkerResult>& dead, const JobDecision& d);
  // --recovery-policy=shrink: the survivors go on without `dead`, renumbered densely.
  // `budgetSpent`: the deaths spent a restart (d.restartCount); a replacement that died before
  // it healed spends none.
  void shrinkGroup(const std::vector<WorkerResult>& dead, const JobDecision& d,
                   bool budgetSpent = true);
  // What replace and shrink share: the generation record in the workers' store, the `recovery`
  // event and the log line naming every dead rank ("...; recovering in process (generation g):
  // <what> (restart n of m spent)").
  void publishGeneration(const rendezvous::recovery::GenerationRecord& record,
                         const std::vector<WorkerResult>& dead, const std::string& what,
                         const JobDecision& d, bool budgetSpent = true);
  // The record's cause: "rank r (pid p) failed: ..." for each, joined by "; ".
  std::string deathCause(const std::vector<WorkerResult>& dead) const;
  // ---- Grow back (--recovery-policy=shrink, docs/recovery.md#grow-back) ----
  // Whether a shrunk group may take replacements back in; else `why`.
  bool growBackUsable(std::string& why) const;
  // Starts a replacement for each rank the group lacks and that no waiting or forking one
  // stands for: a fork of a loaded template, asked at the shrink itself (shrinkGroup), else a
  // hot spare in the background (SCHED_IDLE), once the survivors re-formed (tryGrow).
  void startReplacements();
  // Grow back with a spare template still loading: true while the replacement waits for it
  // (a fork once it is loaded; up to kTemplateLoadWait, polled in 5 ms turns through
  // tryGrow), rather than exec'ing a second load beside it. The first wait takes the template
  // out of SCHED_IDLE: the group trains one rank short until it is loaded.
  bool waitForSpareTemplate();
  static constexpr std::chrono::seconds kTemplateLoadWait{5};
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
  // ---- Several nodes (agent_nodes.cpp, docs/recovery.md#several-nodes) ----
  // In-process recovery across nodes is on: the agent store, several nodes, recovery not
  // `restart` (the link is then wanted, opened or not yet).
  bool acrossNodes() const;
  // A new group: whether it wants a link to the workers' store (several nodes), and opens it
  // at once only when nothing will say that the workers run the runtime (no progress table).
  // Otherwise the link opens on first use (storeLink()): when the progress watch first sees a
  // worker of this node beat or step (ProgressWatch::Options::onFirstSign), or a spare, a
  // death or a recovery needs it. No generation can be written before every rank announced,
  // which needs the runtime, whose heartbeat starts first thing in init(); and a late link's
  // follower reads the records from generation 1, so nothing is missed. A program without
  // the runtime (`true`, a shell, a Python script) thus costs node 0 no connection and this
  // agent no thread: at 256 nodes, 512 connections and 512 threads less at the round's start.
  void openStoreLink();
  // Node rank 0 of several nodes, when a lost node's shrink or the timeline needs them: each
  // node's worker count (round_.nodeWorkers, nodeCounts_, and ddprun/node_workers in the
  // workers' store), from the round or read after the workers start (asyncNodeWorkers: O(N),
  // off the start's path). Until they arrive a lost node re-forms the round (onNodeLost).
  void learnNodeWorkers();
  void takeNodeWorkers(std::vector<int> counts);
  // This group's link, opened now if it is not yet; only when acrossNodes().
  WorkerStoreLink& storeLink();
  // The record of generation g, as the link's follower read it: a shrink renumbers this node's
  // workers. In order, every generation once, its own too.
  void onGenerationRecord(int g, const std::string& text);
  // canRecoverInProcess for several nodes: reads the announcements off this thread, then
  // recoverInProcess(r) or stops the group.
  void checkAcrossNodes(const WorkerResult& r);
  void replaceAcross(const WorkerResult& r, const JobDecision& d);
  void shrinkAcross(const WorkerResult& r, const JobDecision& d);
  void failAcross(const WorkerResult& r, const std::string& error);
  // Node rank 0: another node was lost (its agent gone) and the round goes on
  // (docs/recovery.md#a-lost-node). Under shrink, once the survivors hold the state and at
  // least the job's minimum of ranks is left: spends a restart and publishes a generation
  // without the node's ranks; otherwise the round is re-formed without it (restart semantics,
  // one line saying why).
  void onNodeLost(const JobDecision& d);
  void shrinkLostNode(int node, const std::string& cause, const JobDecision& d);
  // Under replace with --spares: `ranks` (the lost node's) are taken by `takers`, ready spares of
  // other nodes (readySpares), named in one generation record (GenerationRecord::moved).
  void replaceLostNode(int node, const std::string& cause, const JobDecision& d,
                       const std::vector<int>& ranks,
                       const std::vector<rendezvous::recovery::MovedRank>& takers);
  // Every agent, following the records: a record names this node's spare `spareId` to take a
  // lost node's rank; it gets the slot after this node's own and its assignment. A spare that
  // is gone meanwhile restarts the group (failAcross).
  void takeMovedRank(int g, int rank, int spareId, const std::string& cause);
  // Several nodes, --spares: this node's waiting spares as ddprun/node_spares/<node rank>, in
  // the workers' store (for node rank 0's readySpares), whenever they change.
  void publishSpares();
  // After the link wrote (or failed to write) a lost node's generation record: true when this
  // group still runs and the record is out; on `error` the round is re-formed without the node.
  bool nodeLossPublished(int node, int epoch, const std::string& error);
  // `spent`: a restart was spent for it already (its generation could not be published).
  void reformWithoutNode(const std::string& what, const std::string& why, bool spent = false);
  // --spares on several nodes: once this node's workers announced (read by the link), the
  // spares of this group start. A spare's id is unique in the job: n x nodes + node rank.
  void startSparesAcross();
  // --peer-timeout: the worker stopped beating (progress_watch.h); kill it, a failure.
  void onWorkerSilent(const ProgressWatch::Worker& w, long pid, double silentSeconds);
  void onHandlerDecision(const JobDecision& d);
  // This node declared the rendezvous store lost while its workers were not running (joining a
  // round, stopping the group, the exit barrier): agent_end.cpp.
  void onStoreLostNotRunning(const JobDecision& d);
  // Once this node has declared the store lost (handler_->storeLost(); the protocol printed one
  // line naming the store and why), it starts no workers and joins no round: one line saying
  // `what` it does not do, and the job ends here with exit 1. False while the store is not lost.
  bool endIfStoreLost(const std::string& what);
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
  // The job's progress table, from the first workers' start (progressTablePath()).
  mutable std::unique_ptr<progress::ProgressTable> progressTable_;
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
  // The deaths that pending decision recovers together (one generation, one restart), and the
  // pids of deaths taken into a recovery before their exits were reported (processDying):
  // their exits, when they come, are no new failure.
  std::vector<WorkerResult> pendingDeaths_;
  std::vector<pid_t> recoveredEarly_;
  int recoveryRestarts_ = 0;  // the job's restarts spent after this round's last recovery
  std::optional<JobDecision> decidedFailure_;
  // Several nodes: this round's in-process recovery spent a restart and then failed (failAcross,
  // or no survivor could heal), so the report that ends the round spends none
  // (asyncReportFailedRecovery): one failure, one restart.
  bool recoverySpentRestart_ = false;
  // Hot spares: ids are unique in the job (their store keys are too); the group's spares have
  // started; spares that died before they were ready, in a row, each as "spare <n> (pid P):
  // <cause>" (3: no more for this group; a ready spare's death clears it).
  int nextSpareId_ = 0;
  bool sparesStarted_ = false;
  // Shrink without spares: the spare template was started alone, for grow back's replacements.
  bool growTemplateStarted_ = false;
  // Grow back waiting for the template to load (waitForSpareTemplate): since when; a poll armed;
  // given up (it did not load in kTemplateLoadWait: replacements are exec'd for this group).
  std::optional<std::chrono::steady_clock::time_point> templateWaitSince_;
  bool templatePollArmed_ = false;
  uint64_t templatePollEpoch_ = 0;  // one per group
  bool templateWaitOver_ = false;
  std::vector<std::string> sparesDiedUnready_;
  // Several nodes, an agent that does not host the workers' store: the ids of its spares whose
  // ready key it has read set (a set key stays set; pickSpare prefers them). Read in the same
  // link job as a recovery's generation number (replaceAcross), never on the I/O thread.
  std::set<int> sparesSeenReady_;
  bool sparesNoted_ = false;     // the line saying spares cannot be used was printed
  bool singleRankNoted_ = false; // the line saying a single rank is not recovered in process
  int idleSpares_ = -1;          // -1: not decided; 0: spares start at normal priority; 1: idle
  // The group's spare template (none: not started, or gone); off for the job (DDPRUN_SPARE_TEMPLATE=0,
  // or this process cannot be a child subreaper).
  std::unique_ptr<SpareTemplate> spareTemplate_;
  int sparesOwed_ = 0;
  struct QueuedFork {
    WorkerLaunch launch;
    int id = -1;
    bool idle = true;  // the template forks it under SCHED_IDLE
  };
  std::deque<QueuedFork> forkQueue_;  // the front one is asked when forkAsked_
  bool forkAsked_ = false;
  uint64_t forkEpoch_ = 0;  // an answer's handlers (socket, timer) armed before it do nothing
  bool spareTemplateOff_ = false;
  bool templateFromRank_ = false;  // spareTemplate_ is a fork of local rank 0 (not a worker)
  // Grow back: the replacement joining now (-1: none), its rank and the generation it joins;
  // grow back given up for this group (a replacement died before it healed).
  pid_t growPid_ = -1;
  pid_t growFinishedPid_ = -1;  // a replacement stopped because the others finished first
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
  // Several nodes: the link to the workers' store (node rank 0's), its epoch (a callback of an
  // older group's link is dropped), each node's worker count and the world size as of
  // generation_ (which the link's follower advances), the generations this agent wrote, and
  // the dead worker of the recovery under way (its rank in deathGeneration_, the counts then).
  std::unique_ptr<WorkerStoreLink> storeLink_;
  bool linkWanted_ = false;  // several nodes, the agent store, recovery not `restart`
  int linkEpoch_ = 0;
  std::vector<int> nodeCounts_;
  int worldNow_ = 0;
  std::set<int> ownGenerations_;
  bool nodeLossPending_ = false;  // node rank 0: a lost node's recovery is under way
  // Under replace: the nodes lost in process so far (node rank 0, the writer: their spares are
  // gone), and every rank that moved to another node's spare (rank -> node), from the records.
  std::set<int> lostNodes_;
  std::map<int, int> movedTo_;
  int deathRank_ = -1;
  int deathGeneration_ = 0;
  std::vector<int> deathCounts_;
  // Last member: destroyed (its queue run, its thread joined) while io_ is still alive.
  std::unique_ptr<timeline::ExchangeThread> exchange_;
};

}  // namespace ddprun::launcher
