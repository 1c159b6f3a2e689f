#include "launcher/timeline/summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "base/errors.h"

namespace ddprun::launcher::timeline {
namespace {

using nlohmann::json;

std::string ms(int64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(us) / 1000.0);
  return buf;
}

std::string seconds(int64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(us) / 1e6);
  return buf;
}

std::string argText(const json& args, const char* key) {
  if (!args.is_object() || !args.contains(key)) return "";
  const json& v = args[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// One line for an agent event worth listing, or "" for the others.
std::string describeAgentEvent(const json& e) {
  const std::string name = e.value("name", "");
  const json args = e.value("args", json::object());
  if (name == "rendezvous") {
    return "rendezvous round " + argText(args, "round") + " closed: node rank " +
           argText(args, "node_rank") + " of " + argText(args, "nodes") + ", world size " +
           argText(args, "world_size") + " (" + ms(e.value("dur", int64_t{0})) + " ms)";
  }
  if (name == "worker exit" && args.value("failed", 0) != 0) {
    return "rank " + argText(args, "rank") + " (pid " + argText(args, "pid") + ") failed: " +
           argText(args, "result");
  }
  if (name == "restart") return "restart: " + argText(args, "cause");
  if (name == "failure report") return "failure report: " + argText(args, "root_cause");
  if (name == "job end") {
    return "job end: exit code " + argText(args, "exit_code") +
           (argText(args, "summary").empty() ? "" : " (" + argText(args, "summary") + ")");
  }
  return "";
}

// Why `e` cannot be summarised ("" when it can): every field the summary reads must have the
// type it expects, so that a trace edited by hand or written by another tool is skipped event
// by event, each named, instead of failing the whole summary on a type error.
std::string malformed(const json& e) {
  if (!e.is_object()) return "not an object";
  auto wrong = [&](const json& o, const char* key, bool (json::*isType)() const) {
    return o.contains(key) && !(o[key].*isType)();
  };
  for (const char* k : {"ph", "name", "cat"}) {
    if (wrong(e, k, &json::is_string)) return std::string("'") + k + "' is not a string";
  }
  if (wrong(e, "pid", &json::is_number_integer)) return "'pid' is not an integer";
  // Times may be fractional (the format allows it); beyond 2^53 us they are not times.
  for (const char* k : {"ts", "dur"}) {
    if (!e.contains(k)) continue;
    if (!e[k].is_number()) return std::string("'") + k + "' is not a number";
    const double v = e[k].get<double>();
    if (!(std::fabs(v) <= 9007199254740992.0)) return std::string("'") + k + "' is out of range";
  }
  if (e.contains("dur") && e["dur"].get<double>() < 0) return "'dur' is negative";
  if (wrong(e, "args", &json::is_object)) return "'args' is not an object";
  if (e.contains("args")) {
    for (const char* k : {"step", "seq", "failed"}) {
      if (wrong(e["args"], k, &json::is_number_integer)) {
        return std::string("args '") + k + "' is not an integer";
      }
    }
    if (wrong(e["args"], "name", &json::is_string)) return "args 'name' is not a string";
  }
  return "";
}

}  // namespace

Summary summarize(const json& trace) {
  const json* events = nullptr;
  if (trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array()) {
    events = &trace["traceEvents"];
  } else if (trace.is_array()) {
    events = &trace;
  } else {
    throw Error("not a Chrome trace: no traceEvents array");
  }
  Summary s;
  if (trace.is_object() && trace.contains("otherData") && trace["otherData"].is_object()) {
    const json& o = trace["otherData"];
    if (o.contains("clock_offset_bound_us") && o["clock_offset_bound_us"].is_number_integer()) {
      s.clockBoundUs = o["clock_offset_bound_us"].get<int64_t>();
    }
    auto names = [&](const char* key, std::vector<std::string>& out) {
      if (!o.contains(key) || !o[key].is_array()) return;
      for (const auto& n : o[key]) {
        if (n.is_string()) out.push_back(n.get<std::string>());
      }
    };
    names("nodes_missing", s.missingNodes);
    names("unaligned_tracks", s.unalignedTracks);
  }
  std::map<int64_t, std::string> trackOf;  // trace pid -> track name
  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    if (const std::string why = malformed(e); !why.empty()) {
      if (s.malformedEvents++ == 0) s.firstMalformed = "event " + std::to_string(i) + ": " + why;
      continue;
    }
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      trackOf[e.value("pid", int64_t{0})] = e["args"].value("name", "");
    }
  }
  std::map<int, RankSummary> ranks;
  // (worker group, sequence number) -> rank -> start of that rank's call
  std::map<std::pair<std::string, int64_t>, std::map<int, int64_t>> calls;
  int64_t first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
  std::vector<std::pair<int64_t, JobEvent>> jobEvents;
  for (const auto& e : *events) {
    if (!malformed(e).empty()) continue;  // counted above
    const std::string ph = e.value("ph", "");
    if (ph == "M" || !e.contains("ts")) continue;
    ++s.events;
    const int64_t ts = e["ts"].get<int64_t>();
    const int64_t dur = e.value("dur", int64_t{0});
    first = std::min(first, ts);
    last = std::max(last, ts + dur);
    const std::string track = trackOf[e.value("pid", int64_t{0})];
    const std::string name = e.value("name", "");
    const std::string cat = e.value("cat", "");
    const json args = e.value("args", json::object());
    if (track.rfind("rank ", 0) == 0) {
      int rank = 0;
      try {
        rank = std::stoi(track.substr(5));
      } catch (const std::exception&) {
        continue;
      }
      RankSummary& r = ranks[rank];
      r.rank = rank;
      if (cat == "trainer" && name == "step" && ph == "X") {
        ++r.steps;
        r.stepUs += dur;
        if (dur > r.slowestStepUs) {
          r.slowestStepUs = dur;
          r.slowestStep = args.value("step", int64_t{-1});
        }
      } else if (cat == "elastic" && name == "commit" && ph == "X") {
        ++r.commits;
        r.commitUs += dur;
      } else if (cat == "collective" && ph == "X") {
        ++r.collectives;
        r.collectiveUs += dur;
        if (args.contains("seq")) {
          calls[{argText(args, "group"), args["seq"].get<int64_t>()}][rank] = ts;
        }
      }
    } else if (track.rfind("agent", 0) == 0) {
      if (std::find(s.agents.begin(), s.agents.end(), track) == s.agents.end()) {
        s.agents.push_back(track);
      }
      const std::string what = describeAgentEvent(e);
      if (!what.empty()) jobEvents.push_back({ts + (name == "rendezvous" ? dur : 0), {0, track, what}});
    }
  }
  for (const auto& [key, byRank] : calls) {
    if (byRank.size() < 2) continue;
    ++s.comparedCollectives;
    int lastRank = -1;
    int64_t lastStart = std::numeric_limits<int64_t>::min(), secondLast = lastStart;
    for (const auto& [rank, start] : byRank) {
      if (start > lastStart) {
        secondLast = lastStart;
        lastStart = start;
        lastRank = rank;
      } else if (start > secondLast) {
        secondLast = start;
      }
    }
    for (const auto& [rank, start] : byRank) ranks[rank].waitUs += lastStart - start;
    ++ranks[lastRank].lastArrivals;
    ranks[lastRank].delayCausedUs += lastStart - secondLast;
  }
  int64_t mostDelay = 0, runnerUp = 0;
  int most = -1;
  for (auto& [rank, r] : ranks) {
    r.waitUs = std::min(r.waitUs, r.collectiveUs);
    if (r.delayCausedUs > mostDelay) {
      runnerUp = mostDelay;
      mostDelay = r.delayCausedUs;
      most = rank;
    } else {
      runnerUp = std::max(runnerUp, r.delayCausedUs);
    }
    s.ranks.push_back(r);
  }
  // Ranks always take turns at arriving last by a little; one is the straggler only when it
  // held the others up at least kStragglerFactor times as long as any other rank did.
  if (most >= 0 && mostDelay >= kStragglerFactor * runnerUp) s.straggler = most;
  if (s.events > 0) s.spanSeconds = static_cast<double>(last - first) / 1e6;
  std::stable_sort(jobEvents.begin(), jobEvents.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [ts, je] : jobEvents) {
    je.atSeconds = static_cast<double>(ts - first) / 1e6;
    s.jobEvents.push_back(std::move(je));
  }
  return s;
}

