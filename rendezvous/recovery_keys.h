#pragma once
// The keys of in-process recovery (docs/recovery.md), declared once for both ends: the agent
// that publishes a generation of the worker group and the workers' runtime that reads it.
//
// All of them live under the attempt's prefix, "/worker/attempt_<N>" (what ddprun::init() scopes
// the workers' store by), in the store the agent hosts for its workers:
//   ddprun/recovery/<rank>     the generation in which rank's current process holds the
//                              training state (it committed, or healed from a survivor): set
//                              by the runtime's elastic run; the agent recovers in process only
//                              when every worker it would rely on has written it
//   ddprun/generation/<g>      generation g of the group (g >= 1): written once by the agent,
//                              the record below (replace or shrink); survivors wait for the
//                              next one, and read every record between theirs and it
//   ddprun/spare/<id>/ready    a hot spare (ddprun --spares, DDPRUN_SPARE=<id>) is loaded and
//                              waiting: its pid, set by the spare's runtime
//   ddprun/generation_counter  several nodes: ADD allocates generation numbers to the agents
//   ddprun/node_workers        several nodes: each node's worker count at the start (node 0's
//                              agent writes it)
//   ddprun/node_spares/<n>     several nodes: the ids of node n's waiting spares ("<id>,<id>",
//                              empty: none), written by node n's agent when the set changes;
//                              node rank 0's agent reads it (with each spare's ready key) to
//                              give a lost node's ranks to spares of the other nodes
//   ddprun/spare/<id>/rank     the spare's assignment (SpareAssignment below): written once by
//                              the agent, in the same turn as the generation that names the
//                              spare; the spare WAITs for it
//   ddprun/suspect/<rank>      a survivor's collective failed (value: its generation): set by
//                              the runtime before it waits for the next generation. Only a hint:
//                              the agent then reads /proc for a worker of its own that is dying
//                              (base/process.h processDying) and recovers it at once, instead of
//                              after its guard reaps it (tens of ms later for a LibTorch process,
//                              whose memory the kernel frees first). Anything else it ignores.
// A generation's communicator keys live under "gen/<g>/" of the attempt (generation 0: none),
// so nothing of an old generation is read by a new one.
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace ddprun::rendezvous::recovery {

inline std::string attemptPrefix(int attempt) { return "/worker/attempt_" + std::to_string(attempt); }
inline std::string announceKey(int rank) { return "ddprun/recovery/" + std::to_string(rank); }
inline std::string generationKey(int generation) {
  return "ddprun/generation/" + std::to_string(generation);
}
inline std::string generationScope(int generation) { return "gen/" + std::to_string(generation); }
inline std::string spareReadyKey(int id) { return "ddprun/spare/" + std::to_string(id) + "/ready"; }
inline std::string spareAssignKey(int id) { return "ddprun/spare/" + std::to_string(id) + "/rank"; }
inline std::string suspectKey(int rank) { return "ddprun/suspect/" + std::to_string(rank); }
// Several nodes: the counter that allocates generation numbers (every node's agent publishes
// its own; an ADD gives each a number no other agent has) and node rank 0's agent's list of
// each node's worker count at the group's start ("<c0>,<c1>,...").
inline std::string generationCounterKey() { return "ddprun/generation_counter"; }
inline std::string nodeWorkersKey() { return "ddprun/node_workers"; }
inline std::string nodeSparesKey(int node) { return "ddprun/node_spares/" + std::to_string(node); }

// A rank of a lost node taken by a spare of another node (docs/recovery.md#a-lost-node): the
// node (the round's node rank) whose agent hands the rank to its spare <spare>.
struct MovedRank {
  int node = -1;
  int spare = -1;
};

// What the agent publishes for a generation: its number, and one line of why. Two kinds:
//   replace (--recovery-policy=replace): the ranks that left are taken by new processes (world
//     size and ranks stay), and the hot spare that takes the (first) rank (-1: a process
//     started for it). Text: "generation=<g> replaced=<r>[,<r>...][ spare=<id>]\n<cause>".
//   shrink (--recovery-policy=shrink): the ranks that left are gone; the survivors of the
//     previous generation keep their order and are numbered 0..worldSize-1 again (a survivor of
//     rank r becomes r - |{removed ranks < r}|, shrinkRank()). The removed ranks are numbers of
//     the previous generation g-1. Text: "generation=<g> removed=<r>[,<r>...] world_size=<n>\n<cause>".
struct GenerationRecord {
  int generation = 0;
  std::vector<int> replaced;  // replace: non-empty
  std::string cause;
  int spare = -1;
  std::vector<int> removed;   // shrink: non-empty (then replaced is empty)
  int worldSize = 0;          // shrink: the world size of generation g
  // shrink on several nodes: each node's worker count in generation g, by the round's node
  // rank (a node may have 0), summing to worldSize; empty on one node. Ranks stay in node order,
  // so a survivor's local rank is its rank minus the counts of the nodes before its own.
  // Text: " nodes=<c0>,<c1>,..." after world_size.
  std::vector<int> nodes;
  // replace on several nodes, a lost node's ranks: moved[i] takes replaced[i] (same length as
  // replaced, or empty). Text: " moved=<node>:<spare>[,<node>:<spare>...]" instead of spare=.
  // Such a rank runs off its node's block of ranks from then on: every worker of the group uses
  // the flat TCP mesh from this generation on (no shared memory, no hierarchy), which reads
  // only ranks, so the node placement ("contiguous ranks per node") need not hold any more.
  std::vector<MovedRank> moved;
};

// A survivor's rank in a shrunk generation, from its rank in the one before; -1 when the rank
// is one of those removed.
inline int shrinkRank(int rank, const std::vector<int>& removed) {
  int below = 0;
  for (int x : removed) {
    if (x == rank) return -1;
    if (x < rank) ++below;
  }
  return rank - below;
}

inline std::string formatGenerationRecord(const GenerationRecord& r) {
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  };
  if (!r.removed.empty()) {
    return "generation=" + std::to_string(r.generation) + " removed=" + list(r.removed) +
           " world_size=" + std::to_string(r.worldSize) +
           (r.nodes.empty() ? std::string() : " nodes=" + list(r.nodes)) + "\n" + r.cause;
  }
  std::string moved;
  for (const auto& m : r.moved) {
    moved += (moved.empty() ? " moved=" : ",") + std::to_string(m.node) + ":" +
             std::to_string(m.spare);
  }
  return "generation=" + std::to_string(r.generation) + " replaced=" + list(r.replaced) +
         (r.spare >= 0 ? " spare=" + std::to_string(r.spare) : std::string()) + moved + "\n" +
         r.cause;
}

