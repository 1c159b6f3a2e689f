#pragma once
// SilentMembers: which of many nodes have stopped beating, judged in one pass (issue 20).
//
// The heartbeat ring (heartbeat.h) has each agent watch one node, its successor: when many
// nodes are gone at once (agents that declared the store lost exit without telling anyone), the
// ring evicts them one keep-alive bound after another, each eviction re-targeting the watcher
// at the next dead node with a fresh bound. An agent that waits on every member -- the exit
// barrier, and the store host's wait for every node to learn the job's end -- instead reads the
// beat counters (hb/<id>) of all the nodes it waits for with one READ_ALL per step, and takes
// for silent every node whose counter has not moved for the keep-alive bound: the same test as
// the ring's, for all of them at once.
//
// A store that stops answering for a while (its host stopped) stops every counter, this
// agent's own included: a node counts as silent only once this agent's own counter has moved
// by missedBeats - 1 beats since that node's last beat, so that a stall of the store, or of this
// agent's writer, is not taken for the deaths of the others. A missing counter (a node that
// left deletes its keys) reads as one that does not move. A counter is an ordinary key, which
// any client of a store without a token can write (docs/security.md): a member's counter that is
// no count is compared as it is, this agent's own must count (forged, it judges nobody until it
// counts again; its writer restores it), each named in a warning. Single-threaded: one agent
// thread.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/heartbeat.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class SilentMembers {
 public:
  SilentMembers(std::string self, HeartbeatOptions beats) : self_(std::move(self)), beats_(beats) {}
  // Reads the beat counters of `ids` and of this node (one round trip) and returns those of `ids`
  // that have been silent for the keep-alive bound, as seen over this object's calls (a node
  // first seen now is counted from now). Throws what the store throws.
  std::vector<std::string> silent(Store& store, const std::vector<std::string>& ids);
  // How often to call silent(): often enough that a node is found within about half a bound
  // of its bound running out, never more often than the beats.
  Millis step() const { return std::max(beats_.timeout() / 2, beats_.interval); }

 private:
  struct Seen {
    std::optional<std::string> counter;  // its hb/<id> as last read
    Clock::time_point since;             // when it last changed (or was first read)
    // this node's own beat count then; nullopt while its own counter was forged (not a count)
    std::optional<int64_t> ownSince;
  };
  std::string self_;
  HeartbeatOptions beats_;
  std::map<std::string, Seen> seen_;
  std::map<std::string, std::string> warned_;  // each forged counter's value last warned about
};

}  // namespace ddprun::rendezvous
