#pragma once
// Heartbeats: how the nodes of a job learn, without polling, that one of them is gone.
//
// Writing: every agent bumps the counter `hb/<id>` every `interval` and creates the key
// `hb/<id>/<k>` for its k-th beat (older beats are deleted). The first beat is written before
// the agent joins a round, so every node a state mentions has beaten at least once.
//
// Watching: the nodes a state mentions, sorted by id, form a ring; each agent watches only
// its successor, by WAITing for that node's next beat key with a timeout of
// interval x missedBeats. When the wait times out and the counter has not moved, the node is
// evicted (transition::remove, a compare-set on the state log), which opens a new round for
// the survivors. One WAIT per node, whatever the size of the job. A node evicted by mistake
// (a long pause) sees the new round without it and joins again.
// One watcher finds one dead node per keep-alive bound: where many may be gone at once and
// the state does not re-form (the exit barrier, the store host's close), the waiting agent
// judges them all in one pass instead (silent_members.h).
//
// Both run on threads of their own, each with its own store connection; failures of the
// store are handed to `onError` (never thrown on the thread). The writer makes its connection
// at its second beat, one interval after the first (written on the agent's own connection), not
// at the agent's start: a job's agents start together, and a connect, a handshake and an
// accept less on each and on the store's thread while the round forms is time off the join
// (docs/rendezvous.md, what bounds the agents' start). That connect is bounded like a beat.
//
// A store that stops answering (its process SIGSTOPped or hung: the kernel still accepts
// connections for it, nothing replies) is found by the writer within the keep-alive bound,
// interval x missedBeats, counted from the store's last answer: every call of a beat is bounded
// by what is left of it (at least one interval), and the time this agent itself did not run (a
// wait between beats that ended late: SIGSTOP, a frozen VM) is not counted, so that a pause of
// this agent is not taken for the store's. onError then gets a NetworkError saying that the
// store stopped answering and for how long, which is what every agent of the job reports -- but
// the agent that hosts the store in process (HeartbeatOptions::ownStoreBound): it leaves that
// judgment to the others. HeartbeatRing puts the two together as the Liveness of the TCP store
// backend (liveness.h); once the store is declared lost, its monitor is halted (haltWatching):
// a node that may be the one cut off evicts nobody.
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "rendezvous/liveness.h"
#include "rendezvous/state_log.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

struct HeartbeatOptions {
  Millis interval{5'000};
  int missedBeats = 3;
  Millis timeout() const { return interval * missedBeats; }
  // > 0: this agent hosts the store in process (ThreadedStoreServer), and its writer does not
  // judge that store's silence -- the other agents' writers do, by the keep-alive bound. A
  // host's beats are late only when its own store thread is (starved of CPU, stopped), which
  // the others see as well; the host declaring itself lost for it cost the job its store host
  // (docs/rendezvous.md, "The store host's own heartbeat"). Each call of a beat is bounded by
  // this instead (read_timeout), and the store is declared lost after two beats failed in a row.
  Millis ownStoreBound{0};
};

std::string heartbeatCounterKey(const std::string& id);
std::string heartbeatKey(const std::string& id, int64_t beat);

// A beat counter's value as a count: ADD's decimal text, nothing else (pure; nullopt for any
// other bytes). Only its owner adds to a counter, but any client of a store without a token can
// write one (docs/security.md): what reads a counter must not trust it to parse.
std::optional<int64_t> beatCount(std::string_view value);
// The line that names a forged counter: "rendezvous key 'hb/<id>' holds '<value>', which is
// corrupt or forged (<why>)", the value cut at 64 bytes (log lines escape control bytes).
std::string forgedCounter(const std::string& key, std::string_view value, const std::string& why);

// The node a member of `ids` (sorted) watches: the next one around the ring; empty when alone.
std::string ringSuccessor(const std::vector<std::string>& ids, const std::string& self);

// A connection for the heartbeat writer that connects at its first call, and whose connect,
// handshake and calls are bounded by `within` (the keep-alive bound left), so that a store
// stopped before the writer's first connect is found within that bound too, and stop() can cut
// the connect short (interrupt).
using BoundedConnectFn = std::function<InterruptibleStore(Millis within)>;

class HeartbeatWriter {
 public:
  using ErrorFn = std::function<void(std::exception_ptr)>;
  // Writes the first beat on `first` before returning (throws when the store is unreachable);
  // later beats go over a connection of the writer's own, made on its thread at the second
  // beat (one interval later) and bounded like a beat: a failure to connect is a failed beat.
  HeartbeatWriter(BoundedConnectFn connect, Store& first, std::string id,
                  HeartbeatOptions options, ErrorFn onError);
  ~HeartbeatWriter();
  // Stops beating; with `clear`, deletes this node's beat keys (a clean leave).
  void stop(bool clear);