// nullopt when `text` is not such a record (a pure function: tests feed it anything).
inline std::optional<GenerationRecord> parseGenerationRecord(const std::string& text) {
  GenerationRecord r;
  const size_t eol = text.find('\n');
  std::istringstream head(text.substr(0, eol));
  std::string gen, ranksField;
  if (!(head >> gen >> ranksField)) return std::nullopt;
  if (gen.rfind("generation=", 0) != 0) return std::nullopt;
  const bool shrink = ranksField.rfind("removed=", 0) == 0;
  if (!shrink && ranksField.rfind("replaced=", 0) != 0) return std::nullopt;
  char* end = nullptr;
  r.generation = static_cast<int>(std::strtol(gen.c_str() + 11, &end, 10));
  if (gen.size() == 11 || *end != '\0' || r.generation < 1) return std::nullopt;
  std::vector<int>& target = shrink ? r.removed : r.replaced;
  std::istringstream ranks(ranksField.substr(shrink ? 8 : 9));
  for (std::string x; std::getline(ranks, x, ',');) {
    const long v = std::strtol(x.c_str(), &end, 10);
    if (x.empty() || *end != '\0' || v < 0 || v > (1 << 24)) return std::nullopt;
    target.push_back(static_cast<int>(v));
  }
  if (target.empty()) return std::nullopt;
  if (shrink) {
    std::string ws;
    if (!(head >> ws) || ws.rfind("world_size=", 0) != 0 || ws.size() == 11) return std::nullopt;
    const long v = std::strtol(ws.c_str() + 11, &end, 10);
    if (*end != '\0' || v < 1 || v > (1 << 24)) return std::nullopt;
    r.worldSize = static_cast<int>(v);
    if (std::string nodes; head >> nodes) {
      if (nodes.rfind("nodes=", 0) != 0) return std::nullopt;
      std::istringstream counts(nodes.substr(6));
      long sum = 0;
      for (std::string x; std::getline(counts, x, ',');) {
        const long c = std::strtol(x.c_str(), &end, 10);
        if (x.empty() || *end != '\0' || c < 0 || c > (1 << 24)) return std::nullopt;
        r.nodes.push_back(static_cast<int>(c));
        sum += c;
      }
      if (r.nodes.empty() || sum != r.worldSize) return std::nullopt;
    }
    if (std::string extra; head >> extra) return std::nullopt;
  } else {
    std::string field;
    if (head >> field && field.rfind("spare=", 0) == 0) {
      if (field.size() == 6) return std::nullopt;
      const long v = std::strtol(field.c_str() + 6, &end, 10);
      if (*end != '\0' || v < 0 || v > (1 << 24)) return std::nullopt;
      r.spare = static_cast<int>(v);
      field.clear();
      head >> field;
    }
    if (!field.empty()) {
      if (field.rfind("moved=", 0) != 0) return std::nullopt;
      std::istringstream pairs(field.substr(6));
      for (std::string x; std::getline(pairs, x, ',');) {
        const size_t colon = x.find(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 == x.size()) return std::nullopt;
        const long node = std::strtol(x.substr(0, colon).c_str(), &end, 10);
        if (*end != '\0' || node < 0 || node > (1 << 24)) return std::nullopt;
        const long spare = std::strtol(x.c_str() + colon + 1, &end, 10);
        if (*end != '\0' || spare < 0 || spare > (1 << 24)) return std::nullopt;
        r.moved.push_back({static_cast<int>(node), static_cast<int>(spare)});
      }
      if (r.moved.size() != r.replaced.size()) return std::nullopt;
      if (std::string extra; head >> extra) return std::nullopt;
    }
  }
  if (eol != std::string::npos) r.cause = text.substr(eol + 1);
  return r;
}

