// The timeline's pieces without a job: the per-process writer (base/timeline.h), the merge
// into one Chrome trace (launcher/timeline/merge.h) and the summary with its straggler
// (launcher/timeline/summary.h). The job-level tests are timeline_scenarios.py.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/timeline.h"
#include "launcher/timeline/merge.h"
#include "launcher/timeline/part_file.h"
#include "launcher/timeline/summary.h"
#include "tests/support/temp_dir.h"

namespace events = ddprun::timeline;
using ddprun::launcher::timeline::mergeTimeline;
using ddprun::launcher::timeline::formatSummary;
using ddprun::launcher::timeline::summarize;
using ddprun::testing::TempDir;
using nlohmann::json;

namespace {

json readJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Runs `body` in a child process with its own timeline track (the writer is per process).
void inChild(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

const json* findEvent(const json& trace, const std::string& name) {
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("name", "") == name) return &e;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("without a track nothing is recorded", "[timeline]") {
  CHECK_FALSE(events::enabled());
  events::instant("nothing", "test");  // a no-op, not a crash
  events::Scope s("nothing", "test");
  CHECK_FALSE(events::openFromEnvironment("rank 0", "rank-0"));  // DDPRUN_TIMELINE_DIR unset
}

TEST_CASE("parts of two processes merge into one trace with a track each", "[timeline]") {
  TempDir dir("ddprun-timeline");
  const std::string parts = dir.path() + "/parts";
  std::filesystem::create_directories(parts);
  const int64_t since = events::nowUs();
  inChild([&] {
    events::open(parts, "agent 127.0.0.1", "agent");
    events::instant("worker start", "agent", events::Args().add("rank", 0).add("pid", 42));
  });
  inChild([&] {
    events::open(parts, "rank 0", "rank-0");
    {
      events::Scope outer("step", "trainer");
      outer.args().add("step", 1);
      events::Scope inner("allreduce", "collective");
      inner.args().add("op", "sum").add("note", "quote \" and \n newline");
    }
  });
  // A part of an earlier run (started before `since`) and one with a torn last line.
  {
    std::ofstream old(parts + "/rank-0-1.jsonl");
    old << "{\"track\":\"rank 0\",\"pid\":1,\"start_us\":1}\n"
        << "{\"name\":\"stale\",\"cat\":\"x\",\"ph\":\"i\",\"ts\":5,\"pid\":1,\"tid\":1,\"args\":{}}\n";
    std::ofstream torn(parts + "/rank-1-2.jsonl");
    torn << "{\"track\":\"rank 1\",\"pid\":2,\"start_us\":" << since + 1 << "}\n"
         << "{\"name\":\"whole\",\"cat\":\"x\",\"ph\":\"i\",\"ts\":" << since + 2
         << ",\"pid\":2,\"tid\":2,\"args\":{}}\n"
         << "{\"name\":\"torn\",\"cat\":\"x\",\"ph\":\"X\",\"ts\":12";
  }
  const std::string out = dir.path() + "/trace.json";
  const auto r = mergeTimeline({.partsDir = parts, .output = out, .sinceUs = since});
  CHECK(r.tracks == 3);
  CHECK(r.events == 4);  // worker start, step, allreduce, whole
  CHECK(r.skippedLines == 1);

  const json trace = readJson(out);
  std::map<int64_t, std::string> names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"]] = e["args"]["name"];
  }
  CHECK(names == std::map<int64_t, std::string>{{1, "agent 127.0.0.1"}, {2, "rank 0"}, {3, "rank 1"}});
  CHECK(findEvent(trace, "stale") == nullptr);
  CHECK(findEvent(trace, "torn") == nullptr);
  const json* step = findEvent(trace, "step");
  const json* allreduce = findEvent(trace, "allreduce");
  REQUIRE(step != nullptr);
  REQUIRE(allreduce != nullptr);
  CHECK((*step)["pid"] == 2);
  CHECK((*step)["args"]["step"] == 1);
  CHECK((*allreduce)["args"]["note"] == "quote \" and \n newline");
  // Nested: the inner span lies within the outer one.
  CHECK((*allreduce)["ts"].get<int64_t>() >= (*step)["ts"].get<int64_t>());
  CHECK((*allreduce)["ts"].get<int64_t>() + (*allreduce)["dur"].get<int64_t>() <=
        (*step)["ts"].get<int64_t>() + (*step)["dur"].get<int64_t>());
  CHECK((*findEvent(trace, "worker start"))["args"]["pid"] == 42);
}

TEST_CASE("a track stops at its byte cap and says so", "[timeline]") {
  TempDir dir("ddprun-timeline");
  inChild([&] {
    ::setenv("DDPRUN_TIMELINE_MAX_MB", "1", 1);
    events::open(dir.path(), "rank 0", "rank-0");
    for (int i = 0; i < 20000; ++i) events::instant("tick", "test", events::Args().add("i", i));
  });
  const auto r = mergeTimeline({.partsDir = dir.path(), .output = dir.path() + "/t.json"});
  CHECK(r.events > 1000);
  CHECK(r.events < 20000);
  const json trace = readJson(dir.path() + "/t.json");
  CHECK(findEvent(trace, "timeline: events dropped (file cap reached)") != nullptr);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() == ".jsonl") CHECK(entry.file_size() < (1u << 20) + 1024);
  }
}

