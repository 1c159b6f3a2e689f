// recovery_timeline.h: the split of a recovery's lost time from two job timelines.
#include "bench/recovery_timeline.h"

#include <cmath>
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
    } else if (track.rfind("rank ", 0) == 0 && name == "step" && e.contains("args") &&
               e["args"].contains("step") && e["args"]["step"].is_number_integer()) {
      const double end = ts + e.value("dur", 0.0) / 1e6;
      const int64_t step = e["args"]["step"].get<int64_t>();
      // A step redone after a recovery: its later run counts.
      double& job = t.jobStepEnd[step];
      if (end > job) {
        job = end;
        const auto& w = e["args"].value("world_size", nlohmann::json());
        t.stepWorld[step] = w.is_number_integer() ? w.get<int>() : 0;
      }
      if (track != "rank 0") continue;
      double& last = t.stepEnd[step];
      last = std::max(last, end);
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

namespace {

// The time of fractional step x in `ends` (linear between two step ends), or nullopt outside.
std::optional<double> endAt(const std::map<int64_t, double>& ends, double x) {
  const auto lo = ends.find(static_cast<int64_t>(std::floor(x)));
  const auto hi = ends.find(static_cast<int64_t>(std::ceil(x)));
  if (lo == ends.end() || hi == ends.end()) return std::nullopt;
  return lo->second + (hi->second - lo->second) * (x - std::floor(x));
}

// The shrink window of the recovery whose first completed step is `first` (SplitBy::samples).
std::optional<double> samplesWindow(const RunTimeline& u, const RunTimeline& k, int64_t first) {
  const auto world = [](const RunTimeline& t, int64_t step) {
    const auto it = t.stepWorld.find(step);
    return it == t.stepWorld.end() ? 0 : it->second;
  };
  const int64_t a = first - kWindowBefore;
  const int whole = world(u, a);  // the undisturbed run's world size throughout
  if (whole <= 0 || world(k, a) != whole) return std::nullopt;
  int64_t grown = first;  // the first step of the whole group again
  while (k.jobStepEnd.count(grown) && world(k, grown) != whole) ++grown;
  const int64_t b = grown + kWindowAfter;
  double batches = 0;  // rank batches trained in (a, b] of the killed run
  for (int64_t step = a + 1; step <= b; ++step) {
    if (world(k, step) <= 0) return std::nullopt;
    batches += world(k, step);
  }
  const auto ka = k.jobStepEnd.find(a), kb = k.jobStepEnd.find(b);
  const auto ua = endAt(u.jobStepEnd, static_cast<double>(a));
  const auto ub = endAt(u.jobStepEnd, static_cast<double>(a) + batches / whole);
  if (ka == k.jobStepEnd.end() || kb == k.jobStepEnd.end() || !ua || !ub) return std::nullopt;
  return (kb->second - ka->second) - (*ub - *ua);
}

}  // namespace

TimeSplit splitLostTime(const RunTimeline& u, const RunTimeline& k, SplitBy by) {
  TimeSplit s;
  const bool samples = by == SplitBy::samples;
  const auto& uEnds = samples ? u.jobStepEnd : u.stepEnd;
  const auto& kEnds = samples ? k.jobStepEnd : k.stepEnd;
  const double lastU = uEnds.rbegin()->second, lastK = kEnds.rbegin()->second;
  s.startup = (k.firstStepStart - k.jobStart) - (u.firstStepStart - u.jobStart);
  s.end = (k.jobEnd - lastK) - (u.jobEnd - lastU);
  s.training = (lastK - k.firstStepStart) - (lastU - u.firstStepStart);
  for (double at : k.recoveries) {
    std::optional<int64_t> first;  // the first step completed after the recovery
    for (const auto& [step, end] : kEnds) {
      if (end > at && (!first || step < *first)) first = step;
    }
    std::optional<double> lost;
    if (first && samples) {
      lost = samplesWindow(u, k, *first);
    } else if (first) {
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
