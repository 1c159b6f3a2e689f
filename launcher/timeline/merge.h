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
#include <cstdint>
#include <string>

namespace ddprun::launcher::timeline {

struct MergeOptions {
  std::string partsDir;       // where the processes wrote their part files
  std::string output;         // the trace file, replaced atomically (temporary + rename)
  int64_t sinceUs = 0;        // ignore part files whose process started before this (older runs)
  uint64_t maxPartBytes = 256ull << 20;   // a part file is read up to this
  uint64_t maxTotalBytes = 512ull << 20;  // and all of them together (the merge holds them)
};

struct MergeResult {
  size_t tracks = 0;
  size_t events = 0;
  size_t skippedLines = 0;
  size_t partsCut = 0;  // part files read only in part (or not at all) because of the bounds
};

// Throws ddprun::Error naming the file when the output cannot be written.
MergeResult mergeTimeline(const MergeOptions& options);

}  // namespace ddprun::launcher::timeline
