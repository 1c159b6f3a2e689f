// The Runtime after init(), under in-process recovery (docs/recovery.md): the watch of the
// launcher's next generation (a grow back noticed at a commit), the wait for a generation after
// a peer's death, the shrink and grow records applied to this rank, the re-form on a new
// communicator, and the shutdown. init() and a spare's wait for a rank are in runtime.cpp; what
// both use is runtime_internal.h.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "base/timeline.h"
#include "rendezvous/grow_record.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/tcp_store.h"
#include "worker_runtime/runtime.h"
#include "worker_runtime/runtime_internal.h"
#include "worker_runtime/traced_communicator.h"

namespace ddprun::runtime {

using detail::applyGrow;
using detail::connectAgentStore;
using detail::inProcessRecoveryWanted;
using detail::makeCommunicator;
using detail::recoveryTimeoutFrom;
using detail::timeoutFrom;
using rendezvous::TcpStore;

// Runtime::watchNextGeneration()'s thread (runtime.h says why it exists). One connection and one
// thread for the process's life: the connection is made once, by the caller's thread, outside
// any recovery; reform() re-targets the watch without a round trip or a join (the WAIT in
// progress is cancelled on the server, TcpStore::setWaitsCancelled, and the thread waits for the
// new key). The destructor interrupts the WAIT in progress and joins.
class Runtime::GenerationWatch {
 public:
  GenerationWatch(std::shared_ptr<TcpStore> connection, int restartCount, int next,
                  std::shared_ptr<std::atomic<bool>> published)
      : tcp_(std::move(connection)), published_(std::move(published)), next_(next) {
    thread_ = std::thread([this, restartCount] { run(restartCount); });
  }
  ~GenerationWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    tcp_->interrupt();
    thread_.join();
  }
  GenerationWatch(const GenerationWatch&) = delete;
  GenerationWatch& operator=(const GenerationWatch&) = delete;

  // Watch generation `next` from now on; the flag is cleared. Never blocks on the store.
  void retarget(int next) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      next_ = next;
      published_->store(false, std::memory_order_relaxed);
    }
    tcp_->setWaitsCancelled(true);  // the WAIT for the old key ends; the thread takes the new
    cv_.notify_all();
  }

 private:
  void run(int restartCount) {
    namespace keys = rendezvous::recovery;
    rendezvous::PrefixStore store(keys::attemptPrefix(restartCount), tcp_);
    int seen = -1;  // the generation whose key was seen last
    for (;;) {
      int next = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || next_ != seen; });
        if (stopping_) return;
        next = next_;
        tcp_->setWaitsCancelled(false);
      }
      try {
        store.wait({keys::generationKey(next)}, Millis(60'000));
        std::lock_guard<std::mutex> lock(mu_);
        if (next_ == next) {
          published_->store(true, std::memory_order_relaxed);
          seen = next;
        }
      } catch (const TimeoutError&) {
        // A round ended, or retarget() cancelled the WAIT: look at the target again.
      } catch (const std::exception& e) {
        // Stopped (interrupted), or the store went away (the job ends or fails, which the
        // collectives report): nothing is thrown out of the thread.
        std::lock_guard<std::mutex> lock(mu_);
        if (!stopping_) {
          DDPRUN_LOG(DEBUG, "runtime") << "the watch of generation " << next << " ended: "
                                       << e.what();
        }
        return;
      }
    }
  }

  std::shared_ptr<TcpStore> tcp_;
  std::shared_ptr<std::atomic<bool>> published_;
  std::mutex mu_;
  std::condition_variable cv_;
  int next_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

Runtime::Runtime(WorkerEnv env, std::shared_ptr<rendezvous::Store> store,
                 std::shared_ptr<Communicator> comm, std::shared_ptr<void> hostedStore,
                 InitOptions options, int generation)
    : env_(std::move(env)),
      store_(std::move(store)),
      comm_(std::move(comm)),
      hostedStore_(std::move(hostedStore)),
      options_(std::move(options)),
      generation_(generation) {}

bool Runtime::inProcessRecovery() const {
  return inProcessRecoveryWanted(env_, options_) && store_;
}

Millis Runtime::recoveryTimeout() const { return recoveryTimeoutFrom(options_); }

