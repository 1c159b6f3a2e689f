// The real ddprun binary supervising real processes: exit codes, restarts, signals, and no
// orphan when ddprun itself is SIGKILLed.
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <algorithm>

#include "ddprun_process.h"

using namespace ddprun::testing;

TEST_CASE("a worker's exit code is ddprun's exit code", "[launcher][cli]") {
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                      "if [ $RANK = 1 ]; then exit 3; fi; sleep 30"});
  CHECK(r.code == 3);
  CHECK_THAT(r.err, Catch::Contains("Root cause (first observed failure)"));
  CHECK_THAT(r.err, Catch::Contains("rank       : 1 (local rank 1)"));
  CHECK_THAT(r.err, Catch::Contains("exit code 3 -> ddprun exits with 3"));
  // The other worker was stopped, not left to sleep for 30 s.
  CHECK_THAT(r.err, Catch::Contains("signal 15 (SIGTERM) (ended after ddprun sent SIGTERM)"));
}

TEST_CASE("a worker killed by SIGKILL makes ddprun exit 137", "[launcher][cli]") {
  // $$$$ reaches the shell as $$: torchrun's macro rules turn $$ into $.
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                      "if [ $RANK = 0 ]; then kill -9 $$$$; fi; sleep 30"});
  CHECK(r.code == 137);
  CHECK_THAT(r.err, Catch::Contains("signal 9 (SIGKILL) -> ddprun exits with 137"));
}

TEST_CASE("success: every worker exits 0", "[launcher][cli]") {
  auto r = runDdprun({"--standalone", "--nproc-per-node=4", "true"});
  CHECK(r.code == 0);
  CHECK(r.err.find("FAILED") == std::string::npos);
}

TEST_CASE("the group restarts up to --max-restarts, then the job fails", "[launcher][cli]") {
  TempDir dir;
  const std::string log = dir / "attempts";
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--max-restarts=2", "sh", "-c",
                      "echo \"$TORCHELASTIC_RESTART_COUNT $RANK $TORCHELASTIC_MAX_RESTARTS\" >> " +
                          log +
                          "; [ $RANK = 0 ] && exec sleep 30; "
                          // rank 1 fails once rank 0 has written its line
                          "until grep -q \"^$TORCHELASTIC_RESTART_COUNT 0\" " + log +
                          "; do sleep 0.01; done; exit 4"});
  CHECK(r.code == 4);
  auto attempts = lines(readFile(log));
  std::sort(attempts.begin(), attempts.end());
  // Three attempts (0, 1, 2), each with both ranks, each told the restart count.
  CHECK(attempts == std::vector<std::string>{"0 0 2", "0 1 2", "1 0 2", "1 1 2", "2 0 2", "2 1 2"});
  CHECK_THAT(r.err, Catch::Contains("restart 1 of 2"));
  CHECK_THAT(r.err, Catch::Contains("restart 2 of 2"));
  CHECK_THAT(r.err, Catch::Contains("FAILED (attempt 2, 2 of 2 restarts used)"));
}

TEST_CASE("a restarted group that succeeds ends the job with 0", "[launcher][cli]") {
  TempDir dir;
  const std::string log = dir / "attempts";
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--max-restarts=3", "sh", "-c",
                      "echo $TORCHELASTIC_RESTART_COUNT >> " + log +
                          "; [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 0 ] && exit 1; "
                          "exit 0"});
  CHECK(r.code == 0);
  auto attempts = lines(readFile(log));
  CHECK(std::count(attempts.begin(), attempts.end(), "1") == 2);
  CHECK(std::count(attempts.begin(), attempts.end(), "2") == 0);
}

TEST_CASE("recovery in-process asked for: a program without the runtime still gets a restart",
          "[launcher][cli][recovery]") {
  TempDir dir;
  const std::string log = dir / "attempts";
  // Rank 1 dies in the first attempt; the other rank is still running then (it sleeps), and
  // nothing announced in-process recovery (no runtime): the whole group restarts.
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--max-restarts=1",
                      "--recovery=in-process", "sh", "-c",
                      "echo $TORCHELASTIC_RESTART_COUNT.$RANK.$DDPRUN_RECOVERY >> " + log +
                          "; [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ] && exit 3; "
                          "sleep 0.5; exit 0"});
  INFO(r.err);
  CHECK(r.code == 0);
  // (Rank 0 of attempt 0 may be stopped before its shell wrote its line.)
  auto attempts = lines(readFile(log));
  auto has = [&](const char* a) { return std::count(attempts.begin(), attempts.end(), a) == 1; };
  CHECK(has("0.1.in-process"));
  CHECK(has("1.0.in-process"));
  CHECK(has("1.1.in-process"));
  CHECK_THAT(r.err, Catch::Contains("--recovery=in-process: rank 1 had not announced in-process "
                                    "recovery"));
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed"));
  CHECK_THAT(r.err, !Catch::Contains("recovering in process"));
}

