// Freed memory kept for the next step (worker_runtime/malloc_tuning.h): the decision from the
// environment (bad values named, the environment's own thresholds left alone), the effect on a
// real process (a loop that allocates, writes and frees 16 MiB blocks as a training step does
// faults their pages in every round under fixed small thresholds and not once it is tuned), and
// init() of a real one-rank job applying it, or not under DDPRUN_MALLOC_TUNING=0.
#include "tests/support/catch_torch.h"

#include <malloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "base/errors.h"
#include "rendezvous/node_address.h"
#include "tests/support/env_of.h"
#include "worker_runtime/malloc_tuning.h"
#include "worker_runtime/runtime.h"

using Catch::Matchers::Contains;
using ddprun::runtime::MallocTuning;

namespace {

using ddprun::test::envOf;

constexpr size_t kBlock = size_t{16} << 20;  // a 2048x2048 float32 weight's gradient
constexpr int kBlocks = 2;
constexpr int kRounds = 5;

// Minor page faults of kRounds steps, each allocating kBlocks blocks, writing every page and
// freeing them, after one such step to warm up. In a child process, so the thresholds this test
// sets do not reach the others; `tune` chooses glibc's thresholds in it first.
long faultsOfSteps(bool tune) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(p[0]);
    // Huge pages (THP "always" on the host) would fault 16 MiB in 8 pieces: count 4 KiB pages.
    ::prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
    if (tune) {
      if (!ddprun::runtime::applyMallocTuning()) ::_exit(2);
    } else {
      // glibc's initial values, held fixed: each block is mmap'd and given back when freed.
      ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
      ::mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    }
    auto step = [] {
      char* blocks[kBlocks];
      for (auto& b : blocks) {
        b = static_cast<char*>(std::malloc(kBlock));
        if (b == nullptr) ::_exit(3);
        std::memset(b, 1, kBlock);
        // The compiler may drop a malloc, memset and free it can see whole: these are used.
        asm volatile("" : : "r"(b) : "memory");
      }
      for (auto& b : blocks) std::free(b);
    };
    step();
    rusage before{}, after{};
    ::getrusage(RUSAGE_SELF, &before);
    for (int i = 0; i < kRounds; ++i) step();
    ::getrusage(RUSAGE_SELF, &after);
    const long faults = after.ru_minflt - before.ru_minflt;
    if (::write(p[1], &faults, sizeof faults) != sizeof faults) ::_exit(4);
    ::_exit(0);
  }
  ::close(p[1]);
  long faults = -1;
  const ssize_t n = ::read(p[0], &faults, sizeof faults);
  ::close(p[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(n == static_cast<ssize_t>(sizeof faults));
  return faults;
}

// One environment for both of decideMallocTuning's lookups.
MallocTuning decide(std::map<std::string, std::string> vars) {
  auto env = envOf(std::move(vars));
  return ddprun::runtime::decideMallocTuning(env, env);
}

// Whether a block of 48 MiB (above the 32 MiB glibc's own threshold can reach, below the tuned
// one) is mmap'd: mallinfo2's count of mmap'd blocks while it is held.
bool bigBlockMapped() {
  const size_t before = ::mallinfo2().hblks;
  void* b = std::malloc(size_t{48} << 20);
  REQUIRE(b != nullptr);
  asm volatile("" : : "r"(b) : "memory");
  const size_t during = ::mallinfo2().hblks;
  std::free(b);
  return during > before;
}

}  // namespace

TEST_CASE("malloc tuning: applied by default and with DDPRUN_MALLOC_TUNING=1") {
  CHECK(decide({}).apply);
  CHECK(decide({{"DDPRUN_MALLOC_TUNING", "1"}}).apply);
  CHECK(decide({{"DDPRUN_MALLOC_TUNING", ""}}).apply);
  // A tunable of another kind is not a threshold.
  CHECK(decide({{"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"}}).apply);
}

TEST_CASE("malloc tuning: the environment's own thresholds and DDPRUN_MALLOC_TUNING=0 win") {
  auto off = decide({{"DDPRUN_MALLOC_TUNING", "0"}});
  CHECK_FALSE(off.apply);
  CHECK_THAT(off.why, Contains("DDPRUN_MALLOC_TUNING=0"));
  auto trim = decide({{"MALLOC_TRIM_THRESHOLD_", "131072"}});
  CHECK_FALSE(trim.apply);
  CHECK_THAT(trim.why, Contains("MALLOC_TRIM_THRESHOLD_"));
  CHECK_FALSE(decide({{"MALLOC_MMAP_THRESHOLD_", "65536"}}).apply);
  // glibc takes an empty value as 0: it is set.
  CHECK_FALSE(decide({{"MALLOC_MMAP_THRESHOLD_", ""}}).apply);
  auto tunable =
      decide({{"GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"}});
  CHECK_FALSE(tunable.apply);
  CHECK_THAT(tunable.why, Contains("glibc.malloc.mmap_threshold"));
}

TEST_CASE("malloc tuning: a bad DDPRUN_MALLOC_TUNING is named with its value") {
  try {
    decide({{"DDPRUN_MALLOC_TUNING", "yes"}});
    FAIL("no ConfigError");
  } catch (const ddprun::ConfigError& e) {
    CHECK_THAT(e.what(), Contains("DDPRUN_MALLOC_TUNING='yes'"));
    CHECK_THAT(e.what(), Contains("expected 1"));
  }
}

TEST_CASE("malloc tuning: 16 MiB blocks freed each step are not faulted in again once tuned") {
  const long pagesPerStep = static_cast<long>(kBlocks * kBlock / ::sysconf(_SC_PAGESIZE));
  const long untuned = faultsOfSteps(false);
  const long tuned = faultsOfSteps(true);
  INFO("faults over " << kRounds << " steps: untuned " << untuned << ", tuned " << tuned
                      << " (" << pagesPerStep << " pages per step)");
  // Untuned, every page of every step is new; tuned, the warm-up step's pages are reused.
  CHECK(untuned >= kRounds * pagesPerStep * 9 / 10);
  CHECK(tuned < pagesPerStep / 10);
}

TEST_CASE("malloc tuning: init() of a one-rank job applies it, and not under DDPRUN_MALLOC_TUNING=0") {
  const uint16_t port = ddprun::rendezvous::pickFreePort();
  std::map<std::string, std::string> vars{{"RANK", "0"},
                                          {"WORLD_SIZE", "1"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", std::to_string(port)},
                                          {"DDPRUN_BACKEND", "gloo"},
                                          {"DDPRUN_MALLOC_TUNING", "0"}};
  // glibc's initial threshold, held fixed, whatever ran in this process before.
  REQUIRE(::mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 1);
  REQUIRE(bigBlockMapped());
  {
    auto rt = ddprun::runtime::init({.env = envOf(vars)});
    CHECK(bigBlockMapped());  // left alone
  }
  vars.erase("DDPRUN_MALLOC_TUNING");
  {
    auto rt = ddprun::runtime::init({.env = envOf(vars)});
    CHECK_FALSE(bigBlockMapped());  // from the heap now
  }
}
