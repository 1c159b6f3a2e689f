// The progress watch (--stall-warning): the pure tracker, and the real ddprun watching real
// workers that report progress through the real progress file, one of them stopped from outside
// with SIGSTOP or sleeping.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <regex>
#include <thread>

#include "ddprun_process.h"
#include "base/progress_file.h"
#include "launcher/progress_watch.h"

using namespace ddprun::testing;
using namespace ddprun::launcher;
using namespace std::chrono_literals;

namespace {

const std::string kWorker = std::string(DDPRUN_BIN_DIR) + "/progress_worker";

SteadyTime at(double seconds) {
  return SteadyTime(std::chrono::duration_cast<SteadyTime::duration>(
      std::chrono::duration<double>(seconds)));
}

int countOf(const std::string& text, const std::regex& re) {
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), re),
                                        std::sregex_iterator()));
}

}  // namespace

TEST_CASE("the tracker warns once past the threshold then with backoff then on resume",
          "[launcher][progress]") {
  StallTracker t(StallPolicy{.thresholdSeconds = 1.0});
  CHECK_FALSE(t.observe(at(0), {.steps = 0}));
  CHECK_FALSE(t.observe(at(30), {.steps = 0}));  // not stepping yet: start-up is not watched
  CHECK_FALSE(t.observe(at(31), {.steps = 1}));
  CHECK_FALSE(t.observe(at(31.9), {.steps = 1}));
  auto e = t.observe(at(32.1), {.steps = 1, .waiting = 1});
  REQUIRE(e);
  CHECK(e->kind == StallTracker::Event::Kind::Stalled);
  CHECK(e->seconds == Approx(1.1));
  CHECK(e->waiting);
  CHECK_FALSE(t.observe(at(32.5), {.steps = 1}));  // one line, not one per sample
  CHECK_FALSE(t.observe(at(32.9), {.steps = 1}));
  e = t.observe(at(33.1), {.steps = 1});  // 2 x the threshold
  REQUIRE(e);
  CHECK(e->seconds == Approx(2.1));
  CHECK_FALSE(t.observe(at(34.5), {.steps = 1}));
  REQUIRE(t.observe(at(35.2), {.steps = 1}));  // 4 x
  CHECK_FALSE(t.observe(at(38.9), {.steps = 1}));
  e = t.observe(at(39.0), {.steps = 2});
  REQUIRE(e);
  CHECK(e->kind == StallTracker::Event::Kind::Resumed);
  CHECK(e->seconds == Approx(8.0));
  CHECK_FALSE(t.observe(at(39.4), {.steps = 3}));
  CHECK_FALSE(t.observe(at(40.3), {.steps = 3}));
  REQUIRE(t.observe(at(40.5), {.steps = 3}));  // a new stall: the first line again at 1 s
}

TEST_CASE("auto: a multiple of the recent step time and never below the floor",
          "[launcher][progress]") {
  StallTracker t(StallPolicy{});  // auto
  double now = 0;
  uint64_t steps = 1;
  t.observe(at(now), {.steps = steps});
  for (int i = 0; i < 20; ++i) {  // 0.5 s per step
    now += 0.5;
    CHECK_FALSE(t.observe(at(now), {.steps = ++steps}));
  }
  CHECK(t.stepSeconds() == Approx(0.5));
  CHECK(t.threshold() == Approx(5.0));
  CHECK_FALSE(t.observe(at(now + 4.9), {.steps = steps}));
  auto e = t.observe(at(now + 5.1), {.steps = steps});
  REQUIRE(e);
  CHECK(e->thresholdSeconds == Approx(5.0));
  CHECK(e->stepSeconds == Approx(0.5));

  StallTracker fast(StallPolicy{});
  now = 0;
  steps = 1;
  fast.observe(at(now), {.steps = steps});
  for (int i = 0; i < 10; ++i) {  // 100 steps of 10 ms between samples
    now += 1.0;
    steps += 100;
    fast.observe(at(now), {.steps = steps});
  }
  CHECK(fast.stepSeconds() == Approx(0.01));
  CHECK(fast.threshold() == Approx(StallPolicy::kAutoFloor));
  const std::string line = describeStall(*fast.observe(at(now + 3.5), {.steps = steps}), 5, 1, 2,
                                         "host-b", 4242);
  CHECK(line == "rank 5 on node 2 (host-b, local rank 1, pid 4242) has made no progress for "
                "3.5 s (step 1001; its recent steps took 0.01 s; warning after 3.0 s)");
}

