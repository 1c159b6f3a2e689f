// The real ddprun binary against workers that misbehave on purpose (issue 10): error files
// that are FIFOs, huge, or full of terminal escapes, processes that try to outlive the job,
// and output for a console that nobody reads.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <regex>
#include <string>
#include <thread>

#include "ddprun_process.h"
#include "launcher/job_cgroup.h"
#include "tests/support/skip.h"
#include "rendezvous/tcp_store.h"

using namespace ddprun::testing;

namespace {

// The failure report: everything from its first line on (the console lines of the workers
// before it are their own raw output, as under torchrun).
std::string reportOf(const std::string& err) {
  const auto at = err.find("Root cause (first observed failure)");
  return at == std::string::npos ? std::string() : err.substr(at);
}

}  // namespace

TEST_CASE("an error file that is a FIFO or a device is not read, and ddprun does not hang",
          "[launcher][cli][report][hostile]") {
  // Nobody ever writes the FIFO: a blocking open() would hang the launcher forever.
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                      "if [ $RANK = 1 ]; then mkfifo $TORCHELASTIC_ERROR_FILE; exit 3; fi; sleep 30"});
  CHECK(r.code == 3);
  CHECK_THAT(r.err, Catch::Contains("(not a regular file (FIFO): not read)"));
  // A link to /dev/zero would exhaust memory if read whole.
  r = runDdprun({"--standalone", "sh", "-c", "ln -s /dev/zero $TORCHELASTIC_ERROR_FILE; exit 4"});
  CHECK(r.code == 4);
  CHECK_THAT(r.err, Catch::Contains("(not a regular file (character device): not read)"));
}

TEST_CASE("a huge error file is read only up to 64 KiB, and the report says so",
          "[launcher][cli][report][hostile]") {
  auto r = runDdprun({"--standalone", "sh", "-c",
                      "head -c 3000000 /dev/zero | tr '\\0' x > $TORCHELASTIC_ERROR_FILE; exit 5"});
  CHECK(r.code == 5);
  CHECK_THAT(r.err, Catch::Contains("(3000000 bytes: only the first 65536 were read)"));
  CHECK_THAT(r.err, Catch::Contains("... (3000000 bytes in all)"));
  CHECK(r.err.size() < 64 * 1024);
}