std::string formatSummary(const Summary& s) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%zu rank(s), %zu agent(s), %.2f s, %zu events\n",
                s.ranks.size(), s.agents.size(), s.spanSeconds, s.events);
  out += buf;
  auto list = [](const std::vector<std::string>& v) {
    std::string l;
    for (const auto& x : v) l += (l.empty() ? "" : ", ") + x;
    return l;
  };
  if (s.clockBoundUs > 0) {
    out += "clock: other nodes' tracks aligned to the writer's clock within +-" +
           std::to_string(s.clockBoundUs) + " us (waits across nodes are exact to that)\n";
  }
  if (!s.unalignedTracks.empty()) {
    out += "clock: not aligned (no offset measured): " + list(s.unalignedTracks) + "\n";
  }
  if (!s.missingNodes.empty()) out += "missing (sent no events): " + list(s.missingNodes) + "\n";
  if (s.malformedEvents > 0) {
    out += "skipped " + std::to_string(s.malformedEvents) + " malformed event(s), the first " +
           s.firstMalformed + "\n";
  }
  std::snprintf(buf, sizeof(buf), "%-6s %7s %10s %10s %10s %10s %10s %10s  %s\n", "rank", "steps",
                "step s", "compute s", "comm s", "waiting s", "caused s", "commit s", "slowest step");
  out += buf;
  for (const auto& r : s.ranks) {
    const std::string slowest =
        r.steps == 0 ? "-"
                     : ms(r.slowestStepUs) + " ms" +
                           (r.slowestStep >= 0 ? " (step " + std::to_string(r.slowestStep) + ")" : "");
    std::snprintf(buf, sizeof(buf), "%-6d %7lld %10s %10s %10s %10s %10s %10s  %s\n", r.rank,
                  static_cast<long long>(r.steps), seconds(r.stepUs).c_str(),
                  seconds(r.computeUs()).c_str(), seconds(r.communicationUs()).c_str(),
                  seconds(r.waitUs).c_str(), seconds(r.delayCausedUs).c_str(),
                  seconds(r.commitUs).c_str(), slowest.c_str());
    out += buf;
  }
  if (!s.jobEvents.empty()) {
    out += "job events:\n";
    for (const auto& e : s.jobEvents) {
      std::snprintf(buf, sizeof(buf), "  %9.3f s  %s: ", e.atSeconds, e.track.c_str());
      out += buf + e.what + "\n";
    }
  }
  if (s.straggler < 0) {
    out += s.ranks.size() < 2 ? "straggler: none (one rank)\n"
                              : "straggler: none (no rank held the others up " +
                                    std::to_string(kStragglerFactor) +
                                    "x as long as any other did)\n";
  } else {
    const RankSummary* r = nullptr;
    for (const auto& x : s.ranks) {
      if (x.rank == s.straggler) r = &x;
    }
    out += "straggler: rank " + std::to_string(s.straggler) + " (last to arrive at " +
           std::to_string(r->lastArrivals) + " of " + std::to_string(s.comparedCollectives) +
           " collectives; it held the others up " + ms(r->delayCausedUs) + " ms in total)\n";
  }
  return out;
}

