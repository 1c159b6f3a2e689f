#include "launcher/timeline/merge.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/errors.h"
#include "base/timeline.h"
#include "launcher/timeline/part_file.h"

namespace ddprun::launcher::timeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Agents first (by name), then ranks by number, then anything else by name.
struct TrackOrder {
  static std::pair<int, long> key(const std::string& name) {
    if (name.rfind("agent", 0) == 0) return {0, 0};
    if (name.rfind("rank ", 0) == 0) {
      try {
        return {1, std::stol(name.substr(5))};
      } catch (const std::exception&) {
      }
    }
    return {2, 0};
  }
  bool operator()(const std::string& a, const std::string& b) const {
    const auto ka = key(a), kb = key(b);
    return ka != kb ? ka < kb : a < b;
  }
};

}  // namespace

MergeResult mergeTimeline(const MergeOptions& o) {
  MergeResult result;
  std::map<std::string, std::vector<json>, TrackOrder> tracks;
  std::error_code ec;
  // Smallest first, each file allowed at most an equal share of what is left: a worker that
  // writes huge files cannot crowd out the others' (or the agent's) events.
  std::vector<std::pair<uintmax_t, fs::path>> parts;
  for (const auto& entry : fs::directory_iterator(o.partsDir, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".jsonl") {
      parts.emplace_back(entry.file_size(ec), entry.path());
    }
  }
  std::sort(parts.begin(), parts.end());
  uint64_t budget = o.maxTotalBytes;  // what is left to read, over every part file
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint64_t share = budget / (parts.size() - i);
    auto part = readPartFile(parts[i].second.string(),
                             {.maxBytes = std::min(o.maxPartBytes, share)});
    if (!part) {
      ++result.skippedLines;  // not a regular file, or no header
      continue;
    }
    budget -= std::min<uint64_t>(budget, part->bytesRead);
    result.skippedLines += part->skippedLines;
    if (part->cut) ++result.partsCut;
    if (part->startUs < o.sinceUs) continue;  // an older run's
    auto& events = tracks[part->track];
    for (auto& e : part->events) events.push_back(std::move(e));
  }

  json all = json::array();
  int pid = 0;
  for (auto& [name, events] : tracks) {
    ++pid;
    all.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
    all.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    std::stable_sort(events.begin(), events.end(), [](const json& a, const json& b) {
      const auto ta = a.value("tid", int64_t{0}), tb = b.value("tid", int64_t{0});
      if (ta != tb) return ta < tb;
      const auto sa = a["ts"].get<int64_t>(), sb = b["ts"].get<int64_t>();
      if (sa != sb) return sa < sb;
      return a.value("dur", int64_t{0}) > b.value("dur", int64_t{0});  // parents first
    });
    std::set<int64_t> lanes;
    for (const auto& e : events) {
      const int64_t tid = e.value("tid", int64_t{0});
      if (tid >= ddprun::timeline::kFirstLane) lanes.insert(tid);
    }
    for (const int64_t lane : lanes) {
      all.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", lane},
                     {"args", {{"name", "async lane " + std::to_string(lane - ddprun::timeline::kFirstLane)}}}});
    }
    for (auto& e : events) {
      e["pid"] = pid;
      all.push_back(std::move(e));
      ++result.events;
    }
  }
  result.tracks = tracks.size();
  const json trace = {{"traceEvents", std::move(all)},
                      {"displayTimeUnit", "ms"},
                      {"otherData",
                       {{"producer", "ddprun"},
                        {"clock", "system_clock microseconds of this machine"},
                        {"clock_offset_bound_us", 0},
                        {"skipped_lines", result.skippedLines},
                        {"parts_cut", result.partsCut}}}};
  // Per process: agents of one machine sharing FILE may merge at the same moment.
  const std::string tmp = o.output + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << trace.dump() << "\n";
    out.flush();
    if (!out) throw Error("--timeline=" + o.output + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), o.output.c_str()) != 0) {
    throw Error("--timeline=" + o.output + ": cannot replace it with " + tmp);
  }
  return result;
}

}  // namespace ddprun::launcher::timeline
