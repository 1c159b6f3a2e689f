// The timeline's pieces without a job: the per-process writer (base/timeline.h), the merge
// into one Chrome trace (launcher/timeline/merge.h) and the summary with its straggler
// (launcher/timeline/summary.h). The job-level tests are timeline_scenarios.py.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/timeline.h"
#include "launcher/timeline/exchange.h"
#include "launcher/timeline/merge.h"
#include "launcher/timeline/part_file.h"
#include "launcher/timeline/summary.h"
#include "rendezvous/clock_offset.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"
#include "tests/support/temp_dir.h"

namespace events = ddprun::timeline;
using ddprun::launcher::timeline::mergeTimeline;
using ddprun::launcher::timeline::nodeBundle;
using ddprun::launcher::timeline::formatSummary;
using ddprun::launcher::timeline::summarize;
using ddprun::launcher::timeline::summaryJson;
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

TEST_CASE(
    "minor_faults counts the new pages a span touched, and is absent when counting began with no track",
    "[timeline]") {
  TempDir dir("ddprun-timeline");
  const std::string parts = dir.path() + "/parts";
  std::filesystem::create_directories(parts);
  const int64_t since = events::nowUs();
  constexpr size_t kPages = 512;  // 2 MiB, written once: at least one fault per page
  inChild([&] {
    const events::FaultCount beforeOpen;  // no track yet: it counts nothing
    events::open(parts, "rank 0", "rank-0");
    events::span("opened", "test", events::nowUs(), 0,
                 beforeOpen.addTo(events::Args().add("n", 1)));
    const long page = ::sysconf(_SC_PAGESIZE);
    {
      events::Scope s("touch", "test");
      s.countMinorFaults();
      char* p = static_cast<char*>(::mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (p == MAP_FAILED) ::_exit(1);
      for (size_t i = 0; i < kPages; ++i) p[i * page] = 1;
      ::munmap(p, kPages * page);
    }
    const events::FaultCount none;  // nothing touched in between
    events::span("quiet", "test", events::nowUs(), 0, none.addTo(events::Args()));
  });
  const std::string out = dir.path() + "/trace.json";
  mergeTimeline({.partsDir = parts, .output = out, .sinceUs = since});
  const json trace = readJson(out);
  const json* touch = findEvent(trace, "touch");
  const json* quiet = findEvent(trace, "quiet");
  const json* opened = findEvent(trace, "opened");
  REQUIRE(touch != nullptr);
  REQUIRE(quiet != nullptr);
  REQUIRE(opened != nullptr);
  CHECK((*opened)["args"] == json{{"n", 1}});
  CHECK((*touch)["args"]["minor_faults"].get<int64_t>() >= static_cast<int64_t>(kPages));
  CHECK((*quiet)["args"]["minor_faults"].get<int64_t>() < static_cast<int64_t>(kPages) / 8);
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
  // Rank 1 commits after each step (in-process recovery): counted apart from the steps.
  for (int seq = 0; seq < 4; ++seq) {
    ev.push_back({{"name", "commit"}, {"cat", "elastic"}, {"ph", "X"},
                  {"ts", 1'000'000 + seq * 100'000 + 6000}, {"dur", 250}, {"pid", 2}, {"tid", 7}});
  }
  const auto s = summarize(json{{"traceEvents", ev}});
  REQUIRE(s.ranks.size() == 3);
  CHECK(s.ranks[1].commits == 4);
  CHECK(s.ranks[1].commitUs == 1000);
  CHECK(s.ranks[0].commits == 0);
  CHECK(s.ranks[1].stepUs == s.ranks[0].stepUs - 4 * 100);  // its step spans, not its commits
  CHECK(s.comparedCollectives == 4);
  CHECK(s.straggler == 2);
  CHECK(s.ranks[2].lastArrivals == 4);
  CHECK(s.ranks[2].delayCausedUs == 4 * (5000 - 100));
  CHECK(s.ranks[0].waitUs == 4 * 5000);
  CHECK(s.ranks[2].waitUs == 0);
  const std::string text = formatSummary(s);
  CHECK_THAT(text, Catch::Contains("straggler: rank 2 (last to arrive at 4 of 4 collectives"));
  CHECK_THAT(text, Catch::Contains("commit s"));
  CHECK(summaryJson(s)["ranks"][1]["commit_us"] == 1000);

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

TEST_CASE("the summary skips events with mistyped fields, naming the first", "[timeline]") {
  // A trace edited by hand or written by another tool: each bad event is skipped and counted;
  // the good ones are still summarised (before, one mistyped 'seq' failed the whole summary).
  json ev = json::array();
  for (int pid = 1; pid <= 2; ++pid) {
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                  {"args", {{"name", "rank " + std::to_string(pid - 1)}}}});
  }
  for (int seq = 0; seq < 3; ++seq) {
    for (int rank = 0; rank < 2; ++rank) {
      ev.push_back({{"name", "allreduce"}, {"cat", "collective"}, {"ph", "X"},
                    {"ts", seq * 10000 + (rank == 1 ? 3000 : 0)}, {"dur", 4000},
                    {"pid", rank + 1}, {"tid", 1}, {"args", {{"seq", seq}, {"group", "g"}}}});
    }
  }
  const size_t good = ev.size();
  ev.push_back({{"name", "allreduce"}, {"cat", "collective"}, {"ph", "X"}, {"ts", 5},
                {"dur", 1}, {"pid", 1}, {"args", {{"seq", "x"}, {"group", "g"}}}});
  ev.push_back({{"name", "step"}, {"cat", "trainer"}, {"ph", "X"}, {"ts", 1e300}, {"pid", 1}});
  ev.push_back({{"name", 7}, {"ph", "X"}, {"ts", 1}, {"pid", 1}});
  ev.push_back({{"name", "x"}, {"ph", "X"}, {"ts", 1}, {"pid", "one"}});
  ev.push_back({{"name", "x"}, {"ph", "X"}, {"ts", 1}, {"dur", -5}, {"pid", 1}});
  ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 3}, {"args", "rank 9"}});
  ev.push_back("not an event");
  const auto s = summarize(json{{"traceEvents", ev}});
  CHECK(s.malformedEvents == 7);
  CHECK(s.firstMalformed == "event " + std::to_string(good) + ": args 'seq' is not an integer");
  REQUIRE(s.ranks.size() == 2);
  CHECK(s.comparedCollectives == 3);
  CHECK(s.straggler == 1);
  CHECK_THAT(formatSummary(s), Catch::Contains("skipped 7 malformed event(s), the first event " +
                                               std::to_string(good) + ": args 'seq'"));
  CHECK(summaryJson(s)["malformed_events"] == 7);
  // Fractional times are valid in the format and are summarised.
  json frac = json::array({{{"name", "process_name"}, {"ph", "M"}, {"pid", 1},
                            {"args", {{"name", "rank 0"}}}},
                           {{"name", "step"}, {"cat", "trainer"}, {"ph", "X"}, {"ts", 10.5},
                            {"dur", 2.25}, {"pid", 1}}});
  const auto f = summarize(json{{"traceEvents", frac}});
  CHECK(f.malformedEvents == 0);
  CHECK(f.ranks.at(0).steps == 1);
}

