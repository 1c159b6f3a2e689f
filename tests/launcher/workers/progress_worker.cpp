// A worker for the progress-watch tests: reports a step of progress every STEP_MS milliseconds
// through the real writer (base/progress_file.h, as the runtime's DDP does), STEPS times, then
// exits 0. Prints "rank R pid P" first, so a test can stop it from outside, and "rank R pid P
// got SIGTERM" when SIGTERM ends it (exit 143).
//   progress_worker [--heartbeat] STEPS STEP_MS [SLEEP_RANK SLEEP_AT_STEP SLEEP_SECONDS]
// With the last three, rank SLEEP_RANK sleeps SLEEP_SECONDS before step SLEEP_AT_STEP.
// --heartbeat: starts the heartbeat thread first, as the runtime's init() does
// (ddprun::runtime::startHeartbeat() is this call), and prints its period.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/progress_file.h"

namespace {
char termLine[96];
size_t termLineLen = 0;
// Says that SIGTERM (ddprun stopping the survivors of a failure) arrived, not a SIGKILL.
void onTerm(int) {
  (void)!::write(STDOUT_FILENO, termLine, termLineLen);
  ::_exit(143);
}
}  // namespace

int main(int argc, char** argv) {
  const bool heartbeat = argc > 1 && std::string(argv[1]) == "--heartbeat";
  if (heartbeat) {
    --argc;
    ++argv;
  }
  if (argc != 3 && argc != 6) {
    std::fprintf(stderr,
                 "usage: progress_worker [--heartbeat] STEPS STEP_MS [SLEEP_RANK AT SECONDS]\n");
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const int stepMs = std::atoi(argv[2]);
  const char* rankEnv = std::getenv("RANK");
  const int rank = rankEnv ? std::atoi(rankEnv) : 0;
  const bool sleeps = argc == 6 && std::atoi(argv[3]) == rank;
  auto& progress = ddprun::progress::ProgressWriter::instance();
  const unsigned long long beatMs = heartbeat ? progress.startHeartbeat() : 0;
  std::printf("rank %d pid %d progress %s, heartbeat %llu ms\n", rank,
              static_cast<int>(::getpid()), progress.active() ? "reported" : "not reported",
              beatMs);
  std::fflush(stdout);
  termLineLen = static_cast<size_t>(std::snprintf(termLine, sizeof termLine,
                                                  "rank %d pid %d got SIGTERM\n", rank,
                                                  static_cast<int>(::getpid())));
  std::signal(SIGTERM, onTerm);
  for (int s = 0; s < steps; ++s) {
    if (sleeps && s == std::atoi(argv[4])) {
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(argv[5])));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(stepMs));
    progress.step();
  }
  return 0;
}