TEST_CASE("control characters from a worker are escaped in the report and in log lines",
          "[launcher][cli][report][hostile]") {
  // JSON escapes: ESC [2J (clear screen), a newline that would forge a line, a bell.
  const std::string json =
      R"({"message": {"message": "bad\u001b[2J\n[ddprun E 00:00:00.000 launcher] forged\u0007", "extraInfo": {"retryable": false, "exceptionType": "T\r\u001b[31m"}}})";
  auto r = runDdprun({"--standalone", "sh", "-c",
                      "printf 'tail\\033[31mred\\r\\n' >&2; printf '%s' '" + json +
                          "' > $TORCHELASTIC_ERROR_FILE; exit 6"});
  CHECK(r.code == 6);
  const std::string report = reportOf(r.err);
  REQUIRE_FALSE(report.empty());
  CHECK(report.find('\x1b') == std::string::npos);
  CHECK(report.find('\a') == std::string::npos);
  CHECK(report.find('\r') == std::string::npos);
  CHECK_THAT(report, Catch::Contains(
                         R"(message    : bad\x1b[2J\n[ddprun E 00:00:00.000 launcher] forged\x07)"));
  CHECK_THAT(report, Catch::Contains(R"(type       : T\r\x1b[31m)"));
  CHECK_THAT(report, Catch::Contains(R"(    tail\x1b[31mred\r)"));
  // The launcher's own log line with the message is one line, escaped too.
  CHECK_THAT(r.err, Catch::Contains(
                        R"(a restart cannot fix: bad\x1b[2J\n[ddprun E 00:00:00.000 launcher] forged\x07)"));
  for (const auto& line : lines(r.err)) CHECK(line.rfind("[ddprun E 00:00:00.000", 0) != 0);
}

namespace {

// A worker that starts three processes meant to outlive it, writing their pids to DIR:
//   setsid.R  a child in a session of its own (out of the worker's process group)
//   double.R  a double-forked grandchild (its parent exits at once: an orphan)
//   noterm.R  a child that ignores SIGTERM
// then its own pid to worker.R, and waits (or exits 0 at once with `thenExit`). It first
// writes its cgroup v2 line ("0::/path") to cgroup.R.
// `d` is a shell word (an exported variable, say); the worker creates it.
// $$$$ reaches the shell as $$ (ddprun substitutes $$ -> $ like torchrun).
std::string escapingWorker(const std::string& d, bool thenExit) {
  return "mkdir -p " + d + "; grep '^0::' /proc/self/cgroup > " + d + "/cgroup.$RANK; "
         "setsid sleep 1000 & echo $! > " + d + "/setsid.$RANK; "
         "sh -c 'sleep 1000 & echo $! > " + d + "/double.$RANK' & "
         "sh -c 'trap \"\" TERM; echo $$$$ > " + d + "/noterm.$RANK; "
         "while true; do sleep 0.05; done' & "
         "until [ -s " + d + "/double.$RANK ] && [ -s " + d + "/noterm.$RANK ]; do sleep 0.01; done; "
         "echo $$$$ > " + d + "/worker.$RANK; " + (thenExit ? "exit 0" : "wait");
}

std::vector<pid_t> escapedPids(const std::string& dir, int ranks) {
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    for (const char* kind : {"setsid.", "double.", "noterm."}) {
      pids.push_back(std::stoi(readFile(dir + "/" + kind + std::to_string(r))));
    }
  }
  return pids;
}

bool allWorkersWrote(const std::string& dir, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    if (readFile(dir + "/worker." + std::to_string(r)).empty()) return false;
  }
  return true;
}

// This process's line "0::/path\n" of /proc/self/cgroup.
std::string ownCgroupLine() {
  for (const auto& line : lines(readFile("/proc/self/cgroup"))) {
    if (line.rfind("0::", 0) == 0) return line + "\n";
  }
  return "";
}

// Where ddprun (started by this process) makes its job cgroup: our own cgroup v2 directory,
// when a child cgroup with cgroup.kill can be made there (probed); empty otherwise.
const std::string& writableCgroup2() {
  static const std::string dir = [] {
    const auto own = ddprun::launcher::findOwnCgroup2();
    if (own.dir.empty()) return std::string();
    const std::string probe = own.dir + "/ddprun-test-probe-" + std::to_string(::getpid());
    if (::mkdir(probe.c_str(), 0755) != 0) return std::string();
    const bool hasKill = ::access((probe + "/cgroup.kill").c_str(), W_OK) == 0;
    ::rmdir(probe.c_str());
    return hasKill ? own.dir : std::string();
  }();
  return dir;
}

// Every pid is gone or a zombie (PID 1 of a sandbox may reap orphans late). Waits for the
// kills to land; a survivor is named.
void checkAllDead(const std::vector<pid_t>& pids) {
  waitUntil([&] {
    for (pid_t p : pids) {
      if (processRunning(p)) return false;
    }
    return true;
  });
  for (pid_t p : pids) {
    INFO("pid " << p << ": " << readFile("/proc/" + std::to_string(p) + "/cmdline"));
    CHECK_FALSE(processRunning(p));
  }
}

}  // namespace