// What a hot spare is told when it takes a rank: the generation it joins, its global and local
// rank. Text: "generation=<g> rank=<r> local_rank=<l>[ local_world_size=<n>]". The last only
// for a rank that moved from a lost node (GenerationRecord::moved): its local rank is a slot
// after its new node's own (LOCAL_RANK >= the node's LOCAL_WORLD_SIZE), and the process takes
// LOCAL_WORLD_SIZE=<n> (> <l>) with it, so that its environment stays consistent.
struct SpareAssignment {
  int generation = 0;
  int rank = -1;
  int localRank = -1;
  int localWorldSize = 0;  // 0: not said (the node's, from the spare's environment)
};

inline std::string formatSpareAssignment(const SpareAssignment& a) {
  return "generation=" + std::to_string(a.generation) + " rank=" + std::to_string(a.rank) +
         " local_rank=" + std::to_string(a.localRank) +
         (a.localWorldSize > 0 ? " local_world_size=" + std::to_string(a.localWorldSize)
                               : std::string());
}

// nullopt when `text` is not such an assignment (pure: tests feed it anything).
inline std::optional<SpareAssignment> parseSpareAssignment(const std::string& text) {
  std::istringstream in(text);
  std::string fields[3];
  const char* names[3] = {"generation=", "rank=", "local_rank="};
  long values[3] = {};
  for (int i = 0; i < 3; ++i) {
    if (!(in >> fields[i]) || fields[i].rfind(names[i], 0) != 0) return std::nullopt;
    const std::string digits = fields[i].substr(std::char_traits<char>::length(names[i]));
    char* end = nullptr;
    values[i] = std::strtol(digits.c_str(), &end, 10);
    if (digits.empty() || *end != '\0' || values[i] < 0 || values[i] > (1 << 24)) return std::nullopt;
  }
  int localWorldSize = 0;
  if (std::string lws; in >> lws) {
    if (lws.rfind("local_world_size=", 0) != 0 || lws.size() == 17) return std::nullopt;
    char* end = nullptr;
    const long v = std::strtol(lws.c_str() + 17, &end, 10);
    if (*end != '\0' || v <= values[2] || v > (1 << 24)) return std::nullopt;
    localWorldSize = static_cast<int>(v);
  }
  if (std::string extra; in >> extra) return std::nullopt;
  if (values[0] < 1) return std::nullopt;
  return SpareAssignment{.generation = static_cast<int>(values[0]),
                         .rank = static_cast<int>(values[1]),
                         .localRank = static_cast<int>(values[2]),
                         .localWorldSize = localWorldSize};
}

}  // namespace ddprun::rendezvous::recovery
