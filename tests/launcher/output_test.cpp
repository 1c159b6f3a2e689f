// Splitting worker output into whole lines, and the failure report's pieces.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>

#include "launcher/failure_report.h"
#include "launcher/options.h"
#include "launcher/output.h"
#include "tests/support/temp_dir.h"

using namespace ddprun::launcher;

TEST_CASE("LineBuffer reassembles lines split across reads", "[launcher][output]") {
  LineBuffer b;
  std::vector<std::string> lines;
  b.feed("hel", lines);
  CHECK(lines.empty());
  b.feed("lo\nwor", lines);
  b.feed("ld\n\nlast", lines);
  CHECK(lines == std::vector<std::string>{"hello", "world", ""});
  b.finish(lines);
  CHECK(lines.back() == "last");
}

TEST_CASE("LineBuffer bounds a line that never ends", "[launcher][output]") {
  LineBuffer b(4);
  std::vector<std::string> lines;
  b.feed("abcdefghij\nxy\n", lines);
  CHECK(lines == std::vector<std::string>{"abcd", "efgh", "ij", "xy"});
  lines.clear();
  b.feed("abcd\n", lines);  // exactly maxLine, then its newline
  CHECK(lines == std::vector<std::string>{"abcd"});
}

TEST_CASE("StreamSink: raw bytes to the file, prefixed whole lines to the console, a tail",
          "[launcher][output]") {
  ddprun::testing::TempDir dir;
  int console[2];
  REQUIRE(pipe(console) == 0);
  const std::string file = dir / "stderr.log";
  {
    StreamSink sink(StreamTargets{.consoleFd = console[1], .prefix = "[rank 1]: ",
                                  .filePath = file, .tailLines = 2});
    sink.write("one\ntw");
    sink.write("o\nthree\nfour");
    sink.finish();
    CHECK(sink.tail() == std::deque<std::string>{"three", "four"});
  }
  ::close(console[1]);
  char buf[256] = {};
  const ssize_t n = ::read(console[0], buf, sizeof buf - 1);
  ::close(console[0]);
  CHECK(std::string(buf, n) == "[rank 1]: one\n[rank 1]: two\n[rank 1]: three\n[rank 1]: four\n");
  std::ifstream in(file);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(content == "one\ntwo\nthree\nfour");
}

TEST_CASE("StreamSink names a log file it cannot create", "[launcher][output]") {
  CHECK_THROWS_WITH(StreamSink(StreamTargets{.filePath = "/nonexistent/dir/stdout.log"}),
                    Catch::Contains("/nonexistent/dir/stdout.log"));
}

TEST_CASE("error files in PyTorch's @record format are read", "[launcher][report]") {
  ddprun::testing::TempDir dir;
  const std::string path = dir / "error.json";
  std::ofstream(path)
      << R"({"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\"\nValueError: bad batch", "timestamp": "1700000000"}}})";
  ErrorFile ef = readErrorFile(path);
  CHECK(ef.present);
  CHECK(ef.message == "ValueError: bad batch");
  CHECK(ef.timestamp == "1700000000");
  CHECK_THAT(ef.traceback, Catch::StartsWith("Traceback"));

  std::ofstream(path) << "not json at all";
  ErrorFile raw = readErrorFile(path);
  CHECK(raw.present);
  CHECK(raw.raw == "not json at all");
  std::remove(path.c_str());
  CHECK_FALSE(readErrorFile(path).present);
}

TEST_CASE("the failure report names rank, pid, exit, error file and stderr tail",
          "[launcher][report]") {
  FailureReport r;
  r.program = "train.py";
  r.host = "node7";
  r.rootCause.globalRank = 3;
  r.rootCause.localRank = 1;
  r.rootCause.pid = 4242;
  r.rootCause.ended = true;
  r.rootCause.waitStatus = 9;  // killed by SIGKILL
  r.rootCause.errorFile = "/nonexistent/error.json";
  r.rootCause.stderrTail = {"CUDA out of memory"};
  WorkerResult other;
  other.globalRank = 2;
  other.waitStatus = 15;
  other.stopSignal = 15;
  r.others.push_back(other);
  const std::string text = formatFailureReport(r);
  CHECK_THAT(text, Catch::Contains("rank       : 3 (local rank 1)"));
  CHECK_THAT(text, Catch::Contains("pid        : 4242"));
  CHECK_THAT(text, Catch::Contains("signal 9 (SIGKILL) -> ddprun exits with 137"));
  CHECK_THAT(text, Catch::Contains("host       : node7"));
  CHECK_THAT(text, Catch::Contains("/nonexistent/error.json (not written"));
  CHECK_THAT(text, Catch::Contains("    CUDA out of memory"));
  CHECK_THAT(text, Catch::Contains("rank 2 (local rank 0, pid -1): signal 15 (SIGTERM)"));
}

TEST_CASE("routing of a stream by --redirects, --tee and --local-ranks-filter",
          "[launcher][output]") {
  auto route = [](uint8_t bit, uint8_t redirects, uint8_t tee, bool filtered) {
    StreamRoute r = routeStream(bit, redirects, tee, filtered);
    return std::pair{r.console, r.file};
  };
  CHECK(route(kStdOut, kStdNone, kStdNone, false) == std::pair{true, false});
  CHECK(route(kStdOut, kStdOut, kStdNone, false) == std::pair{false, true});   // redirected
  CHECK(route(kStdErr, kStdOut, kStdNone, false) == std::pair{true, false});   // other stream
  CHECK(route(kStdErr, kStdNone, kStdAll, false) == std::pair{true, true});    // tee
  CHECK(route(kStdOut, kStdAll, kStdOut, false) == std::pair{true, true});     // tee wins
  CHECK(route(kStdOut, kStdNone, kStdNone, true) == std::pair{false, true});   // filtered out
}

TEST_CASE("console prefixes: [rank N] for several workers, or the user's template",
          "[launcher][output]") {
  CHECK(linePrefix(nullptr, "default", 5, 1, 8) == "[rank 5]: ");
  CHECK(linePrefix(nullptr, "default", 0, 0, 1).empty());
  const std::string templ = "[${role_name}${local_rank}|${rank}] ${rank}: ";
  CHECK(linePrefix(&templ, "trainer", 5, 1, 8) == "[trainer1|5] 5: ");
}