TEST_CASE("the progress table: one record per local rank, reset in place, bad slots report nothing",
          "[launcher][progress]") {
  namespace progress = ddprun::progress;
  TempDir dir;
  const std::string path = dir / "progress";
  progress::writeProgressTable(path, 3);
  progress::ProgressWriter w0(path, 0), w2(path, 2), past(path, 3), negative(path, -1);
  CHECK(w0.active());
  CHECK(w2.active());
  CHECK_FALSE(past.active());      // beyond the table: no record to map
  CHECK_FALSE(negative.active());
  w0.step();
  for (int i = 0; i < 5; ++i) w2.step();
  w2.enterWait();
  past.step();  // no-ops
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  auto r0 = progress::readProgressRecord(fd, 0), r1 = progress::readProgressRecord(fd, 1),
       r2 = progress::readProgressRecord(fd, 2);
  REQUIRE(r0);
  REQUIRE(r1);
  REQUIRE(r2);
  CHECK(r0->steps == 1);
  CHECK(r1->steps == 0);  // nobody wrote slot 1: the others' steps did not leak into it
  CHECK(r2->steps == 5);
  CHECK(r2->waiting == 1);
  CHECK_FALSE(progress::readProgressRecord(fd, 3));   // past the end
  CHECK_FALSE(progress::readProgressRecord(fd, -1));
  // The next round: the same file, the records zeroed in place (the inode stays: a writer of
  // the old round that still maps it would write into the new round's record, which is why
  // the agent rewrites the table only once the old group is gone).
  struct stat before {}, after {};
  REQUIRE(::fstat(fd, &before) == 0);
  progress::writeProgressTable(path, 3);
  REQUIRE(::stat(path.c_str(), &after) == 0);
  CHECK(before.st_ino == after.st_ino);
  CHECK(progress::readProgressRecord(fd, 2)->steps == 0);
  CHECK(progress::readProgressRecord(fd, 2)->waiting == 0);
  // Not a table: a record without the magic.
  const uint64_t junk = 42;
  const int wfd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(wfd >= 0);
  REQUIRE(::pwrite(wfd, &junk, 8, 32) == 8);
  ::close(wfd);
  CHECK_FALSE(progress::readProgressRecord(fd, 1));
  CHECK_FALSE(progress::ProgressWriter(path, 1).active());
  ::close(fd);
}

TEST_CASE("a worker stopped from outside is named once per backoff step and the others are not",
          "[launcher][progress][slow]") {
  // Default threshold (auto: 10 x ~20 ms steps, at least 3 s). Rank 1 is SIGSTOPped for 7 s:
  // warnings at 3 s and 6 s, then one line when it moves again.
  Ddprun d({"--standalone", "--nproc-per-node=2", kWorker, "400", "20"});
  std::smatch m;
  const std::regex pidLine(R"(rank 1 pid (\d+) progress reported)");
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::string out;
  while (!std::regex_search(out = d.out(), m, pidLine)) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(20ms);
  }
  const pid_t pid = std::stoi(m[1]);
  std::this_thread::sleep_for(1s);  // it steps for a while: the watch knows its step time
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  std::this_thread::sleep_for(7s);
  REQUIRE(::kill(pid, SIGCONT) == 0);
  CHECK(d.wait() == 0);
  const std::string err = d.err();
  INFO(err);
  const std::regex stalled("rank 1 on node 0 \\([^,]+, local rank 1, pid " + std::to_string(pid) +
                           "\\) has made no progress for ([0-9.]+) s");
  CHECK(countOf(err, stalled) == 2);
  REQUIRE(std::regex_search(err, m, stalled));
  CHECK(std::stod(m[1]) >= 3.0);
  CHECK_THAT(err, Catch::Contains("warning after 3.0 s"));
  CHECK_THAT(err, Catch::Contains("rank 1 on node 0"));
  CHECK_THAT(err, Catch::Contains("progresses again after"));
  CHECK_THAT(err, !Catch::Contains("rank 0 on node 0"));
}