TEST_CASE("the clock offset is the minimum-round-trip sample's, its bound half that trip",
          "[timeline]") {
  using ddprun::rendezvous::ClockSample;
  using ddprun::rendezvous::estimateClockOffset;
  CHECK_FALSE(estimateClockOffset({}).has_value());
  CHECK_FALSE(estimateClockOffset({{.sentUs = 10, .serverUs = 5, .receivedUs = 9}}).has_value());
  // The server is 1000 us ahead; the second sample has the shortest trip (40 us).
  const auto c = estimateClockOffset({{.sentUs = 0, .serverUs = 1300, .receivedUs = 600},
                                      {.sentUs = 1000, .serverUs = 2025, .receivedUs = 1040},
                                      {.sentUs = 2000, .serverUs = 3100, .receivedUs = 2200}});
  REQUIRE(c.has_value());
  CHECK(c->rttUs == 40);
  CHECK(c->offsetUs == 2025 - 1020);
  CHECK(c->boundUs == 21);
  CHECK(c->samples == 3);
  // Epoch microseconds do not overflow.
  const int64_t t = 1'800'000'000'000'000;
  const auto e = estimateClockOffset({{.sentUs = t, .serverUs = t - 5'000'000, .receivedUs = t + 10}});
  REQUIRE(e.has_value());
  CHECK(e->offsetUs == -5'000'000 - 5);
}