nlohmann::json summaryJson(const Summary& s) {
  json ranks = json::array();
  for (const auto& r : s.ranks) {
    ranks.push_back({{"rank", r.rank}, {"steps", r.steps}, {"step_us", r.stepUs},
                     {"compute_us", r.computeUs()}, {"communication_us", r.communicationUs()},
                     {"waiting_us", r.waitUs}, {"collectives", r.collectives},
                     {"last_arrivals", r.lastArrivals}, {"delay_caused_us", r.delayCausedUs},
                     {"slowest_step_us", r.slowestStepUs}, {"slowest_step", r.slowestStep},
                     {"commits", r.commits}, {"commit_us", r.commitUs}});
  }
  json events = json::array();
  for (const auto& e : s.jobEvents) {
    events.push_back({{"at_s", e.atSeconds}, {"track", e.track}, {"what", e.what}});
  }
  return {{"span_s", s.spanSeconds}, {"events", s.events}, {"agents", s.agents},
          {"ranks", ranks}, {"job_events", events},
          {"straggler", s.straggler < 0 ? json(nullptr) : json(s.straggler)},
          {"compared_collectives", s.comparedCollectives},
          {"clock_offset_bound_us", s.clockBoundUs}, {"nodes_missing", s.missingNodes},
          {"unaligned_tracks", s.unalignedTracks}, {"malformed_events", s.malformedEvents},
          {"first_malformed", s.firstMalformed}};
}

}  // namespace ddprun::launcher::timeline