namespace {

// The job cgroup (launcher/job_cgroup.h) as the workers see it. With cgroups in use, each
// rank's cgroup line (escapingWorker) is "0::<ours>/ddprun-<id>-<pid>/workers-<n>", the same
// for every rank; the job's directory is returned. Without, it is our own line.
std::string checkWorkerCgroups(const std::string& dir, int ranks, bool cgroups) {
  const std::string ours = ownCgroupLine();
  std::string jobPath;
  for (int r = 0; r < ranks; ++r) {
    const std::string line = readFile(dir + "/cgroup." + std::to_string(r));
    INFO("rank " << r << ": " << line << "ours: " << ours);
    if (!cgroups) {
      CHECK(line == ours);
      continue;
    }
    const std::string base = ours == "0::/\n" ? "" : ours.substr(3, ours.size() - 4);
    const std::string head = "0::" + base + "/ddprun-";
    REQUIRE(line.rfind(head, 0) == 0);
    const size_t workers = line.rfind("/workers-");
    REQUIRE(workers != std::string::npos);
    REQUIRE(workers > head.size());
    REQUIRE(line.find_first_not_of("0123456789", workers + 9) == line.size() - 1);  // "\n"
    const std::string path = line.substr(3, workers - 3);
    CHECK(path.find('/', head.size() - 3) == std::string::npos);  // a child of ours
    if (r > 0) CHECK(path == jobPath);
    jobPath = path;
  }
  if (!cgroups) return "";
  const auto lookup = ddprun::launcher::findOwnCgroup2(readFile("/proc/self/mountinfo"), "0::" + jobPath + "\n");
  INFO(lookup.whyNot);
  REQUIRE_FALSE(lookup.dir.empty());
  return lookup.dir;
}

// ddprun's environment with DDPRUN_CGROUP=0 (no job cgroup) or as it is.
Env cgroupEnv(bool cgroups) {
  Env env = baseEnv();
  if (!cgroups) env["DDPRUN_CGROUP"] = "0";
  return env;
}

}  // namespace

TEST_CASE("nothing a worker started survives ddprun's SIGKILL: setsid, double fork, no SIGTERM",
          "[launcher][cli][orphans][hostile]") {
  // Once with the job cgroup (where this host has one), once with the guards alone.
  for (bool cgroups : {true, false}) {
    if (cgroups && writableCgroup2().empty()) continue;
    INFO((cgroups ? "with the job cgroup" : "DDPRUN_CGROUP=0"));
    TempDir dir;
    Ddprun d({"--standalone", "--nproc-per-node=2", "sh", "-c", escapingWorker(dir.path(), false)},
             cgroupEnv(cgroups));
    REQUIRE(waitUntil([&] { return allWorkersWrote(dir.path(), 2); }));
    const auto pids = escapedPids(dir.path(), 2);
    for (pid_t p : pids) REQUIRE(processRunning(p));
    const std::string jobCgroup = checkWorkerCgroups(dir.path(), 2, cgroups);
    if (cgroups) REQUIRE(std::filesystem::is_directory(jobCgroup));
    d.signal(SIGKILL);
    CHECK(d.wait() == 137);
    checkAllDead(pids);
    // The guards, which outlive ddprun for their sweep, removed the job's cgroup too.
    if (cgroups) {
      waitUntil([&] { return !std::filesystem::exists(jobCgroup); });
      CHECK_FALSE(std::filesystem::exists(jobCgroup));
    }
  }
  // Without one, the case still checks the guards alone ('... guard killed from outside' skips).
  if (writableCgroup2().empty()) WARN("no writable cgroup v2 with cgroup.kill here: checked without");
}

TEST_CASE("nothing a worker started survives a job that ends normally",
          "[launcher][cli][orphans][hostile]") {
  for (bool cgroups : {true, false}) {
    if (cgroups && writableCgroup2().empty()) continue;
    INFO((cgroups ? "with the job cgroup" : "DDPRUN_CGROUP=0"));
    TempDir dir;
    auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c", escapingWorker(dir.path(), true)},
                       cgroupEnv(cgroups));
    CHECK(r.code == 0);
    checkAllDead(escapedPids(dir.path(), 2));
    const std::string jobCgroup = checkWorkerCgroups(dir.path(), 2, cgroups);
    if (cgroups) CHECK_FALSE(std::filesystem::exists(jobCgroup));
  }
  // Without one, the case still checks the guards alone ('... guard killed from outside' skips).
  if (writableCgroup2().empty()) WARN("no writable cgroup v2 with cgroup.kill here: checked without");
}