TEST_CASE("CLOCK through a real store: this machine's offset to itself is 0 within the bound",
          "[timeline]") {
  using namespace ddprun::rendezvous;
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  TcpStore store({.host = "127.0.0.1", .port = server.port()});
  store.set("before", "intact");
  const auto c = measureClockOffset(store, 8);
  REQUIRE(c.has_value());
  CHECK(c->samples == 8);
  CHECK(c->rttUs >= 0);
  CHECK(c->boundUs >= 1);
  CHECK(std::llabs(c->offsetUs) <= c->boundUs);
  CHECK(store.get("before") == "intact");  // CLOCK changed nothing, the connection still works
  // A client of a torch server never sends it.
  TcpStore legacy({.host = "127.0.0.1", .port = server.port(), .dialect = StoreDialect::Legacy});
  CHECK_THROWS_WITH(legacy.serverClockUs(), Catch::Contains("CLOCK needs a ddprun store"));
}

namespace {
void writeLines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
}
}  // namespace

TEST_CASE("another node's bundle lands on the writer's axis with its offset and bound stated",
          "[timeline]") {
  TempDir dir("ddprun-timeline");
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  // Node a (the writer, the reference clock) and node b, whose clock is 5 s ahead: the same
  // moment is 1'000'000 on a and 6'000'000 on b. b's rank measured offset -5 s (+-30 us), its
  // agent a worse estimate (+-900 us): the node's best is used for all its tracks.
  writeLines(a + "/rank-0-1.jsonl",
             {R"({"track":"rank 0","pid":1,"start_us":900000})",
              R"({"name":"allreduce","cat":"collective","ph":"X","ts":1000000,"dur":50,"pid":1,"tid":1,"args":{"seq":0}})"});
  writeLines(b + "/agent-2.jsonl",
             {R"({"track":"agent 127.0.0.3","pid":2,"start_us":5800000})",
              R"({"clock":{"offset_us":-4999000,"bound_us":900,"rtt_us":1800,"samples":8,"reference":"127.0.0.2:1"},"ts":5900000})",
              R"({"name":"job end","cat":"agent","ph":"i","s":"t","ts":6000100,"pid":2,"tid":2,"args":{}})"});
  writeLines(b + "/rank-1-3.jsonl",
             {R"({"track":"rank 1","pid":3,"start_us":5850000})",
              R"({"clock":{"offset_us":-5000000,"bound_us":30,"rtt_us":60,"samples":8,"reference":"127.0.0.2:1"},"ts":5900000})",
              R"({"name":"allreduce","cat":"collective","ph":"X","ts":6000000,"dur":50,"pid":3,"tid":3,"args":{"seq":0}})",
              R"({"name":"late","cat":"x","ph":"i","s":"t","ts":6500000,"pid":3,"tid":3,"args":{}})"});
  const auto bundle = nodeBundle({.partsDir = b, .node = "agent 127.0.0.3"});
  CHECK(bundle.clockKnown);
  CHECK(bundle.events == 3);
  CHECK(bundle.droppedEvents == 0);

  const std::string out = dir.path() + "/t.json";
  const auto r = mergeTimeline({.partsDir = a, .output = out, .bundles = {{.text = bundle.text}, {.text = "not json"}},
                                .missingNodes = {"node rank 2"}});
  CHECK(r.tracks == 3);
  CHECK(r.badBundles == 1);
  CHECK(r.offsetBoundUs == 30);
  const json trace = readJson(out);
  int aligned = 0;  // both ranks' allreduce at a's 1'000'000 (b's 6'000'000)
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("name", "") == "allreduce" && e["ts"] == 1000000) ++aligned;
  }
  CHECK(aligned == 2);
  CHECK((*findEvent(trace, "job end"))["ts"] == 1000100);
  const json& other = trace["otherData"];
  CHECK(other["clock_offset_bound_us"] == 30);
  CHECK(other["nodes_missing"] == json::array({"node rank 2"}));
  std::map<std::string, json> info;
  for (const auto& t : other["tracks"]) info[t["track"]] = t;
  CHECK(info.at("rank 0")["clock_offset_us"] == 0);
  CHECK(info.at("rank 0")["clock_offset_bound_us"] == 0);
  CHECK(info.at("rank 1")["clock_offset_us"] == -5000000);
  CHECK(info.at("agent 127.0.0.3")["clock_offset_us"] == -5000000);
  CHECK(info.at("agent 127.0.0.3")["node"] == "agent 127.0.0.3");

  // A cap: the earliest events are kept, the rest counted, the bundle says so.
  const auto small = nodeBundle({.partsDir = b, .node = "agent 127.0.0.3", .capBytes = 4096 + 150});
  CHECK(small.droppedEvents >= 1);
  CHECK(small.events + small.droppedEvents == 3);
  const json sb = json::parse(small.text);
  CHECK(sb["dropped_events"] == small.droppedEvents);
  CHECK(sb["tracks"]["rank 1"][0]["ts"] == 6000000);  // the earliest is there
  CHECK(small.text.size() <= 4096 + 150);

  // A node whose processes measured nothing: its tracks are not shifted, and say so.
  std::filesystem::remove(b + "/agent-2.jsonl");
  writeLines(b + "/rank-1-3.jsonl",
             {R"({"track":"rank 1","pid":3,"start_us":5850000})",
              R"({"name":"allreduce","cat":"collective","ph":"X","ts":6000000,"dur":50,"pid":3,"tid":3,"args":{"seq":0}})"});
  const auto unknown = nodeBundle({.partsDir = b, .node = "agent 127.0.0.3"});
  CHECK_FALSE(unknown.clockKnown);
  mergeTimeline({.partsDir = a, .output = out, .bundles = {{.text = unknown.text}}});
  const json t2 = readJson(out);
  for (const auto& t : t2["otherData"]["tracks"]) {
    if (t["track"] == "rank 1") CHECK(t["clock_offset_us"].is_null());
  }
  CHECK(t2["otherData"]["unaligned_tracks"] == json::array({"rank 1"}));
  // ddprun-trace says so.
  const auto sum = summarize(trace);
  CHECK(sum.clockBoundUs == 30);
  CHECK(sum.missingNodes == std::vector<std::string>{"node rank 2"});
  CHECK_THAT(formatSummary(sum), Catch::Contains("within +-30 us") &&
                                     Catch::Contains("missing (sent no events): node rank 2"));
  CHECK_THAT(formatSummary(summarize(t2)),
             Catch::Contains("not aligned (no offset measured): rank 1"));
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
      << R"({"ph":"i","ts":1e300})" << "\n"                 // no float cast out of range
      << R"({"ph":"i","ts":9223372036854775807})" << "\n"   // past 2^53: sums would overflow
      << R"({"ph":"X","ts":4,"dur":-1})" << "\n"
      << R"({"ph":"i","ts":5,"tid":2,"name":"good"})" << "\n";
  }
  auto part = readPartFile(path, {});
  REQUIRE(part);
  CHECK(part->track == "rank 3");
  CHECK(part->startUs == 7);
  CHECK(part->skippedLines == 7);
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