TEST_CASE("the stall-warning flag sets the threshold and a worker that progresses gets no line",
          "[launcher][progress][slow]") {
  // Rank 0 sleeps 2.6 s before its step 10; 1 s threshold: lines at 1 s and 2 s.
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--stall-warning=1", kWorker, "40",
                      "10", "0", "10", "2.6"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(countOf(r.err, std::regex("rank 0 on node 0 .* has made no progress for")) >= 2);
  CHECK_THAT(r.err, Catch::Contains("warning after 1.0 s"));
  CHECK_THAT(r.err, !Catch::Contains("rank 1 on node 0"));

  // Both progressing: nothing; with 0 the workers get no progress file at all.
  r = runDdprun({"--standalone", "--nproc-per-node=2", kWorker, "100", "10"});
  CHECK(r.code == 0);
  CHECK_THAT(r.err, !Catch::Contains("no progress"));
  CHECK_THAT(r.out, Catch::Contains("rank 0 pid"));
  CHECK_THAT(r.out, !Catch::Contains("not reported"));
  r = runDdprun({"--standalone", "--nproc-per-node=2", "--stall-warning=0", "--peer-timeout=0",
                  kWorker, "5", "1"});
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("rank 1 pid"));
  CHECK_THAT(r.out, Catch::Contains("not reported"));
  // The file stays for --peer-timeout alone; no stall lines then.
  r = runDdprun({"--standalone", "--nproc-per-node=2", "--stall-warning=0", kWorker, "--heartbeat",
                 "20", "10"});
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("rank 1 pid"));
  CHECK_THAT(r.out, !Catch::Contains("not reported"));
  CHECK_THAT(r.out, Catch::Contains("heartbeat 500 ms"));  // 5 s default: a tenth, at most 500
  CHECK_THAT(r.err, !Catch::Contains("no progress"));

  r = runDdprun({"--standalone", "--stall-warning=soon", kWorker, "1", "1"});
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Catch::Contains("--stall-warning"));
  CHECK_THAT(r.err, Catch::Contains("soon"));
  CHECK_THAT(r.err, Catch::Contains("expected auto, 0 (off) or a number of seconds"));
}

// ---- --peer-timeout: frozen, not slow ----

namespace {

// A process that is gone or a zombie (PID 1 may reap late) is dead.
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

// The pid the worker of `rank` printed in attempt `attempt` (its n-th "rank R pid P" line).
pid_t waitForPid(Ddprun& d, int rank, int attempt = 0) {
  const std::regex line("rank " + std::to_string(rank) + R"( pid (\d+) progress)");
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    const std::string out = d.out();
    int seen = 0;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), line);
         it != std::sregex_iterator(); ++it) {
      if (seen++ == attempt) return std::stoi((*it)[1]);
    }
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(20ms);
  }
}

}  // namespace

TEST_CASE("the heartbeat tracker fires once after the timeout and never without a heartbeat",
          "[launcher][progress]") {
  HeartbeatTracker t(FreezePolicy{.timeoutSeconds = 1.0});
  CHECK_FALSE(t.observe(at(0), 0));
  CHECK_FALSE(t.observe(at(100), 0));  // no heartbeat announced: never
  CHECK_FALSE(t.observe(at(100.1), 1));
  CHECK_FALSE(t.observe(at(101.0), 1));
  auto silent = t.observe(at(101.2), 1);
  REQUIRE(silent);
  CHECK(*silent == Approx(1.1));
  CHECK_FALSE(t.observe(at(105), 1));  // once
  CHECK_FALSE(t.observe(at(105.1), 2));  // beating again: watched anew
  CHECK_FALSE(t.observe(at(106.0), 2));
  CHECK(t.observe(at(106.2), 2));

  HeartbeatTracker off(FreezePolicy{.timeoutSeconds = 0});
  CHECK_FALSE(off.observe(at(0), 1));
  CHECK_FALSE(off.observe(at(1000), 1));

  CHECK(FreezePolicy::heartbeatPeriodMs(5) == 500);
  CHECK(FreezePolicy::heartbeatPeriodMs(1) == 100);
  CHECK(FreezePolicy::heartbeatPeriodMs(0.05) == 10);
  CHECK(FreezePolicy::heartbeatPeriodMs(0) == 0);
}