int Runtime::awaitNextGeneration(Millis bound) {
  namespace keys = rendezvous::recovery;
  int g = generation_ + 1;
  try {
    store_->wait({keys::generationKey(g)}, bound);
  } catch (const TimeoutError&) {
    throw TimeoutError("rank " + std::to_string(env_.rank) + " waited " +
                       std::to_string(bound.count() / 1000.0).substr(0, 5) +
                       " s (DDPRUN_RECOVERY_TIMEOUT) for the launcher's generation " +
                       std::to_string(g) + " of the group, and none came: the launcher is "
                       "restarting the group (a restart, not an in-process recovery), or it is "
                       "not ddprun --recovery=in-process|auto");
  }
  // Two deaths in a row: go straight to the newest generation.
  while (store_->check({keys::generationKey(g + 1)})) ++g;
  return g;
}

std::string Runtime::generationCause(int g) const {
  const auto it = causes_.find(g);
  return it != causes_.end() ? it->second : std::string();
}

void Runtime::applyShrinks(int g) {
  namespace keys = rendezvous::recovery;
  // A reform that failed after this (a death during the recovery) has applied some already.
  for (int next = std::max(generation_, shrunkUpTo_) + 1; next <= g; ++next) {
    const auto text = store_->get(keys::generationKey(next));
    if (rendezvous::recovery::isGrowRecord(text)) {
      causes_[next] = applyGrow(env_, text, next);
      shrunkUpTo_ = next;
      continue;
    }
    const auto record = keys::parseGenerationRecord(text);
    if (!record) {
      throw BackendError("in-process recovery: the launcher's record of generation " +
                         std::to_string(next) + " is not one this runtime reads: '" +
                         text.substr(0, 120) + "'");
    }
    causes_[next] = record->cause;
    if (record->removed.empty()) {
      // replace: ranks and world size stay; a lost node's rank moved to another node's spare
      // ends the node placement for good (WorkerEnv::ranksOffNode).
      if (!record->moved.empty()) env_.ranksOffNode = true;
      continue;
    }
    const int rank = keys::shrinkRank(env_.rank, record->removed);
    if (rank < 0) {
      // The launcher counts this process as gone (it was silent past --peer-timeout and is
      // being killed): it is in no rank any more.
      throw Error("rank " + std::to_string(env_.rank) + " was removed from the group in "
                  "generation " + std::to_string(next) + " (" + record->cause + ")");
    }
    const int offset = env_.rank - env_.localRank;  // one node: 0
    DDPRUN_CHECK(record->worldSize == env_.worldSize - static_cast<int>(record->removed.size()),
                 "generation " << next << " has world size " << record->worldSize << ", "
                               << env_.worldSize << " - " << record->removed.size() << " expected");
    if (homeNode_ < 0) homeNode_ = env_.groupRank;
    if (!record->nodes.empty()) {
      // Several nodes: the ranks stay in node order; this node's count and those before it
      // give the local rank, the nodes that still have workers the node rank.
      const auto& counts = record->nodes;
      if (homeNode_ >= static_cast<int>(counts.size())) {
        throw BackendError("in-process recovery: generation " + std::to_string(next) +
                           "'s record names " + std::to_string(counts.size()) +
                           " node(s), this process runs on node " + std::to_string(homeNode_));
      }
      int before = 0, nodeRank = 0, nodes = 0;
      for (int n = 0; n < static_cast<int>(counts.size()); ++n) {
        if (n < homeNode_) {
          before += counts[static_cast<size_t>(n)];
          if (counts[static_cast<size_t>(n)] > 0) ++nodeRank;
        }
        if (counts[static_cast<size_t>(n)] > 0) ++nodes;
      }
      env_.rank = rank;
      env_.localRank = rank - before;
      env_.localWorldSize = counts[static_cast<size_t>(homeNode_)];
      env_.groupRank = nodeRank;
      env_.groupWorldSize = nodes;
      env_.worldSize = record->worldSize;
      DDPRUN_CHECK(env_.localRank >= 0 && env_.localRank < env_.localWorldSize,
                   "generation " << next << ": rank " << rank << " is not on node " << homeNode_);
      log::setIdentity("rank " + std::to_string(env_.rank));
      shrunkUpTo_ = next;
      continue;
    }
    env_.rank = rank;
    env_.localRank = rank - offset;
    env_.worldSize = record->worldSize;
    env_.localWorldSize = record->worldSize;  // in-process recovery runs on one node
    log::setIdentity("rank " + std::to_string(env_.rank));
    shrunkUpTo_ = next;
  }
  shrunkUpTo_ = std::max(shrunkUpTo_, g);
}

