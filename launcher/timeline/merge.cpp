#include "launcher/timeline/merge.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "base/errors.h"
#include "base/timeline.h"

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

using Tracks = std::map<std::string, std::vector<json>, TrackOrder>;

// A {"clock": ...} line of a part file (base/timeline.h recordClockOffset).
struct ClockRecord {
  int64_t offsetUs = 0;
  int64_t boundUs = 0;
  std::string reference;
  int64_t partStartUs = 0;  // of the process that measured it
};

struct NodeParts {
  Tracks tracks;
  std::optional<ClockRecord> clock;
  size_t skippedLines = 0;
};

// The node's clock: among the records of the newest reference (the newest process's), the one
// with the smallest bound. Every process of one machine shares its clock, so any of them
// measures the node's offset.
void consider(std::optional<ClockRecord>& best, const ClockRecord& r) {
  if (!best) {
    best = r;
  } else if (r.reference != best->reference) {
    if (r.partStartUs > best->partStartUs) best = r;  // node rank 0 moved: the newer reference
  } else if (r.boundUs < best->boundUs) {
    best = r;
  }
}

NodeParts readParts(const std::string& dir, int64_t sinceUs, uint64_t maxPartBytes) {
  NodeParts node;
  std::error_code ec;
  std::vector<fs::path> parts;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".jsonl") {
      parts.push_back(entry.path());
    }
  }
  std::sort(parts.begin(), parts.end());
  for (const auto& path : parts) {
    std::ifstream in(path);
    std::string line;
    if (!std::getline(in, line)) continue;
    const json header = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!header.is_object() || !header.contains("track") || !header["track"].is_string()) {
      ++node.skippedLines;
      continue;
    }
    const int64_t start = header.value("start_us", int64_t{0});
    if (start < sinceUs) continue;  // an older run's
    auto& events = node.tracks[header["track"].get<std::string>()];
    uint64_t read = line.size();
    while (read < maxPartBytes && std::getline(in, line)) {
      read += line.size() + 1;
      json e = json::parse(line, nullptr, false);
      if (e.is_object() && e.contains("clock") && e["clock"].is_object()) {
        const json& c = e["clock"];
        if (c.contains("offset_us") && c["offset_us"].is_number_integer() &&
            c.contains("bound_us") && c["bound_us"].is_number_integer()) {
          consider(node.clock, ClockRecord{.offsetUs = c["offset_us"].get<int64_t>(),
                                           .boundUs = c["bound_us"].get<int64_t>(),
                                           .reference = c.value("reference", ""),
                                           .partStartUs = start});
          continue;
        }
      }
      if (!e.is_object() || !e.contains("ph") || !e.contains("ts") ||
          !e["ts"].is_number_integer()) {
        ++node.skippedLines;
        continue;
      }
      events.push_back(std::move(e));
    }
  }
  return node;
}

// One node's tracks in the trace, with the offset that puts them on the reference clock.
struct NodeTracks {
  std::string node;
  Tracks tracks;
  bool clockKnown = false;
  int64_t offsetUs = 0;
  int64_t boundUs = 0;
  std::string reference;
  size_t droppedEvents = 0;
};

}  // namespace

