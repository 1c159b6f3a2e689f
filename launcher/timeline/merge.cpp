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

using Tracks = std::map<std::string, std::vector<json>, TrackOrder>;

// A clock line of a part file, with when the process that measured it started.
struct ClockRecord {
  int64_t offsetUs = 0;
  int64_t boundUs = 0;
  std::string reference;
  int64_t partStartUs = 0;
};

struct NodeParts {
  Tracks tracks;
  std::optional<ClockRecord> clock;
  size_t skippedLines = 0;
  size_t partsCut = 0;
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

NodeParts readParts(const std::string& dir, int64_t sinceUs, uint64_t maxPartBytes,
                    uint64_t maxTotalBytes) {
  NodeParts node;
  std::error_code ec;
  // Smallest first, each file allowed at most an equal share of what is left: a worker that
  // writes huge files cannot crowd out the others' (or the agent's) events.
  std::vector<std::pair<uintmax_t, fs::path>> parts;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".jsonl") {
      parts.emplace_back(entry.file_size(ec), entry.path());
    }
  }
  std::sort(parts.begin(), parts.end());
  uint64_t budget = maxTotalBytes;  // what is left to read, over every part file
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint64_t share = budget / (parts.size() - i);
    auto part = readPartFile(parts[i].second.string(), {.maxBytes = std::min(maxPartBytes, share)});
    if (!part) {
      ++node.skippedLines;  // not a regular file, or no header
      continue;
    }
    budget -= std::min<uint64_t>(budget, part->bytesRead);
    node.skippedLines += part->skippedLines;
    if (part->cut) ++node.partsCut;
    if (part->startUs < sinceUs) continue;  // an older run's
    if (part->clock) {
      consider(node.clock, ClockRecord{.offsetUs = part->clock->offsetUs,
                                       .boundUs = part->clock->boundUs,
                                       .reference = part->clock->reference,
                                       .partStartUs = part->startUs});
    }
    auto& events = node.tracks[part->track];
    for (auto& e : part->events) events.push_back(std::move(e));
  }
  return node;
}

// Events have an integer `ts` within kMaxMagnitude (part_file.h isEvent).
int64_t tsOf(const json& e) { return e["ts"].get<int64_t>(); }

// A count from a bundle: 0 unless it is an integer in [0, 2^53] (never a type error).
size_t countOf(const json& b, const char* key) {
  return b.contains(key) && boundedInt(b[key], 0) ? b[key].get<size_t>() : 0;
}

// "rank N" with N in [first, first + count) (any N >= 0 when first < 0).
bool ownRank(const std::string& track, int first, int count) {
  if (track.rfind("rank ", 0) != 0 || track.size() > 15) return false;
  const std::string digits = track.substr(5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      (digits.size() > 1 && digits[0] == '0')) {
    return false;
  }
  const long r = std::stol(digits);
  return first < 0 || (r >= first && r < static_cast<long>(first) + count);
}

// A name from another node, short enough to quote in a message.
std::string shownName(const std::string& s) {
  return "'" + (s.size() > 64 ? s.substr(0, 64) + "..." : s) + "'";
}

constexpr size_t kMaxRefusalLines = 32;
constexpr size_t kMaxNodeName = 256;

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
  NodeParts parts = readParts(o.partsDir, o.sinceUs, o.maxPartBytes, o.maxTotalBytes);
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
      order.push_back({tsOf(events[i]), {&name, i}});
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
                       {"skipped_lines", parts.skippedLines},
                       {"parts_cut", parts.partsCut}};
  result.text = bundle.dump();
  return result;
}