void Runtime::reform(int g) {
  DDPRUN_CHECK(g > generation_, "reform() goes to a newer generation");
  const int64_t start = ddprun::timeline::nowUs();
  const ddprun::timeline::FaultCount faults;
  // From here the flag says whether a generation after g was published (a death during this
  // re-form): one that g itself set must not end the commit that follows the heal.
  if (watch_) watch_->retarget(g + 1);
  if (comm_) comm_->abort();
  // The old communicator lives on as long as something (DDP) holds it; it is broken.
  comm_.reset();
  // --recovery-policy=shrink: this survivor's rank and the world size of generation g.
  applyShrinks(g);
  auto comm = makeCommunicator(env_, store_, options_, g);
  ddprun::timeline::span("communicator setup", "runtime", start, ddprun::timeline::nowUs() - start,
                         faults.addTo(ddprun::timeline::Args()
                                          .add("backend", comm->backend())
                                          .add("world_size", env_.worldSize)
                                          .add("generation", g)));
  if (ddprun::timeline::enabled()) {
    const auto group = options_.env("DDPRUN_TIMELINE_GROUP");
    comm = makeTracedCommunicator(
        std::move(comm), (group ? *group : "attempt " + std::to_string(env_.restartCount)) +
                             " gen " + std::to_string(g));
  }
  comm_ = std::move(comm);
  generation_ = g;
}

void Runtime::joinNewestGeneration(std::string why) {
  namespace keys = rendezvous::recovery;
  for (;;) {
    int g = generation_ + 1;
    while (store_->check({keys::generationKey(g + 1)})) ++g;
    DDPRUN_LOG(INFO, "runtime") << "rank " << env_.rank << ": generation " << generation_
                                << " was superseded before this process joined it (" << why
                                << "): joining generation " << g;
    try {
      reform(g);
      return;
    } catch (const BackendError& e) {
      if (!store_->check({keys::generationKey(g + 1)})) throw;
      why = e.what();
    }
  }
}

void Runtime::watchNextGeneration() {
  if (watching_ || !store_) return;
  watching_ = true;  // tried once: a failure is not retried at every call
  generationPublished_->store(false, std::memory_order_relaxed);
  try {
    auto connection = std::dynamic_pointer_cast<TcpStore>(
        watchConnection_ ? std::move(watchConnection_)
                         : connectAgentStore(env_, timeoutFrom(options_), options_.env));
    if (!connection) throw Error("the agent's store is not reached over TCP");
    watch_ = std::make_unique<GenerationWatch>(std::move(connection), env_.restartCount,
                                               generation_ + 1, generationPublished_);
  } catch (const std::exception& e) {
    // No watch: a grow back is then noticed by no one, and waits for the next recovery.
    DDPRUN_LOG(WARN, "runtime") << "rank " << env_.rank << ": no watch of the launcher's next "
                                << "generation (grow back at a commit): " << e.what();
  }
}

void Runtime::setWatchConnection(std::shared_ptr<rendezvous::Store> connection) {
  if (!watching_) watchConnection_ = std::move(connection);
}

void Runtime::stopWatch() { watch_.reset(); }

void Runtime::announceState() {
  if (!store_) return;
  store_->set(rendezvous::recovery::announceKey(env_.rank), std::to_string(generation_));
}

void Runtime::reportCollectiveFailure() noexcept {
  if (!store_) return;
  try {
    store_->set(rendezvous::recovery::suspectKey(env_.rank), std::to_string(generation_));
  } catch (const std::exception& e) {
    DDPRUN_LOG(DEBUG, "runtime") << "rank " << env_.rank << ": could not tell the agent that a "
                                 << "collective failed: " << e.what();
  }
}

Runtime::~Runtime() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    DDPRUN_LOG(WARN, "runtime") << "shutdown: " << e.what();
  }
}

void Runtime::shutdown() {
  if (shutDown_) return;
  shutDown_ = true;
  stopWatch();
  comm_.reset();
  if (!store_) return;
  const std::string key = "ddprun/finished/" + std::to_string(env_.rank);
  store_->set(key, "1");
  if (hostedStore_) {
    // Keep serving until every rank has left, so nobody loses the store mid-call; bounded, in
    // case a rank died (the launcher then stops us anyway).
    std::vector<std::string> keys;
    for (int r = 0; r < env_.worldSize; ++r) keys.push_back("ddprun/finished/" + std::to_string(r));
    try {
      store_->wait(keys, std::min<Millis>(store_->timeout(), Millis(300'000)));
    } catch (const TimeoutError& e) {
      DDPRUN_LOG(WARN, "runtime") << "not every rank finished; closing the store anyway";
    }
  }
  store_.reset();
  hostedStore_.reset();
}

}  // namespace ddprun::runtime