Bundle nodeBundle(const BundleOptions& o) {
  NodeParts parts = readParts(o.partsDir, o.sinceUs, o.maxPartBytes);
  Bundle result;
  json clock = nullptr;
  if (parts.clock) {
    clock = {{"offset_us", parts.clock->offsetUs},
             {"bound_us", parts.clock->boundUs},
             {"reference", parts.clock->reference}};
    result.clockKnown = true;
  }
  // Within the cap, the earliest events first: a job's start and its steady state matter more
  // than the last events of a job whose node had too much to say.
  std::vector<std::pair<int64_t, std::pair<const std::string*, size_t>>> order;
  for (const auto& [name, events] : parts.tracks) {
    for (size_t i = 0; i < events.size(); ++i) {
      order.push_back({events[i]["ts"].get<int64_t>(), {&name, i}});
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  json tracks = json::object();
  for (const auto& [name, events] : parts.tracks) tracks[name] = json::array();
  uint64_t size = 4096;  // the envelope and the track names, generously
  for (const auto& [ts, where] : order) {
    const json& e = parts.tracks[*where.first][where.second];
    const uint64_t bytes = e.dump().size() + 1;
    if (size + bytes > o.capBytes) {
      ++result.droppedEvents;
      continue;
    }
    size += bytes;
    tracks[*where.first].push_back(e);
    ++result.events;
  }
  const json bundle = {{"node", o.node},
                       {"clock", clock},
                       {"tracks", std::move(tracks)},
                       {"dropped_events", result.droppedEvents},
                       {"skipped_lines", parts.skippedLines}};
  result.text = bundle.dump();
  return result;
}

MergeResult mergeTimeline(const MergeOptions& o) {
  MergeResult result;
  std::vector<NodeTracks> nodes;
  {
    NodeParts own = readParts(o.partsDir, o.sinceUs, o.maxPartBytes);
    result.skippedLines += own.skippedLines;
    // This node's clock is the reference: offset 0 exactly.
    nodes.push_back(NodeTracks{.node = "this node (the reference clock)",
                               .tracks = std::move(own.tracks),
                               .clockKnown = true});
  }
  for (const std::string& text : o.bundles) {
    json b = json::parse(text, nullptr, false);
    if (!b.is_object() || !b.contains("tracks") || !b["tracks"].is_object() ||
        !b.contains("node") || !b["node"].is_string()) {
      ++result.badBundles;
      continue;
    }
    NodeTracks n{.node = b["node"].get<std::string>()};
    const json& c = b.value("clock", json());
    if (c.is_object() && c.contains("offset_us") && c["offset_us"].is_number_integer() &&
        c.contains("bound_us") && c["bound_us"].is_number_integer()) {
      n.clockKnown = true;
      n.offsetUs = c["offset_us"].get<int64_t>();
      n.boundUs = c["bound_us"].get<int64_t>();
      n.reference = c.value("reference", "");
    }
    n.droppedEvents = b.value("dropped_events", size_t{0});
    result.skippedLines += b.value("skipped_lines", size_t{0});
    for (auto& [name, events] : b["tracks"].items()) {
      if (!events.is_array()) continue;
      auto& out = n.tracks[name];
      for (auto& e : events) {
        if (!e.is_object() || !e.contains("ph") || !e.contains("ts") ||
            !e["ts"].is_number_integer()) {
          ++result.skippedLines;
          continue;
        }
        e["ts"] = e["ts"].get<int64_t>() + n.offsetUs;
        out.push_back(std::move(e));
      }
    }
    nodes.push_back(std::move(n));
  }

  // Every node's tracks under one order; a name two nodes share (two agents on hosts of one
  // name without --local-addr) gets the node's position appended.
  struct Placed {
    std::vector<json>* events;
    const NodeTracks* node;
  };
  std::map<std::string, Placed, TrackOrder> all;
  for (size_t k = 0; k < nodes.size(); ++k) {
    for (auto& [name, events] : nodes[k].tracks) {
      std::string unique = name;
      if (all.count(unique)) unique += " (node " + std::to_string(k) + ")";
      all[unique] = Placed{&events, &nodes[k]};
    }
  }

  json trace = json::array();
  json trackInfo = json::array();
  json unaligned = json::array();
  int pid = 0;
  for (auto& [name, placed] : all) {
    ++pid;
    auto& events = *placed.events;
    trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
    trace.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    const NodeTracks& n = *placed.node;
    trackInfo.push_back({{"track", name},
                         {"node", n.node},
                         {"clock_offset_us", n.clockKnown ? json(n.offsetUs) : json(nullptr)},
                         {"clock_offset_bound_us", n.clockKnown ? json(n.boundUs) : json(nullptr)},
                         {"clock_reference", n.reference}});
    if (n.clockKnown) {
      result.offsetBoundUs = std::max(result.offsetBoundUs, n.boundUs);
    } else {
      unaligned.push_back(name);  // its node measured no offset: its own clock, unshifted
    }
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
      trace.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", lane},
                       {"args", {{"name", "async lane " + std::to_string(lane - ddprun::timeline::kFirstLane)}}}});
    }
    for (auto& e : events) {
      e["pid"] = pid;
      trace.push_back(std::move(e));
      ++result.events;
    }
  }
  result.tracks = all.size();
  json nodeInfo = json::array();
  for (size_t k = 1; k < nodes.size(); ++k) {
    nodeInfo.push_back({{"node", nodes[k].node},
                        {"clock_offset_us", nodes[k].clockKnown ? json(nodes[k].offsetUs) : json(nullptr)},
                        {"clock_offset_bound_us", nodes[k].clockKnown ? json(nodes[k].boundUs) : json(nullptr)},
                        {"dropped_events", nodes[k].droppedEvents}});
  }
  const json out = {
      {"traceEvents", std::move(trace)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"producer", "ddprun"},
        {"clock", "system_clock microseconds of the machine whose agent wrote this file"},
        {"clock_offset_bound_us", result.offsetBoundUs},
        {"tracks", std::move(trackInfo)},
        {"unaligned_tracks", std::move(unaligned)},
        {"other_nodes", std::move(nodeInfo)},
        {"nodes_missing", o.missingNodes},
        {"bad_bundles", result.badBundles},
        {"skipped_lines", result.skippedLines}}}};
  // Per process: agents of one machine sharing FILE may merge at the same moment.
  const std::string tmp = o.output + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << out.dump() << "\n";
    f.flush();
    if (!f) throw Error("--timeline=" + o.output + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), o.output.c_str()) != 0) {
    throw Error("--timeline=" + o.output + ": cannot replace it with " + tmp);
  }
  return result;
}

}  // namespace ddprun::launcher::timeline
