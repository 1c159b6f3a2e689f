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
#include <chrono>
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

// The launcher's console -- its stdout or its stderr -- as the event loop writes it: never
// blocking. When the console is a pipe or a terminal, ddprun writes through a non-blocking
// descriptor of its own (reopened through /proc/self/fd, so the description the shell and the
// workers share keeps its flags); what the destination does not take at once waits in a
// buffer. Above kHighWater queued bytes the console is congested: the worker group stops
// reading the pipes of the workers that write to it (they block, as under torchrun) and
// resumes below kLowWater, when the console is writable again. A console that is a regular
// file (never blocks) or cannot be reopened (a socket) is written with plain blocking writes.
// Event loop thread only (and the exit path).
// How long ddprun waits for a congested console at the failure report and at exit before it
// drops what is left (and says how much).
inline constexpr std::chrono::milliseconds kConsoleFlushBound{2000};

class Console {
 public:
  static constexpr size_t kHighWater = 1u << 20;
  static constexpr size_t kLowWater = 256u << 10;
  // The console on `fd` (STDOUT_FILENO or STDERR_FILENO; another descriptor is written with
  // blocking writes): set up on first use, kept until exit.
  static Console& of(int fd);
  // At exit: waits up to `timeout` for every console's queue to drain; the rest is dropped
  // and counted. Returns a sentence per console that lost bytes (empty: none).
  static std::vector<std::string> flushAll(std::chrono::milliseconds timeout);

  explicit Console(int fd);
  // Queues `bytes` (whole lines) and writes what the destination takes now.
  void write(std::string_view bytes);
  // Writes what the destination takes now; true when no more than kLowWater bytes wait.
  bool pump();
  bool congested() const { return pending_.size() - sent_ > kHighWater; }
  // The descriptor to wait on for writability while congested.
  int fd() const { return fd_; }
  void flush(std::chrono::milliseconds timeout);
  uint64_t lostBytes() const { return lost_; }

 private:
  int fd_;
  bool nonBlocking_ = false;
  bool broken_ = false;  // EPIPE or another error: output is dropped (and counted)
  std::string pending_;
  size_t sent_ = 0;      // bytes of pending_ written already
  uint64_t lost_ = 0;
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
  // The console this stream goes to, or null.
  Console* console() const { return console_; }
  bool congested() const { return console_ && console_->congested(); }
  // Log file trouble (disk full, I/O error): warned about once, naming the file; from then on
  // this stream's bytes for the file are counted here instead of written.
  uint64_t fileLostBytes() const { return fileLost_; }
  const std::string& filePath() const { return targets_.filePath; }
  int fileError() const { return fileError_; }
  // The console prefix of the lines emitted from now on (a worker's rank changed: in-process
  // recovery renumbers ranks, a spare takes one). The file, raw bytes, is not affected.
  void setPrefix(std::string prefix) { targets_.prefix = std::move(prefix); }

 private:
  void emit(std::vector<std::string>& lines);
  void writeFile(std::string_view bytes);

  StreamTargets targets_;
  Console* console_ = nullptr;
  int fileError_ = 0;
  uint64_t fileLost_ = 0;
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