TEST_CASE("a single rank under --recovery=in-process: one line at the start says a death "
          "restarts it, and the death's line names no survivor as the reason",
          "[launcher][cli][recovery]") {
  TempDir dir;
  const std::string log = dir / "attempts";
  auto r = runDdprun({"--standalone", "--nproc-per-node=1", "--max-restarts=1",
                      "--recovery=in-process", "sh", "-c",
                      "echo $TORCHELASTIC_RESTART_COUNT.$RANK >> " + log +
                          "; [ $TORCHELASTIC_RESTART_COUNT = 0 ] && exit 3; exit 0"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK((lines(readFile(log)) == std::vector<std::string>{"0.0", "1.0"}));
  CHECK_THAT(r.err, Catch::Contains("--recovery=in-process: no in-process recovery while the job "
                                    "has a single rank (world size 1)"));
  CHECK_THAT(r.err, Catch::Contains("--recovery=in-process: no worker survived to heal a "
                                    "replacement from; restarting the group instead"));
  CHECK_THAT(r.err, !Catch::Contains("had not announced"));
}

TEST_CASE("the recovery flag takes restart, in-process or auto", "[launcher][cli][recovery]") {
  auto r = runDdprun({"--standalone", "--recovery=sometimes", "true"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("--recovery=sometimes: expected one of restart, in-process, auto"));
}

TEST_CASE("the recovery-policy flag: a bad value is refused naming it, and shrink under "
          "--recovery=restart says it has no effect", "[launcher][cli][recovery]") {
  auto bad = runDdprun({"--standalone", "--recovery-policy=grow", "true"});
  CHECK(bad.code != 0);
  CHECK_THAT(bad.err, Catch::Contains("--recovery-policy=grow: expected replace, shrink or "
                                      "shrink:MIN_RANKS"));
  auto r = runDdprun({"--standalone", "--recovery=restart", "--recovery-policy=shrink", "true"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK_THAT(r.err, Catch::Contains("--recovery-policy=shrink has no effect with "
                                    "--recovery=restart: every worker's death restarts the group"));
}

TEST_CASE("the spares flag takes a whole number from 0 to 64", "[launcher][cli][recovery]") {
  for (const char* bad : {"-1", "two", "65", "1.5"}) {
    auto r = runDdprun({"--standalone", std::string("--spares=") + bad, "true"});
    INFO(bad << ": " << r.err);
    CHECK(r.code != 0);
    CHECK_THAT(r.err, Catch::Contains(std::string("--spares=") + bad + ": expected a whole number "
                                      "of hot spares per node from 0 to 64"));
  }
}

TEST_CASE("spares under --recovery=restart: one line says why, none is started",
          "[launcher][cli][recovery]") {
  TempDir dir;
  const std::string log = dir / "starts";
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--recovery=restart", "--spares=1",
                      "sh", "-c", "echo \"$RANK.$DDPRUN_SPARE\" >> " + log + "; sleep 0.3"});
  INFO(r.err);
  CHECK(r.code == 0);
  auto starts = lines(readFile(log));
  std::sort(starts.begin(), starts.end());
  CHECK((starts == std::vector<std::string>{"0.", "1."}));
  CHECK_THAT(r.err, Catch::Contains("--spares=1: no spares for this job: they take a dead "
                                    "worker's rank only in an in-process recovery, and this job "
                                    "runs with --recovery=restart"));
}

TEST_CASE("a program without the runtime never gets a spare", "[launcher][cli][recovery]") {
  TempDir dir;
  const std::string log = dir / "starts";
  // --recovery=auto: spares start once every worker announced in-process recovery, which a
  // shell worker never does; none of its processes runs without a rank.
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--spares=2", "sh", "-c",
                      "echo \"${RANK:-none}.${DDPRUN_SPARE:-worker}\" >> " + log + "; sleep 0.5"});
  INFO(r.err);
  CHECK(r.code == 0);
  auto starts = lines(readFile(log));
  std::sort(starts.begin(), starts.end());
  CHECK((starts == std::vector<std::string>{"0.worker", "1.worker"}));
  CHECK_THAT(r.err, !Catch::Contains("spare"));
}

namespace {

// Workers that record the signal they get in DIR/sig.<rank>, after announcing DIR/ready.<rank>.
std::string trappingWorker(const TempDir& dir) {
  return "for s in TERM INT HUP QUIT; do trap \"echo $s > " + dir.path() +
         "/sig.$RANK; exit 0\" $s; done; touch " + dir.path() +
         "/ready.$RANK; while true; do sleep 0.05; done";
}

bool allReady(const TempDir& dir, int n) {
  for (int r = 0; r < n; ++r) {
    if (!std::filesystem::exists(dir / ("ready." + std::to_string(r)))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("SIGTERM, SIGINT, SIGHUP and SIGQUIT are forwarded to every worker",
          "[launcher][cli][signals]") {
  for (auto [sig, name] : {std::pair{SIGTERM, "TERM"}, std::pair{SIGINT, "INT"},
                           std::pair{SIGHUP, "HUP"}, std::pair{SIGQUIT, "QUIT"}}) {
    INFO(name);
    TempDir dir;
    Ddprun d({"--standalone", "--nproc-per-node=3", "sh", "-c", trappingWorker(dir)});
    REQUIRE(waitUntil([&] { return allReady(dir, 3); }));
    d.signal(sig);
    CHECK(d.wait() == 128 + sig);
    for (int r = 0; r < 3; ++r) CHECK(readFile(dir / ("sig." + std::to_string(r))) == name + std::string("\n"));
  }
}

TEST_CASE("workers that ignore the stop signal get SIGKILL after --shutdown-timeout",
          "[launcher][cli][signals]") {
  TempDir dir;
  Ddprun d({"--standalone", "--nproc-per-node=2", "--shutdown-timeout=0.3", "sh", "-c",
            "trap '' TERM; echo $$$$ > " + dir.path() + "/pid.$RANK; while true; do sleep 0.05; done"});
  REQUIRE(waitUntil([&] {
    return std::filesystem::exists(dir / "pid.0") && std::filesystem::exists(dir / "pid.1") &&
           !readFile(dir / "pid.0").empty() && !readFile(dir / "pid.1").empty();
  }));
  d.signal(SIGTERM);
  CHECK(d.wait() == 143);
  CHECK_THAT(d.err(), Catch::Contains("still running 0.3 s after the stop signal: sending SIGKILL"));
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = std::stoi(readFile(dir / ("pid." + std::to_string(r))));
    CHECK_FALSE(processRunning(pid));
  }
}

TEST_CASE("a stopped (SIGSTOP) worker gets the stop signal too, not SIGKILL after the grace",
          "[launcher][cli][signals]") {
  // A stop signal sent to a stopped process stays pending until it is continued: ddprun sends
  // SIGCONT after it, so a frozen worker ends by SIGTERM at once instead of holding the job
  // for --shutdown-timeout (60 s here) and then being killed.
  TempDir dir;
  Ddprun d({"--standalone", "--nproc-per-node=2", "--shutdown-timeout=60", "--peer-timeout=0",
            "sh", "-c", "echo $$$$ > " + dir.path() + "/pid.$RANK.tmp; mv " + dir.path() +
                            "/pid.$RANK.tmp " + dir.path() + "/pid.$RANK; exec sleep 1000"});
  REQUIRE(waitUntil([&] {
    return std::filesystem::exists(dir / "pid.0") && std::filesystem::exists(dir / "pid.1");
  }));
  const pid_t frozen = std::stoi(readFile(dir / "pid.1"));
  REQUIRE(::kill(frozen, SIGSTOP) == 0);
  REQUIRE(waitUntil([&] { return processState(frozen) == 'T'; }));
  d.signal(SIGTERM);
  CHECK(d.wait(std::chrono::seconds(20)) == 143);  // far less than the 60 s grace
  CHECK_THAT(d.err(), !Catch::Contains("sending SIGKILL"));
  CHECK_FALSE(processRunning(frozen));
}

TEST_CASE("a second signal kills the workers at once", "[launcher][cli][signals]") {
  TempDir dir;
  Ddprun d({"--standalone", "--nproc-per-node=2", "sh", "-c",
            "trap '' INT; touch " + dir.path() + "/ready.$RANK; while true; do sleep 0.05; done"});
  REQUIRE(waitUntil([&] { return allReady(dir, 2); }));
  d.signal(SIGINT);
  REQUIRE(waitUntil([&] { return d.err().find("forwarding it to the workers") != std::string::npos; }));
  d.signal(SIGINT);
  CHECK(d.wait(std::chrono::seconds(10)) == 130);  // far less than the 30 s grace
  CHECK_THAT(d.err(), Catch::Contains("again: killing the workers now"));
}

TEST_CASE("no worker and no grandchild survives ddprun's SIGKILL by more than a second",
          "[launcher][cli][orphans]") {
  // Orphans are re-parented to this test process, so it can reap them and check by pid.
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  TempDir dir;
  Ddprun d({"--standalone", "--nproc-per-node=2", "sh", "-c",
            "sleep 300 & echo $! > " + dir.path() + "/grandchild.$RANK; echo $$$$ > " +
                dir.path() + "/worker.$RANK; wait"});
  std::vector<pid_t> pids;
  REQUIRE(waitUntil([&] {
    for (const char* kind : {"worker.0", "worker.1", "grandchild.0", "grandchild.1"}) {
      if (readFile(dir / kind).empty()) return false;
    }
    return true;
  }));
  for (const char* kind : {"worker.0", "worker.1", "grandchild.0", "grandchild.1"}) {
    pids.push_back(std::stoi(readFile(dir / kind)));
  }
  for (pid_t p : pids) REQUIRE(processRunning(p));
  d.signal(SIGKILL);
  CHECK(d.wait() == 137);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  for (pid_t p : pids) {
    INFO("pid " << p);
    CHECK_FALSE(processRunning(p));
  }
}

TEST_CASE("a guard killed from outside takes its worker down and fails the job",
          "[launcher][cli][orphans]") {
  TempDir dir;
  Ddprun d({"--standalone", "--nproc-per-node=2", "sh", "-c",
            "echo $PPID > " + dir.path() + "/guard.$RANK; echo $$$$ > " + dir.path() +
                "/worker.$RANK; while true; do sleep 0.05; done"});
  REQUIRE(waitUntil([&] { return !readFile(dir / "worker.1").empty() && !readFile(dir / "guard.1").empty(); }));
  const pid_t guard = std::stoi(readFile(dir / "guard.1"));
  const pid_t worker = std::stoi(readFile(dir / "worker.1"));
  CHECK(readFile("/proc/" + std::to_string(guard) + "/comm") == "ddprun-guard\n");
  ::kill(guard, SIGKILL);
  CHECK(d.wait() == 137);
  CHECK_THAT(d.err(), Catch::Contains("its guard process died"));
  CHECK_FALSE(processRunning(worker));
}

TEST_CASE("a PROGRAM that does not exist: 127 and one line", "[launcher][cli]") {
  auto r = runDdprun({"--standalone", "no-such-program-for-ddprun"});
  CHECK(r.code == 127);
  CHECK(r.err == "ddprun: PROGRAM 'no-such-program-for-ddprun' was not found on PATH\n");
}

TEST_CASE("two --standalone jobs at once get different free ports", "[launcher][cli]") {
  TempDir dir;
  auto worker = [&](const char* job) {
    return std::vector<std::string>{"--standalone", "--nproc-per-node=2", "sh", "-c",
                                    "echo $MASTER_PORT > " + dir.path() + "/" + job +
                                        ".$RANK; sleep 0.3"};
  };
  Ddprun a(worker("a")), b(worker("b"));
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
  CHECK(readFile(dir / "a.0") == readFile(dir / "a.1"));
  CHECK(readFile(dir / "a.0") != readFile(dir / "b.0"));
}

TEST_CASE("a static job whose port is taken fails with a hint", "[launcher][cli]") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  auto r = runDdprun({"--master-port=" + port, "true"});
  ::close(fd);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot listen on 127.0.0.1:" + port));
  CHECK_THAT(r.err, Catch::Contains("--standalone"));
}

TEST_CASE("a worker whose execve fails is reported with the reason", "[launcher][cli]") {
  TempDir dir;
  const std::string script = dir / "no-shebang";
  std::ofstream(script) << "echo this file has no #! line\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", script});
  CHECK(r.code == 127);
  CHECK_THAT(r.err, Catch::Contains("could not execute: Exec format error"));
}

TEST_CASE("workers stopped while still starting are stopped and not left for the grace period",
          "[launcher][cli][signals]") {
  // Rank 0 fails at once, often before the guards of the last ranks have forked their
  // workers: a stop signal sent then must still reach them (the grace period is 30 s).
  for (int i = 0; i < 8; ++i) {
    INFO("run " << i);
    Ddprun d({"--standalone", "--nproc-per-node=6", "sh", "-c",
              "[ $RANK = 0 ] && exit 1; exec sleep 60"});
    CHECK(d.wait(std::chrono::seconds(15)) == 1);
  }
}