TEST_CASE("with a job cgroup, nothing survives a guard killed from outside",
          "[launcher][cli][orphans][hostile][cgroup]") {
  // A guard SIGKILLed from outside cannot sweep: its worker's process group dies with it, but
  // a setsid, double-forked child is no longer below any guard (without cgroups it survives:
  // the documented limit). The job's cgroup still holds it, and ddprun sweeps that cgroup once
  // the group has stopped, before the restart -- checked while the job goes on with its
  // restart, so not by the job cgroup's end.
  if (writableCgroup2().empty()) {
    skipTest("no writable cgroup v2 with cgroup.kill here");
    return;
  }
  TempDir dir;
  const std::string first = dir / "a0";
  Ddprun d({"--standalone", "--nproc-per-node=2", "--max-restarts=1", "sh", "-c",
            "export d=" + dir.path() + "/a$TORCHELASTIC_RESTART_COUNT; mkdir -p $d; "
            "echo $PPID > $d/guard.$RANK; " + escapingWorker("$d", false)});
  REQUIRE(waitUntil([&] { return allWorkersWrote(first, 2); }));
  auto pids = escapedPids(first, 2);
  for (int r = 0; r < 2; ++r) pids.push_back(std::stoi(readFile(first + "/worker." + std::to_string(r))));
  for (pid_t p : pids) REQUIRE(processRunning(p));
  const std::string jobCgroup = checkWorkerCgroups(first, 2, true);
  const pid_t guard = std::stoi(readFile(first + "/guard.1"));
  REQUIRE(readFile("/proc/" + std::to_string(guard) + "/comm") == "ddprun-guard\n");
  ::kill(guard, SIGKILL);
  // The restarted group (round 1) runs: the first group's processes, all of them, are gone.
  const std::string second = dir / "a1";
  REQUIRE(waitUntil([&] { return allWorkersWrote(second, 2); }));
  checkAllDead(pids);
  REQUIRE(processRunning(d.pid()));
  CHECK(checkWorkerCgroups(second, 2, true) == jobCgroup);
  // The end: the second group's escapees and the job's cgroup are gone too.
  const auto secondPids = escapedPids(second, 2);
  d.signal(SIGTERM);
  CHECK(d.wait() == 143);
  CHECK_THAT(d.err(), Catch::Contains("its guard process died"));
  checkAllDead(secondPids);
  CHECK_FALSE(std::filesystem::exists(jobCgroup));
}

TEST_CASE("after --shutdown-timeout ddprun kills everything and says it stopped the workers",
          "[launcher][cli][orphans][hostile]") {
  TempDir dir;
  Ddprun d({"--standalone", "--nproc-per-node=2", "--shutdown-timeout=0.3", "sh", "-c",
            "trap '' TERM; " + escapingWorker(dir.path(), false)});
  REQUIRE(waitUntil([&] { return allWorkersWrote(dir.path(), 2); }));
  auto pids = escapedPids(dir.path(), 2);
  for (int r = 0; r < 2; ++r) pids.push_back(std::stoi(readFile(dir / ("worker." + std::to_string(r)))));
  d.signal(SIGTERM);
  CHECK(d.wait() == 143);
  CHECK_THAT(d.err(), Catch::Contains("sending SIGKILL"));
  CHECK_THAT(d.err(), !Catch::Contains("guard"));
  checkAllDead(pids);
}

