#pragma once
// Timeline: the events of one process (an agent, a rank) for the job's trace (docs/timeline.md).
//
// Every process of a job that runs with `ddprun --timeline=FILE` appends its events to a file of
// its own under the directory named by DDPRUN_TIMELINE_DIR, one JSON object per line, each with
// a single write(2) to an O_APPEND descriptor: a process killed at any moment leaves every event
// it recorded before (at worst one torn last line, which the merge skips). The agent merges the
// directory into FILE (launcher/timeline/) in the Chrome trace event format.
//
// The first line of a file names its track ({"track": "rank 1", ...}); the merge gives each
// track one trace "process". Events are spans ("X": name, category, start, duration) and
// instants ("i"), with arguments as a flat JSON object. Time is system_clock microseconds: one
// axis for every process of a machine.
//
// Cost: when no timeline is open, every call is one relaxed atomic load. A file stops growing at
// its byte cap (DDPRUN_TIMELINE_MAX_MB, default 64), with one last event saying so.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ddprun::timeline {

constexpr const char* kTimelineDirEnv = "DDPRUN_TIMELINE_DIR";

// A flat JSON object of arguments, built by the caller: Args().add("op", "sum").add("bytes", n).
// While no timeline is open (enabled() is false) add() does nothing: a disabled timeline formats
// nothing.
class Args {
 public:
  Args& add(std::string_view key, std::string_view value);
  Args& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  Args& add(std::string_view key, const std::string& value) {
    return add(key, std::string_view(value));
  }
  Args& add(std::string_view key, int64_t value);
  Args& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
  Args& add(std::string_view key, uint64_t value) { return add(key, static_cast<int64_t>(value)); }
  Args& add(std::string_view key, double value);
  // "{...}"
  std::string json() const { return "{" + body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_;
};

// Opens this process's track: a new file <dir>/<fileStem>-<pid>.jsonl whose first line names
// `track`. Returns false (and records nothing) when dir is empty or the file cannot be created;
// a timeline never fails the job. Call once, before any event; later calls are ignored.
bool open(const std::string& dir, const std::string& track, const std::string& fileStem);
// Opens from DDPRUN_TIMELINE_DIR when it is set (a worker: track "rank <r>").
bool openFromEnvironment(const std::string& track, const std::string& fileStem);
// Closes the file (tests; a process exiting needs no call).
void close();

bool enabled();
// Microseconds on system_clock (plus the test skew below).
int64_t nowUs();
// The process's minor page faults so far (getrusage), for the "minor_faults" argument of spans
// whose cost is new pages: on a virtual machine with shadow page tables a first touch of a page
// costs ~10 us (docs/recovery.md, stop 53), so a span's faults say where its time went.
int64_t minorFaults();

// Test hook, for the multi-node timeline test only: DDPRUN_TIMELINE_TEST_CLOCK_SKEW_US=N (read
// once per process) adds N microseconds to nowUs(), as if this machine's clock were N us ahead.
// It changes nothing but the timeline's clock (every event and the clock-offset pings), so a
// test on one machine can check that the merge removes a known skew between two "nodes".
constexpr const char* kTestClockSkewEnv = "DDPRUN_TIMELINE_TEST_CLOCK_SKEW_US";

// Records this process's clock offset to the reference machine (the one whose agent writes the
// trace: docs/timeline.md), as estimated through the store (rendezvous/clock_offset.h): a
// line {"clock": {...}} of the part file, which the merge applies to the whole file. The latest
// record of a file wins. `reference` names the store pinged ("host:port").
void recordClockOffset(int64_t offsetUs, int64_t boundUs, int64_t rttUs, int samples,
                       std::string_view reference);

void span(std::string_view name, std::string_view category, int64_t startUs, int64_t durUs,
          const Args& args = {});
void instant(std::string_view name, std::string_view category, const Args& args = {});

// Spans that overlap without nesting (async collectives in flight together) cannot share a
// thread: each goes on a lane, a virtual thread kFirstLane + k, which the merge names
// "async lane k". Lanes are handed out lowest free first and never overlap.
constexpr int64_t kFirstLane = 1'000'000'000;
int acquireLane();
void releaseLane(int lane);
void spanOnLane(int lane, std::string_view name, std::string_view category, int64_t startUs,
                int64_t durUs, const Args& args = {});

// The minor page faults from construction on, for a span's "minor_faults" argument (see
// minorFaults()). Reads the count only while a timeline is open: no system call otherwise.
//   timeline::FaultCount faults;  ...  span(..., faults.addTo(Args().add("generation", g)));
class FaultCount {
 public:
  FaultCount() : start_(enabled() ? minorFaults() : -1) {}
  // Adds "minor_faults" (the faults since construction) to `args` when a timeline was open at
  // construction; returns `args`.
  Args& addTo(Args& args) const;
  Args&& addTo(Args&& args) const { return std::move(addTo(args)); }

 private:
  int64_t start_;  // -1: no timeline at construction
};

// A span from construction to destruction; args may be added before it ends. `name` and
// `category` must outlive the scope (string literals).
//   { timeline::Scope s("step", "trainer"); s.args().add("step", n); ... }
class Scope {
 public:
  Scope(std::string_view name, std::string_view category);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  Args& args() { return args_; }
  // The span gets "minor_faults": those from this call to its end (FaultCount).
  void countMinorFaults() { faults_.emplace(); }

 private:
  std::string_view name_;
  std::string_view category_;
  int64_t start_;
  bool on_;
  Args args_;
  std::optional<FaultCount> faults_;
};

// `text` as a JSON string literal, quotes included (also used by the merge).
std::string quoted(std::string_view text);

}  // namespace ddprun::timeline
