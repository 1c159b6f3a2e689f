#pragma once
// The job's timeline file: the per-process event files of base/timeline.h merged into one trace
// in the Chrome trace event format (docs/timeline.md), which Perfetto's UI and chrome://tracing
// open.
//
// Each track (the first line of a part file: "agent <node>", "rank <r>") becomes one trace
// process, numbered agents first, then ranks in order, with its name as metadata; a rank that
// was restarted has several part files (one per process), merged into its one track. Events are
// sorted by track, thread and start. Lines that are not an event (a torn last line of a process
// killed mid-write) are skipped and counted. Workers write the part files, so they are read as
// hostile input (part_file.h), within a bound per file and one for the whole merge, shared out
// smallest file first so that huge files cannot crowd out the others.
//
// Several nodes, one axis: the agent that writes FILE (node rank 0's) merges its own node's
// part files, whose clock is the reference, and the *node bundles* the other nodes' agents
// shipped to it (nodeBundle(): their part files as one JSON text, with the clock offset their
// processes measured to node rank 0's machine, rendezvous/clock_offset.h). A bundle's events are
// shifted by its offset; the trace's otherData states every track's offset and error bound.
//
// A bundle arrives through a store that any client of the job's store can write, so the writer
// reads it as hostile input too: at most kBundleCapBytes (what nodeBundle() produces) and
// nested at most 8 deep, or refused unparsed; a node's tracks are its agent's (the bundle's
// `node`) and its own ranks' (when the writer knows them: a bundle cannot put events on another
// node's ranks); times, offsets and counts are integers within +-2^53, so no sum overflows.
// What is refused is counted and named in otherData.refused.
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::launcher::timeline {

// One node's part files (a directory, parts of processes that started before sinceUs ignored)
// as one JSON text for the writer: its tracks with their events on the node's own clock, and
// the node's clock offset to the reference (the smallest-bound record of the newest reference
// its processes measured; none when no process measured one).
// The largest bundle a node ships (the latest events are cut to fit) and the writer reads.
constexpr uint64_t kBundleCapBytes = 16ull << 20;

struct BundleOptions {
  std::string partsDir;
  std::string node;        // the node's name in the trace ("agent 127.0.0.3")
  int64_t sinceUs = 0;
  uint64_t maxPartBytes = 256ull << 20;
  uint64_t maxTotalBytes = 512ull << 20;
  uint64_t capBytes = kBundleCapBytes;  // the bundle's size bound: the latest events are cut first
};
struct Bundle {
  std::string text;
  size_t events = 0;
  size_t droppedEvents = 0;  // cut to stay within capBytes (the bundle says how many)
  bool clockKnown = false;
};
Bundle nodeBundle(const BundleOptions& options);

// Another node's bundle as the writer received it, with what that node may hold.
struct ReceivedBundle {
  std::string from = "a node";  // "node rank 2": what the trace calls it when refusing
  int nodeRank = -1;
  std::string text;             // empty when it was over the cap (then `bytes` says how big)
  uint64_t bytes = 0;
  int firstRank = -1;           // its ranks are [firstRank, firstRank + ranks); -1: unknown,
  int ranks = 0;                // any "rank N" track is taken
};

struct MergeOptions {
  std::string partsDir;       // where this node's processes wrote their part files
  std::string output;         // the trace file, replaced atomically (temporary + rename)
  int64_t sinceUs = 0;        // ignore part files whose process started before this (older runs)
  uint64_t maxPartBytes = 256ull << 20;   // a part file is read up to this
  uint64_t maxTotalBytes = 512ull << 20;  // and all of them together (the merge holds them)
  std::vector<ReceivedBundle> bundles;   // other nodes' nodeBundle() texts, as received
  uint64_t maxBundleBytes = kBundleCapBytes;
  std::vector<std::string> missingNodes; // nodes whose bundle never arrived ("node rank 2")
};

struct MergeResult {
  size_t tracks = 0;
  size_t events = 0;
  size_t skippedLines = 0;
  size_t partsCut = 0;  // part files read only in part (or not at all) because of the bounds
  size_t badBundles = 0;        // bundles refused whole: too big, too deep, not of the shape
  size_t refusedTracks = 0;     // tracks a bundle may not hold (another node's, unknown names)
  std::vector<std::string> refused;  // one line per refusal (at most 32), as otherData says
  int64_t offsetBoundUs = 0;    // the largest error bound of an aligned track
};

// Throws ddprun::Error naming the file when the output cannot be written.
MergeResult mergeTimeline(const MergeOptions& options);

}  // namespace ddprun::launcher::timeline