TEST_CASE("a console nobody reads blocks neither signals nor the agent store",
          "[launcher][cli][output][hostile]") {
  // `ddprun ... | (sleep 60)`: ddprun's stdout is a pipe whose reader never reads.
  TempDir dir;
  const std::string fifo = dir / "console";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(reader >= 0);
  Process launcher(ProcessOptions{
      .argv = {ddprunPath(), "--standalone", "--nproc-per-node=2", "--shutdown-timeout=2", "sh",
               "-c", "while true; do echo chatty line from rank $RANK; done"},
      .env = baseEnv(),
      .exactEnv = true,
      .stdoutPath = fifo,
      .stderrPath = dir / "ddprun.err"});
  // The pipe is full (64 KiB by default, less what a whole batch of lines does not fit):
  // every further console write would block.
  REQUIRE(waitUntil([&] {
    int queued = 0;
    return ::ioctl(reader, FIONREAD, &queued) == 0 && queued >= 48 * 1024;
  }));
  std::smatch m;
  std::string err;
  REQUIRE(waitUntil([&] {
    err = readFile(dir / "ddprun.err");
    return std::regex_search(err, m, std::regex(R"(agent store on 127\.0\.0\.1:(\d+))"));
  }));
  const int port = std::stoi(m[1]);
  // More than a buffer's worth keeps coming: ddprun stops reading the workers' pipes instead
  // of blocking; its loop still serves the store ...
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ddprun::rendezvous::TcpStore store(ddprun::rendezvous::TcpStoreOptions{
      .host = "127.0.0.1", .port = static_cast<uint16_t>(port),
      .timeout = std::chrono::seconds(10), .tokenFromEnvironment = false});
  store.set("probe", "still answering");
  CHECK(store.get("probe") == "still answering");
  // ... and handles SIGTERM: the job stops (the workers die of it), ddprun exits.
  launcher.signal(SIGTERM);
  auto status = launcher.waitStatus(std::chrono::seconds(60));
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 143);
  CHECK_THAT(readFile(dir / "ddprun.err"),
             Catch::Contains("bytes of worker output for ddprun's stdout were lost"));
  ::close(reader);
}

TEST_CASE("a log directory on a full filesystem: one warning per file, a count, the job goes on",
          "[launcher][cli][output][hostile]") {
  // A 64 KiB tmpfs in a mount namespace of ddprun's own (needs CAP_SYS_ADMIN: skipped without).
  // Each rank writes ~150 KB, more than the filesystem holds on its own: whichever rank runs first,
  // both hit the full disk (with 3000 lines, ~57 KB each, a rank that ran ahead fitted whole and the
  // other took all the loss, which failed this test in CI).
  TempDir dir;
  const std::string small = dir / "small";
  std::filesystem::create_directory(small);
  const std::string probe = "unshare -m sh -c 'mount -t tmpfs -o size=64k none " + small + "' 2>/dev/null";
  if (std::system(probe.c_str()) != 0) {
    skipTest("cannot mount a small tmpfs in a mount namespace here (unshare -m needs CAP_SYS_ADMIN)");
    return;
  }
  Process job(ProcessOptions{
      .argv = {"/usr/bin/unshare", "-m", "sh", "-c",
               "mount -t tmpfs -o size=64k none " + small + " && exec " + ddprunPath() +
                   " --standalone --nproc-per-node=2 --log-dir=" + small +
                   " --redirects=3 sh -c 'i=0; while [ $i -lt 8000 ]; do echo line $i of rank "
                   "$RANK; i=$((i+1)); done; echo finished > " + dir.path() + "/done.$RANK'"},
      .env = baseEnv(),
      .exactEnv = true,
      .stdoutPath = dir / "out",
      .stderrPath = dir / "err"});
  CHECK(job.wait() == 0);
  const std::string err = readFile(dir / "err");
  // Each worker ran to its end despite the full disk.
  CHECK(readFile(dir / "done.0") == "finished\n");
  CHECK(readFile(dir / "done.1") == "finished\n");
  for (int r = 0; r < 2; ++r) {
    const std::string file = "attempt_0/" + std::to_string(r) + "/stdout.log";
    INFO(file);
    size_t warnings = 0;
    for (const auto& line : lines(err)) {
      if (line.find("cannot write log file") != std::string::npos &&
          line.find(file) != std::string::npos) {
        ++warnings;
      }
    }
    CHECK(warnings == 1);
    CHECK(std::regex_search(err, std::regex("[1-9][0-9]* bytes of worker output were lost: log file \\S*" +
                                            file + ": No space left on device")));
  }
}