TEST_CASE("a worker SIGSTOPped with its heartbeat on is killed, named, and the job restarts "
          "and finishes", "[launcher][progress][peer-timeout]") {
  Ddprun d({"--standalone", "--nproc-per-node=2", "--max-restarts=1", "--peer-timeout=1",
            kWorker, "--heartbeat", "150", "20"});
  const pid_t rank0 = waitForPid(d, 0);
  const pid_t pid = waitForPid(d, 1);
  std::this_thread::sleep_for(300ms);  // it beats for a while
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  const pid_t second = waitForPid(d, 1, 1);  // the restarted group's rank 1
  CHECK(second != pid);
  CHECK(d.wait() == 0);
  const std::string err = d.err();
  INFO(err);
  std::smatch m;
  const std::regex named("rank 1 \\(local rank 1, pid " + std::to_string(pid) +
                         "\\) on node 0 stopped answering: no heartbeat for ([0-9.]+) s "
                         "\\(--peer-timeout=1\\); it is stopped or frozen, not slow");
  REQUIRE(std::regex_search(err, m, named));
  CHECK(std::stod(m[1]) >= 1.0);
  CHECK(countOf(err, std::regex("stopped answering")) == 1);
  CHECK_THAT(err, Catch::Contains("restarting the worker group after rank 1 failed (signal 9 "
                                  "(SIGKILL) sent by ddprun: no heartbeat for"));
  CHECK_THAT(err, !Catch::Contains("rank 0 (local rank 0, pid"));  // only the frozen one named
  CHECK_FALSE(alive(pid));
  // Only the frozen worker was killed: rank 0 was stopped as a survivor, with SIGTERM.
  CHECK_THAT(d.out(), Catch::Contains("rank 0 pid " + std::to_string(rank0) + " got SIGTERM"));
}

TEST_CASE("a worker asleep in a long step with its heartbeat on is not killed",
          "[launcher][progress][peer-timeout]") {
  // Rank 1 sleeps 3 s (6 x the peer timeout) before its step 5: its heartbeat goes on.
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--peer-timeout=0.5", kWorker,
                      "--heartbeat", "10", "20", "1", "5", "3"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("heartbeat 50 ms"));
  CHECK_THAT(r.err, !Catch::Contains("stopped answering"));
  CHECK_THAT(r.err, !Catch::Contains("restarting"));
}

TEST_CASE("a worker without a heartbeat is never killed for silence, even stopped",
          "[launcher][progress][peer-timeout]") {
  // No --heartbeat: a program that does not use the runtime (a Python script, say). Rank 1 is
  // SIGSTOPped for 2.5 s (5 x the peer timeout), then continued: the job succeeds.
  Ddprun d({"--standalone", "--nproc-per-node=2", "--peer-timeout=0.5", kWorker, "150", "20"});
  const pid_t pid = waitForPid(d, 1);
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  std::this_thread::sleep_for(2500ms);
  REQUIRE(::kill(pid, SIGCONT) == 0);
  CHECK(d.wait() == 0);
  const std::string err = d.err();
  INFO(err);
  CHECK_THAT(err, !Catch::Contains("stopped answering"));
  CHECK_THAT(err, !Catch::Contains("restarting"));
  CHECK_THAT(d.out(), Catch::Contains("heartbeat 0 ms"));
}

TEST_CASE("the peer-timeout flag refuses what it cannot use, naming it",
          "[launcher][progress][peer-timeout]") {
  for (const char* bad : {"0.05", "soon", "-1"}) {
    auto r = runDdprun({"--standalone", std::string("--peer-timeout=") + bad, kWorker, "1", "1"});
    INFO(bad << ": " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(std::string("--peer-timeout=") + bad));
    CHECK_THAT(r.err, Catch::Contains("expected 0 (off) or a number of seconds >= 0.1"));
  }
  // 0: off; a heartbeat worker then has no heartbeat at all.
  auto r = runDdprun({"--standalone", "--peer-timeout=0", kWorker, "--heartbeat", "2", "1"});
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("heartbeat 0 ms"));
}
