// processDead / processDying / processExiting against real child processes: a live one, a stopped one, zombies
// that exited 0 and 3 or were killed, and a reaped one. A zombie is what a launcher sees between
// a worker's death and its guard's report; processDying must not take a clean exit 0 for a death.
#include "base/process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace {

// A child that runs until killed, or exits at once with `code` (>= 0).
pid_t child(int code) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (code >= 0) ::_exit(code);
    for (;;) ::pause();
  }
  return pid;
}

// Waits (bounded) until `pid` is a zombie, without reaping it.
void awaitZombie(pid_t pid) {
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) == 0);
}

void reap(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
}

}  // namespace

TEST_CASE("processDying: a live or stopped process is not dying, a zombie is unless it exited 0") {
  const pid_t live = child(-1);
  CHECK_FALSE(ddprun::processDead(live));
  CHECK_FALSE(ddprun::processDying(live));
  REQUIRE(::kill(live, SIGSTOP) == 0);
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(live), &info, WSTOPPED | WNOWAIT) == 0);
  CHECK_FALSE(ddprun::processDying(live));  // stopped, not dying
  REQUIRE(::kill(live, SIGKILL) == 0);
  awaitZombie(live);
  CHECK(ddprun::processDead(live));
  int status = 0;
  CHECK(ddprun::processDying(live, &status));  // killed: a failure
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  reap(live);
  CHECK(ddprun::processDead(live));
  CHECK_FALSE(ddprun::processDying(live));  // reaped: its reaper reports how it ended

  const pid_t clean = child(0);
  awaitZombie(clean);
  CHECK(ddprun::processDead(clean));
  CHECK_FALSE(ddprun::processDying(clean));  // exit 0 is no death to recover
  reap(clean);

  const pid_t failed = child(3);
  awaitZombie(failed);
  status = 0;
  CHECK(ddprun::processDying(failed, &status));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  reap(failed);

  CHECK_FALSE(ddprun::processDying(-1));
  CHECK_FALSE(ddprun::processDying(0));
}

TEST_CASE("processExiting: a live or stopped process is not exiting, a killed one is from its "
          "SIGKILL on, before it is a zombie at the latest, and a clean exit too") {
  const pid_t live = child(-1);
  CHECK_FALSE(ddprun::processExiting(live));
  REQUIRE(::kill(live, SIGSTOP) == 0);
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(live), &info, WSTOPPED | WNOWAIT) == 0);
  CHECK_FALSE(ddprun::processExiting(live));  // stopped (frozen), not exiting
  REQUIRE(::kill(live, SIGCONT) == 0);
  CHECK_FALSE(ddprun::processExiting(live));
  // From the SIGKILL on, every answer is "exiting": pending, exiting, zombie, reaped.
  REQUIRE(::kill(live, SIGKILL) == 0);
  CHECK(ddprun::processExiting(live));
  int status = 0;
  bool dyingBeforeZombie = true;
  for (int i = 0; i < 100 && !ddprun::processDead(live); ++i) {
    dyingBeforeZombie = dyingBeforeZombie && ddprun::processExiting(live) &&
                        ddprun::processDying(live, &status) && status == SIGKILL;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  CHECK(dyingBeforeZombie);
  awaitZombie(live);
  CHECK(ddprun::processExiting(live));
  reap(live);
  CHECK(ddprun::processExiting(live));

  const pid_t clean = child(0);
  awaitZombie(clean);
  CHECK(ddprun::processExiting(clean));       // it will never post again...
  CHECK_FALSE(ddprun::processDying(clean));   // ...but exit 0 is no death to recover
  reap(clean);
  CHECK_FALSE(ddprun::processExiting(-1));
  CHECK_FALSE(ddprun::processExiting(0));
}