TEST_CASE("bundles travel through a real store, and a node that sent none is named missing",
          "[timeline]") {
  using namespace ddprun::launcher::timeline;
  using namespace ddprun::rendezvous;
  TempDir dir("ddprun-timeline");
  writeLines(dir.path() + "/agent-7.jsonl",
             {R"({"track":"agent 127.0.0.3","pid":7,"start_us":1})",
              R"({"name":"job end","cat":"agent","ph":"i","s":"t","ts":5,"pid":7,"tid":7,"args":{}})"});
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const TcpStoreOptions store{.host = "127.0.0.1", .port = server.port()};
  TcpStore(store).set("before", "intact");
  CHECK(ship(store, bundleKey("job", 1), {.partsDir = dir.path(), .node = "agent 127.0.0.3"}));
  // Nodes 1 and 2 of 3 (node 0 collects): node 2 never ships.
  const Collected c = collect(store, "job", 3, std::chrono::milliseconds(300));
  REQUIRE(c.bundles.size() == 1);
  CHECK(json::parse(c.bundles[0].text)["node"] == "agent 127.0.0.3");
  CHECK(c.bundles[0].nodeRank == 1);
  CHECK(c.missing == std::vector<std::string>{"node rank 2"});
  CHECK(TcpStore(store).get("before") == "intact");
  // Another job's keys are not this one's.
  CHECK(collect(store, "other", 2, std::chrono::milliseconds(0)).missing.size() == 1);
  // No store at all: nothing shipped, nothing collected, no exception.
  const TcpStoreOptions nowhere{.host = "127.0.0.1", .port = 1, .connectTimeout = Millis(200)};
  CHECK_FALSE(ship(nowhere, bundleKey("job", 1), {.partsDir = dir.path(), .node = "x"}));
  CHECK(collect(nowhere, "job", 2, std::chrono::milliseconds(0)).missing.size() == 1);
}

