// recovery_timeline.h: the split of a recovery's lost time from two job timelines.
#include "bench/recovery_timeline.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace ddprun::bench {

std::optional<RunTimeline> readRunTimeline(const std::string& path, std::string* why) {
  std::ifstream in(path);
  if (!in) {
    *why = "no timeline at " + path;
    return std::nullopt;
  }
  const nlohmann::json trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (trace.is_discarded() || !trace.is_object() || !trace.contains("traceEvents") ||
      !trace["traceEvents"].is_array()) {
    *why = path + " is not a Chrome trace (no traceEvents array)";
    return std::nullopt;
  }
  const auto& events = trace["traceEvents"];
  // Tracks are processes of the trace, named by "process_name" metadata: "rank 0", "agent ...".
  std::map<int64_t, std::string> names;
  for (const auto& e : events) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name" && e.contains("args")) {
      names[e.value("pid", int64_t{-1})] = e["args"].value("name", "");
    }
  }
  RunTimeline t;
  bool started = false, ended = false, stepped = false;
  for (const auto& e : events) {
    if (!e.contains("ts") || !e["ts"].is_number()) continue;
    const std::string& track = names[e.value("pid", int64_t{-1})];
    const std::string name = e.value("name", "");
    const double ts = e["ts"].get<double>() / 1e6;
    if (track.rfind("agent", 0) == 0) {
      if (name == "rendezvous" && (!started || ts < t.jobStart)) t.jobStart = ts, started = true;
      if (name == "job end") t.jobEnd = std::max(t.jobEnd, ts), ended = true;
      if (name == "recovery") t.recoveries.push_back(ts);
    } else if (track == "rank 0" && name == "step" && e.contains("args") &&
               e["args"].contains("step")) {
      const double end = ts + e.value("dur", 0.0) / 1e6;
      double& last = t.stepEnd[e["args"]["step"].get<int64_t>()];
      last = std::max(last, end);  // a step redone after a recovery: its later run counts
      if (!stepped || ts < t.firstStepStart) t.firstStepStart = ts, stepped = true;
    }
  }
  if (!started || !ended || !stepped) {
    *why = path + (!stepped ? " has no step of rank 0" : " has no rendezvous or job end event");
    return std::nullopt;
  }
  std::sort(t.recoveries.begin(), t.recoveries.end());
  return t;
}

double TimeSplit::rest() const {
  double r = training;
  for (const auto& w : window) r -= w.value_or(0.0);
  return r;
}

TimeSplit splitLostTime(const RunTimeline& u, const RunTimeline& k) {
  TimeSplit s;
  const double lastU = u.stepEnd.rbegin()->second, lastK = k.stepEnd.rbegin()->second;
  s.startup = (k.firstStepStart - k.jobStart) - (u.firstStepStart - u.jobStart);
  s.end = (k.jobEnd - lastK) - (u.jobEnd - lastU);
  s.training = (lastK - k.firstStepStart) - (lastU - u.firstStepStart);
  for (double at : k.recoveries) {
    std::optional<int64_t> first;  // the first step rank 0 completed after the recovery
    for (const auto& [step, end] : k.stepEnd) {
      if (end > at && (!first || step < *first)) first = step;
    }
    std::optional<double> lost;
    if (first) {
      const int64_t a = *first - kWindowBefore, b = *first + kWindowAfter;
      const auto ka = k.stepEnd.find(a), kb = k.stepEnd.find(b);
      const auto ua = u.stepEnd.find(a), ub = u.stepEnd.find(b);
      if (ka != k.stepEnd.end() && kb != k.stepEnd.end() && ua != u.stepEnd.end() &&
          ub != u.stepEnd.end()) {
        lost = (kb->second - ka->second) - (ub->second - ua->second);
      }
    }
    s.window.push_back(lost);
  }
  return s;
}

}  // namespace ddprun::bench
