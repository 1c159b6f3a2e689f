#pragma once
// What a job's timeline says, computed from the merged trace (merge.h) by a pure function:
// per rank the time in steps, in compute, in communication and waiting for the others inside
// collectives; in in-process recovery's commits (between steps); the slowest step; the agents' rendezvous, failures and restarts in order; and the
// straggler, the rank the others wait for.
//
// Waiting is measured across ranks: a collective (one sequence number of one worker group) starts
// on each rank when that rank calls it, and cannot finish before the last rank has called it.
// The time from a rank's call to the last rank's call is that rank's wait; the time from the
// second-to-last call to the last one is the delay the last rank alone caused. The straggler is
// the rank that caused the most delay, at least kStragglerFactor times any other rank's (ranks
// of a healthy job take turns at being last by a little).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddprun::launcher::timeline {

constexpr int64_t kStragglerFactor = 2;

struct RankSummary {
  int rank = 0;
  int64_t steps = 0;
  int64_t stepUs = 0;          // sum of the step spans
  int64_t slowestStepUs = 0;
  int64_t slowestStep = -1;    // its step number (args.step), -1 when unknown
  int64_t collectives = 0;
  int64_t collectiveUs = 0;    // sum of the collective spans
  int64_t waitUs = 0;          // of which waiting for the last rank to arrive
  int64_t lastArrivals = 0;    // collectives this rank was the last to call
  int64_t delayCausedUs = 0;   // what being last cost the others
  int64_t commits = 0;         // in-process recovery's snapshots (category elastic, "commit")
  int64_t commitUs = 0;        // their time, outside the steps
  int64_t computeUs() const { return stepUs > collectiveUs ? stepUs - collectiveUs : 0; }
  int64_t communicationUs() const { return collectiveUs - waitUs; }
};

struct JobEvent {
  double atSeconds = 0;  // since the trace's first event
  std::string track;     // "agent 127.0.0.2"
  std::string what;      // "restart: rank 1 failed (signal 9 (SIGKILL))"
};

struct Summary {
  double spanSeconds = 0;
  size_t events = 0;
  std::vector<std::string> agents;
  std::vector<RankSummary> ranks;
  std::vector<JobEvent> jobEvents;  // rendezvous rounds, worker exits, restarts, the end
  int straggler = -1;               // -1: none (one rank, or nobody waited)
  int64_t comparedCollectives = 0;  // collectives seen on at least two ranks
  // Several nodes (otherData, docs/timeline.md): the largest clock-offset error bound of a
  // track (0: one machine, exact), the nodes whose events never arrived, and the tracks left
  // on their own clock. Waits across nodes are exact to within the bound.
  int64_t clockBoundUs = 0;
  std::vector<std::string> missingNodes;
  std::vector<std::string> unalignedTracks;
  // Events skipped because a field the summary reads has the wrong type, and the first one
  // ("event 12: args 'seq' is not an integer").
  size_t malformedEvents = 0;
  std::string firstMalformed;
};

// Throws ddprun::Error when `trace` is not a trace of this format.
Summary summarize(const nlohmann::json& trace);
// The text `ddprun-trace FILE` prints, ending with the line "straggler: ...".
std::string formatSummary(const Summary& s);
nlohmann::json summaryJson(const Summary& s);

}  // namespace ddprun::launcher::timeline