TEST_CASE("a bundle holds only its node's tracks, with times and counts in range",
          "[timeline]") {
  using namespace ddprun::launcher::timeline;
  TempDir dir("ddprun-timeline");
  const std::string a = dir.path() + "/a";
  std::filesystem::create_directories(a);
  writeLines(a + "/agent-1.jsonl",
             {R"({"track":"agent 127.0.0.2","pid":1,"start_us":1})",
              R"({"name":"real","cat":"agent","ph":"i","s":"t","ts":10,"pid":1,"tid":1,"args":{}})"});
  const std::string claims = R"({"node":"agent 127.0.0.3","clock":{"offset_us":100,"bound_us":5},)"
                             R"("tracks":{"agent 127.0.0.3":[{"ph":"i","ts":1,"name":"own agent"}],)"
                             R"("rank 2":[{"ph":"i","ts":2,"name":"own rank"}],)"
                             R"("rank 0":[{"ph":"i","ts":3,"name":"forged"}],)"
                             R"("rank 02":[{"ph":"i","ts":3,"name":"forged"}],)"
                             R"("agent 127.0.0.2":[{"ph":"i","ts":3,"name":"forged"}]}})";
  const std::string ranges = R"({"node":"agent 127.0.0.4","clock":{"offset_us":9223372036854775807,"bound_us":1},)"
                             R"("dropped_events":18446744073709551615,"skipped_lines":-1,)"
                             R"("tracks":{"rank 3":[{"ph":"i","ts":9223372036854775807},)"
                             R"({"ph":"X","ts":4,"dur":-1},{"ph":"i","ts":4,"tid":1.5},)"
                             R"({"ph":1,"ts":4},{"ph":"i","ts":5,"name":"kept"}]}})";
  const std::string out = dir.path() + "/t.json";
  const auto r = mergeTimeline(
      {.partsDir = a, .output = out,
       .bundles = {{.from = "node rank 1", .text = claims, .firstRank = 2, .ranks = 1},
                   {.from = "node rank 2", .text = ranges, .firstRank = 3, .ranks = 1},
                   {.from = "node rank 3", .bytes = 99 << 20},
                   {.from = "node rank 4", .text = std::string(64, 'x'), .firstRank = 4,
                    .ranks = 1}},
       .maxBundleBytes = 32});
  CHECK(r.badBundles == 4);  // every one is over 32 bytes (node rank 3's was not even kept)
  REQUIRE(r.refused.size() == 4);
  CHECK_THAT(r.refused[2], Catch::Contains("node rank 3: 103809024 bytes, over the 0 MiB"));
  const auto r2 = mergeTimeline(
      {.partsDir = a, .output = out,
       .bundles = {{.from = "node rank 1", .text = claims, .firstRank = 2, .ranks = 1},
                   {.from = "node rank 2", .text = ranges, .firstRank = 3, .ranks = 1}}});
  CHECK(r2.badBundles == 0);
  CHECK(r2.refusedTracks == 3);  // rank 0, rank 02, the writer's agent
  const json trace = readJson(out);
  std::map<std::string, std::vector<std::string>> names;
  std::map<int64_t, std::string> track;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") track[e["pid"]] = e["args"]["name"];
  }
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "M") names[track[e["pid"]]].push_back(e.value("name", ""));
  }
  CHECK(names["agent 127.0.0.2"] == std::vector<std::string>{"real"});
  CHECK(names["agent 127.0.0.3"] == std::vector<std::string>{"own agent"});
  CHECK(names["rank 2"] == std::vector<std::string>{"own rank"});
  CHECK(names["rank 3"] == std::vector<std::string>{"kept"});
  CHECK(names.count("rank 0") == 0);
  const json& other = trace["otherData"];
  CHECK(other["unaligned_tracks"] == json::array({"rank 3"}));  // its offset was out of range
  CHECK(other["skipped_lines"] == 4);
  CHECK(other["other_nodes"][1]["dropped_events"] == 0);
  CHECK(other["refused"].size() == 4);
}