MergeResult mergeTimeline(const MergeOptions& o) {
  MergeResult result;
  std::vector<NodeTracks> nodes;
  {
    NodeParts own = readParts(o.partsDir, o.sinceUs, o.maxPartBytes, o.maxTotalBytes);
    result.skippedLines += own.skippedLines;
    result.partsCut += own.partsCut;
    // This node's clock is the reference: offset 0 exactly.
    nodes.push_back(NodeTracks{.node = "this node (the reference clock)",
                               .tracks = std::move(own.tracks),
                               .clockKnown = true});
  }
  size_t refusals = 0;
  auto refuse = [&](const std::string& line) {
    if (++refusals <= kMaxRefusalLines) result.refused.push_back(line);
  };
  for (const ReceivedBundle& rb : o.bundles) {
    // Another node's agent wrote it (a client of the job's store): hostile input too.
    if (rb.text.empty() || rb.text.size() > o.maxBundleBytes) {
      ++result.badBundles;
      refuse(rb.from + ": " + std::to_string(std::max<uint64_t>(rb.bytes, rb.text.size())) +
             " bytes, over the " + std::to_string(o.maxBundleBytes >> 20) +
             " MiB a bundle may have (or past what the writer holds of all bundles, or empty): "
             "refused unread");
      continue;
    }
    // A bundle nests 5 deep ({"tracks": {name: [{"args": {}}]}}); deeper is refused before
    // parsing (the recursive parser would overflow the stack).
    if (jsonDepth(rb.text, 8) > 8) {
      ++result.badBundles;
      refuse(rb.from + ": nested deeper than 8 levels: refused unparsed");
      continue;
    }
    json b = json::parse(rb.text, nullptr, false);
    if (!b.is_object() || !b.contains("tracks") || !b["tracks"].is_object() ||
        !b.contains("node") || !b["node"].is_string() ||
        b["node"].get_ref<const std::string&>().size() > kMaxNodeName) {
      ++result.badBundles;
      refuse(rb.from + ": not a bundle (a JSON object with a string \"node\" of at most " +
             std::to_string(kMaxNodeName) + " bytes and an object of \"tracks\")");
      continue;
    }
    NodeTracks n{.node = b["node"].get<std::string>()};
    const json& c = b.value("clock", json());
    if (c.is_object() && c.contains("offset_us") && c.contains("bound_us")) {
      if (boundedInt(c["offset_us"]) && boundedInt(c["bound_us"], 0)) {
        n.clockKnown = true;
        n.offsetUs = c["offset_us"].get<int64_t>();
        n.boundUs = c["bound_us"].get<int64_t>();
        if (c.contains("reference") && c["reference"].is_string() &&
            c["reference"].get_ref<const std::string&>().size() <= kMaxNodeName) {
          n.reference = c["reference"];
        }
      } else {
        refuse(rb.from + ": its clock offset or bound is not an integer in range: its tracks "
               "are left unaligned");
      }
    }
    n.droppedEvents = countOf(b, "dropped_events");
    result.skippedLines += countOf(b, "skipped_lines");
    result.partsCut += countOf(b, "parts_cut");
    bool agentSeen = false;
    for (auto& [name, events] : b["tracks"].items()) {
      // Its agent's track (named as the node) and its own ranks': never another node's.
      const bool agent = name == n.node && !agentSeen;
      if (!agent && !ownRank(name, rb.firstRank, rb.ranks)) {
        ++result.refusedTracks;
        refuse(rb.from + ": track " + shownName(name) + " is not its agent's (" + shownName(n.node) +
               ")" + (rb.firstRank < 0 ? std::string(" nor a rank's")
                                       : " nor one of its ranks (" +
                                             std::to_string(rb.firstRank) + ".." +
                                             std::to_string(rb.firstRank + rb.ranks - 1) + ")") +
               ": refused");
        continue;
      }
      agentSeen = agentSeen || agent;
      if (!events.is_array()) continue;
      auto& out = n.tracks[name];
      for (auto& e : events) {
        if (!isEvent(e)) {
          ++result.skippedLines;
          continue;
        }
        e["ts"] = e["ts"].get<int64_t>() + n.offsetUs;
        out.push_back(std::move(e));
      }
    }
    nodes.push_back(std::move(n));
  }
  if (refusals > kMaxRefusalLines) {
    result.refused.push_back("... and " + std::to_string(refusals - kMaxRefusalLines) + " more");
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
        {"refused_tracks", result.refusedTracks},
        {"refused", result.refused},
        {"skipped_lines", result.skippedLines},
        {"parts_cut", result.partsCut}}}};
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