 private:
  void beat(Store& store);
  // After a failed beat: the store refuses an ADD on a counter that is not a decimal integer, or
  // that would overflow, by closing the connection, which is not the store's failure. Reads this
  // node's counter; when it is such a value, restores it to the last beat (one warning naming the
  // key and the value) and returns true. Throws what the store throws.
  bool restoreIfForged(Store& store);
  void run();

  BoundedConnectFn connect_;
  std::string id_;
  HeartbeatOptions options_;
  ErrorFn onError_;
  int64_t last_ = 0;
  Clock::time_point lastAnswer_;  // when the store last answered a beat (writer thread)
  std::mutex mu_;  // guards stopping_ and conn_ (set once, by the writer's thread)
  std::condition_variable cv_;
  bool stopping_ = false;
  InterruptibleStore conn_;
  std::thread thread_;
};

class HeartbeatMonitor {
 public:
  using ErrorFn = std::function<void(std::exception_ptr)>;
  // Connects on its own thread. Registers on `view`: when the state changes, the WAIT in
  // progress is cut short, so the ring is re-read at once -- a node that must now be watched
  // is watched from that moment, not after the old target's next beat. On the ddprun store
  // by CANCEL_WAIT (cancelWaits: the connection is kept, and any WAIT started before the ring
  // is read again ends at once too); elsewhere by cutting the call in progress (cancelCall: the
  // next call reconnects; a change landing between two calls is seen before the next WAIT, or
  // after the next beat).
  // `spill`: its evictions write versions with spilled lists, as the agents' (state_log.h).
  HeartbeatMonitor(ConnectFn connect, std::string self, HeartbeatOptions options,
                   JobLimits limits, StateView& view, ErrorFn onError, bool spill = false);
  ~HeartbeatMonitor();
  void stop();
  // Liveness::haltWatching: stops watching and evicting without joining (any thread).
  void halt();

 private:
  void run();
  // Watches `target` until it dies (returns true) or the ring changes (false); `cancels` is
  // cancelCount() when the ring was read: a WAIT that ends after it moved was cancelled.
  bool watch(const std::string& target, int64_t seenVersion, uint64_t cancels);
  // `target`'s beat count, read without ADD (an ADD on a forged counter would close this
  // connection, taken for the store's failure): 0 when missing (it left) or forged (it has not
  // beaten, as far as anyone can tell; its owner restores it at its next beat, with a warning
  // that this reader repeats once per forged value).
  int64_t beatOf(const std::string& target);
  void evict(const std::string& target);
  void onViewChange();
  uint64_t cancelCount();
  // Lets WAITs run again (after a state change cancelled them) and returns cancelCount(), in
  // one critical section: called before the ring is read.
  uint64_t rearm();
  Store& store() { return *conn_.store; }

  ConnectFn connect_;
  std::string self_;
  HeartbeatOptions options_;
  JobLimits limits_;
  bool spill_ = false;
  StateView& view_;
  ErrorFn onError_;
  std::mutex connMu_;  // conn_ is set once by the monitor's thread, cut short by others
  InterruptibleStore conn_;
  std::atomic<bool> stopping_{false};  // halt() or stop()
  std::atomic<bool> stopped_{false};   // stop(): the view's callback removed
  uint64_t cancels_ = 0;  // calls cut short by state changes so far (guarded by connMu_)
  std::string warnedForged_;  // the forged counter value last warned about (monitor thread)
  std::thread thread_;
};

// The Liveness of a ddprun store: a HeartbeatWriter and a HeartbeatMonitor.
class HeartbeatRing final : public Liveness {
 public:
  // `writerConnect`: the writer's own connection (the backend's, bounded: BoundedConnectFn).
  HeartbeatRing(const LivenessContext& ctx, HeartbeatOptions options,
                BoundedConnectFn writerConnect);
  void stopWatching() override { monitor_->stop(); }
  void haltWatching() override { monitor_->halt(); }
  void stop(bool withdraw) override {
    monitor_->stop();
    writer_->stop(withdraw);
  }

 private:
  std::unique_ptr<HeartbeatWriter> writer_;
  std::unique_ptr<HeartbeatMonitor> monitor_;
};

}  // namespace ddprun::rendezvous
