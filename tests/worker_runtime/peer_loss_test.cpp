// A peer lost in the middle of a collective: real worker processes (runtime_mp_worker) started
// here, without a launcher (a launcher would stop the survivors itself and hide what they do).
//   - SIGKILL: the survivors' allreduce fails with an exception at once (the kernel closes the
//     dead rank's connections), far within the collective timeout;
//   - SIGSTOP (a hung peer, connections still open): the survivors fail with TimeoutError once the
//     collective timeout (DDPRUN_TIMEOUT) has passed, never hang.
#include <catch2/catch.hpp>

#include <fcntl.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "rendezvous/threaded_store_server.h"

extern char** environ;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Rank {
  pid_t pid = -1;
  fs::path out;
  int status = -1;  // from waitpid, once reaped
};

std::vector<Rank> spawnRanks(int P, const std::string& mode, uint16_t storePort,
                             const std::string& timeoutSec, const fs::path& dir) {
  std::vector<Rank> ranks(P);
  for (int r = 0; r < P; ++r) {
    std::vector<std::string> env{"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(P),
                                 "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(storePort),
                                 "TORCHELASTIC_USE_AGENT_STORE=True", "DDPRUN_TIMEOUT=" + timeoutSec,
                                 "OMP_NUM_THREADS=1"};
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string exe = std::string(DDPRUN_BIN_DIR) + "/runtime_mp_worker";
    std::vector<std::string> args{exe, mode};
    std::vector<char*> argv{args[0].data(), args[1].data(), nullptr};
    ranks[r].out = dir / ("rank" + std::to_string(r) + ".out");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, ranks[r].out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    REQUIRE(posix_spawn(&ranks[r].pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data()) == 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  return ranks;
}

// Reaps the given ranks, or gives up at the deadline (returns false).
bool reap(std::vector<Rank>& ranks, const std::vector<int>& which, Clock::time_point deadline) {
  for (;;) {
    bool all = true;
    for (int r : which) {
      if (ranks[r].status != -1) continue;
      int st = 0;
      if (::waitpid(ranks[r].pid, &st, WNOHANG) == ranks[r].pid) {
        ranks[r].status = st;
      } else {
        all = false;
      }
    }
    if (all) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void killAll(std::vector<Rank>& ranks) {
  for (auto& r : ranks) {
    if (r.status == -1) {
      ::kill(r.pid, SIGKILL);
      ::waitpid(r.pid, &r.status, 0);
    }
  }
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double caughtAfter(const std::string& out) {
  const auto at = out.find("CAUGHT ");
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(at + 7));
}

struct Dir {
  fs::path path = fs::temp_directory_path() / ("ddprun-peer-loss-" + std::to_string(::getpid()));
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("a peer SIGKILLed mid-allreduce: the others throw at once", "[peerloss]") {
  for (int P : {2, 3, 4}) {
    Dir dir;
    ddprun::rendezvous::ThreadedStoreServer store({.host = "127.0.0.1", .port = 0});
    auto ranks = spawnRanks(P, "die", store.port(), "60", dir.path);
    std::vector<int> all(P);
    for (int r = 0; r < P; ++r) all[r] = r;
    const bool done = reap(ranks, all, Clock::now() + std::chrono::seconds(50));
    killAll(ranks);
    REQUIRE(done);
    INFO("P=" << P);
    CHECK(WIFSIGNALED(ranks[P - 1].status));
    CHECK(WTERMSIG(ranks[P - 1].status) == SIGKILL);
    for (int r = 0; r < P - 1; ++r) {
      const std::string out = slurp(ranks[r].out);
      INFO("rank " << r << " said: " << out);
      CHECK(WIFEXITED(ranks[r].status));
      CHECK(WEXITSTATUS(ranks[r].status) == 3);
      const double s = caughtAfter(out);
      CHECK(s >= 0);
      CHECK(s < 20);  // the timeout is 60 s: the error came from the closed connection
      CHECK_THAT(out, Catch::Contains("allreduce") && Catch::Contains("rank"));
    }
  }
}

TEST_CASE("a peer frozen mid-allreduce: the others time out, never hang", "[peerloss]") {
  Dir dir;
  const int P = 3;
  ddprun::rendezvous::ThreadedStoreServer store({.host = "127.0.0.1", .port = 0});
  auto ranks = spawnRanks(P, "freeze", store.port(), "4", dir.path);
  const bool done = reap(ranks, {0, 1}, Clock::now() + std::chrono::seconds(40));
  killAll(ranks);  // the frozen one
  REQUIRE(done);
  for (int r = 0; r < P - 1; ++r) {
    const std::string out = slurp(ranks[r].out);
    INFO("rank " << r << " said: " << out);
    CHECK(WIFEXITED(ranks[r].status));
    CHECK(WEXITSTATUS(ranks[r].status) == 3);
    const double s = caughtAfter(out);
    // Bounded by the 4 s timeout (a rank may see its neighbour's failure first, a bit sooner).
    CHECK(s > 0.5);
    CHECK(s < 12);
    CHECK_THAT(out, Catch::Contains("timed out") || Catch::Contains("was closed"));
  }
  CHECK_THAT(slurp(ranks[0].out) + slurp(ranks[1].out), Catch::Contains("timed out"));
}
