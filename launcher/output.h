#pragma once
// Worker output: each worker's stdout and stderr arrive on pipes and leave the launcher as
// whole lines, so lines of different workers never interleave mid-line and each worker's
// lines keep their order.
//
// A StreamSink handles one stream of one worker:
//   - console: whole lines, each with the prefix ("[rank 3]: "), to the launcher's stdout or
//     stderr (--tee, or no redirect); nothing when the stream is redirected or the local
//     rank is filtered out by --local-ranks-filter;
//   - file: the raw bytes, unprefixed (--redirects / --tee / filtered ranks);
//   - tail: the last lines, kept for the failure report.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/guarded_process.h"

namespace ddprun::launcher {

// Splits a byte stream into lines (pure). A line longer than maxLine is emitted in pieces of
// maxLine bytes, so a worker that never writes a newline cannot exhaust memory.
class LineBuffer {
 public:
  explicit LineBuffer(size_t maxLine = 64 * 1024) : maxLine_(maxLine) {}
  // Appends `bytes`; every completed line (without its '\n') is appended to `lines`.
  void feed(std::string_view bytes, std::vector<std::string>& lines);
  // The unterminated rest, if any, becomes a last line.
  void finish(std::vector<std::string>& lines);

 private:
  size_t maxLine_;
  std::string partial_;
};

struct StreamTargets {
  int consoleFd = -1;       // STDOUT_FILENO, STDERR_FILENO, or -1 for none
  std::string prefix;       // put before every console line
  std::string filePath;     // "" for none; created (truncated) when the sink opens
  size_t tailLines = 0;     // how many last lines to keep
};

class StreamSink {
 public:
  // Opens the file, if any. Throws ddprun::Error naming the file when it cannot.
  explicit StreamSink(StreamTargets targets);
  void write(std::string_view bytes);
  // End of stream: flushes the unterminated last line.
  void finish();
  const std::deque<std::string>& tail() const { return tail_; }

 private:
  void emit(std::vector<std::string>& lines);

  StreamTargets targets_;
  UniqueFd file_;
  LineBuffer lines_;
  std::deque<std::string> tail_;
  std::vector<std::string> scratch_;
};

// Where one stream of one worker goes (pure). `bit` is kStdOut or kStdErr; `redirects` and
// `tee` are that worker's --redirects/--tee bits. A redirected stream goes to its file only,
// a tee'd one to both; a rank left out by --local-ranks-filter goes to its file only.
struct StreamRoute {
  bool console = true;
  bool file = false;
};
StreamRoute routeStream(uint8_t bit, uint8_t redirects, uint8_t tee, bool filteredOut);

// The prefix of a worker's console lines (pure): TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE with
// ${role_name}, ${rank} and ${local_rank} expanded when it is set; else "[rank N]: " when the
// job has more than one worker; else nothing.
std::string linePrefix(const std::string* prefixTemplate, const std::string& role, int rank,
                       int localRank, int worldSize);

// Writes the whole buffer to fd (retrying short writes, waiting out EAGAIN); errors such
// as EPIPE from a closed console are ignored: losing console output must not stop a job.
void writeFully(int fd, std::string_view data);

}  // namespace ddprun::launcher
