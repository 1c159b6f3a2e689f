#pragma once
// Reading one part file of the timeline (base/timeline.h) for the merge.
//
// A part file is written by a worker, so the worker controls what is in it: the reader treats it
// as hostile input. It opens only a regular file, without following a symlink and without
// blocking (a FIFO swapped in after the directory listing is refused, not waited on); it reads at
// most `maxBytes` of it, so no single line can make it hold more; and it skips, counting them,
// lines that are neither an event nor a clock line: not a JSON object with `ph` and a numeric
// `ts` (or `clock` with integer `offset_us` and `bound_us` >= 0), or nested deeper
// than `maxDepth` (events are flat: an object and its `args`), which would otherwise make the
// recursive JSON code overflow the agent's stack.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddprun::launcher::timeline {

struct PartLimits {
  uint64_t maxBytes = 256ull << 20;  // read at most this much of one file
  int maxDepth = 8;                  // deepest JSON nesting kept (an event needs 2)
};

// A {"clock": {...}} line (base/timeline.h recordClockOffset): the process's clock offset to the
// machine whose agent writes the trace, and its error bound.
struct PartClock {
  int64_t offsetUs = 0;
  int64_t boundUs = 0;
  std::string reference;  // the store pinged, "host:port"
};

struct PartFile {
  std::string track;   // the first line's "track"
  int64_t startUs = 0; // the first line's "start_us": when its process started
  std::vector<nlohmann::json> events;
  std::optional<PartClock> clock;  // its last clock line, if any
  size_t skippedLines = 0;
  uint64_t bytesRead = 0;
  bool cut = false;    // the file is longer than maxBytes: the rest was not read
};

// Times and counts from a part file or a bundle: integers within +-2^53 (a double's exact
// range, ~285 years of microseconds), so that no sum or difference of them overflows, and no
// float is ever converted to an integer out of range.
constexpr int64_t kMaxMagnitude = int64_t{1} << 53;
bool boundedInt(const nlohmann::json& j, int64_t lo = -kMaxMagnitude, int64_t hi = kMaxMagnitude);

// An event the merge and the summary can rely on: an object with a string `ph`, an integer
// `ts`, and when present an integer `tid` and a non-negative integer `dur`, all within
// kMaxMagnitude.
bool isEvent(const nlohmann::json& e);

// nullopt when `path` is not a regular file that can be opened, or its first line is not a
// header ({"track": "...", "start_us": <integer>, ...}); such a file counts as one skipped line
// for the caller.
std::optional<PartFile> readPartFile(const std::string& path, const PartLimits& limits);

// The deepest nesting of JSON arrays and objects in `text` (brackets inside strings do not
// count); stops counting once past `stopAbove`. Pure.
int jsonDepth(std::string_view text, int stopAbove);

}  // namespace ddprun::launcher::timeline