TEST_CASE("the summary names the rank the others wait for", "[timeline]") {
  // Three ranks, four allreduces; rank 2 calls each 5 ms after the others.
  json ev = json::array();
  for (int pid = 1; pid <= 3; ++pid) {
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                  {"args", {{"name", "rank " + std::to_string(pid - 1)}}}});
  }
  for (int seq = 0; seq < 4; ++seq) {
    const int64_t t0 = 1'000'000 + seq * 100'000;
    for (int rank = 0; rank < 3; ++rank) {
      const int64_t start = t0 + (rank == 2 ? 5000 : rank * 100);
      const int64_t end = t0 + 5000 + 800;
      ev.push_back({{"name", "step"}, {"cat", "trainer"}, {"ph", "X"}, {"ts", start - 20000},
                    {"dur", end - start + 20000}, {"pid", rank + 1}, {"tid", 7},
                    {"args", {{"step", seq + 1}}}});
      ev.push_back({{"name", "allreduce"}, {"cat", "collective"}, {"ph", "X"}, {"ts", start},
                    {"dur", end - start}, {"pid", rank + 1}, {"tid", 7},
                    {"args", {{"seq", seq}, {"group", "job/0"}}}});
    }
  }
  const auto s = summarize(json{{"traceEvents", ev}});
  REQUIRE(s.ranks.size() == 3);
  CHECK(s.comparedCollectives == 4);
  CHECK(s.straggler == 2);
  CHECK(s.ranks[2].lastArrivals == 4);
  CHECK(s.ranks[2].delayCausedUs == 4 * (5000 - 100));
  CHECK(s.ranks[0].waitUs == 4 * 5000);
  CHECK(s.ranks[2].waitUs == 0);
  const std::string text = formatSummary(s);
  CHECK_THAT(text, Catch::Contains("straggler: rank 2 (last to arrive at 4 of 4 collectives"));

  // Ranks that take turns at being last: nobody is the straggler.
  json even = json::array();
  for (int pid = 1; pid <= 2; ++pid) {
    even.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                    {"args", {{"name", "rank " + std::to_string(pid - 1)}}}});
  }
  for (int seq = 0; seq < 6; ++seq) {
    for (int rank = 0; rank < 2; ++rank) {
      even.push_back({{"name", "allreduce"}, {"cat", "collective"}, {"ph", "X"},
                      {"ts", seq * 10000 + (rank == seq % 2 ? 300 : 0)}, {"dur", 500},
                      {"pid", rank + 1}, {"tid", 1}, {"args", {{"seq", seq}, {"group", "g"}}}});
    }
  }
  const auto e = summarize(json{{"traceEvents", even}});
  CHECK(e.straggler == -1);
  CHECK(e.ranks[0].delayCausedUs == 900);
  CHECK_THAT(formatSummary(e), Catch::Contains("straggler: none (no rank held the others up"));

  // One rank: no straggler; not a trace: a clear error.
  json one = json::array({{{"name", "process_name"}, {"ph", "M"}, {"pid", 1},
                           {"args", {{"name", "rank 0"}}}}});
  CHECK(summarize(json{{"traceEvents", one}}).straggler == -1);
  CHECK_THROWS_WITH(summarize(json{{"x", 1}}), Catch::Contains("no traceEvents"));
}

TEST_CASE("a part file is read as hostile input: depth, types, bounds", "[timeline]") {
  using ddprun::launcher::timeline::jsonDepth;
  using ddprun::launcher::timeline::readPartFile;
  CHECK(jsonDepth(R"({"a":{"b":[1]}})", 8) == 3);
  CHECK(jsonDepth(R"({"s":"[[[[{{{{ \" ]]"})", 8) == 1);  // brackets in strings do not count
  CHECK(jsonDepth(std::string(100000, '['), 8) == 9);       // stops just past the bound

  TempDir dir("ddprun-timeline");
  const std::string path = dir.path() + "/p.jsonl";
  {
    std::ofstream f(path);
    f << R"({"track":"rank 3","start_us":7})" << "\n"
      << R"({"ph":"i","ts":1,"args":[[[[[[[[[[1]]]]]]]]]]})" << "\n"  // 11 deep
      << R"({"ph":"i","ts":2,"tid":"one"})" << "\n"
      << R"({"ph":"X","ts":3,"dur":[]})" << "\n"
      << R"({"ph":"i","ts":"4"})" << "\n"
      << R"({"ph":"i","ts":5,"tid":2,"name":"good"})" << "\n";
  }
  auto part = readPartFile(path, {});
  REQUIRE(part);
  CHECK(part->track == "rank 3");
  CHECK(part->startUs == 7);
  CHECK(part->skippedLines == 4);
  REQUIRE(part->events.size() == 1);
  CHECK(part->events[0]["name"] == "good");
  CHECK_FALSE(part->cut);

  // Read only up to the bound: the good line lies past it.
  auto cut = readPartFile(path, {.maxBytes = 40});
  REQUIRE(cut);
  CHECK(cut->cut);
  CHECK(cut->bytesRead == 40);
  CHECK(cut->events.empty());

  // Not a regular file, a symlink, a header of the wrong type: no part.
  REQUIRE(::mkfifo((dir.path() + "/f.jsonl").c_str(), 0600) == 0);
  CHECK_FALSE(readPartFile(dir.path() + "/f.jsonl", {}));
  std::filesystem::create_symlink(path, dir.path() + "/l.jsonl");
  CHECK_FALSE(readPartFile(dir.path() + "/l.jsonl", {}));
  std::ofstream(dir.path() + "/h.jsonl") << R"({"track":"rank 0","start_us":"now"})" << "\n";
  CHECK_FALSE(readPartFile(dir.path() + "/h.jsonl", {}));
}
