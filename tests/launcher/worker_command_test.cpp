// What each worker executes: direct or under Python, --pass-local-rank, torchrun's macros.
#include <catch2/catch.hpp>

#include "launcher/worker_command.h"

using namespace ddprun;
using namespace ddprun::launcher;

namespace {
const Environment kEnv{{"PATH", "/usr/bin:/bin"}, {"PYTHON_EXEC", "/bin/true"}};
}

TEST_CASE("PROGRAM runs directly, found on PATH", "[launcher][command]") {
  LaunchOptions o;
  o.program = "sh";
  o.programArgs = {"-c", "echo ${local_rank}"};
  auto cmd = buildWorkerCommand(o, kEnv);
  CHECK_FALSE(cmd.python);
  CHECK((cmd.executable == "/usr/bin/sh" || cmd.executable == "/bin/sh"));
  CHECK(argvForRank(cmd, 3) == std::vector<std::string>{"sh", "-c", "echo 3"});
}

TEST_CASE(".py, -m and --run-path run under $PYTHON_EXEC -u but --no-python does not",
          "[launcher][command]") {
  LaunchOptions o;
  o.program = "train.py";
  o.programArgs = {"--lr", "0.1"};
  auto py = buildWorkerCommand(o, kEnv);
  CHECK(py.python);
  CHECK(py.executable == "/bin/true");
  CHECK(argvForRank(py, 0) == std::vector<std::string>{"/bin/true", "-u", "train.py", "--lr", "0.1"});

  o.module = true;
  o.program = "pkg.train";
  CHECK(argvForRank(buildWorkerCommand(o, kEnv), 0) ==
        std::vector<std::string>{"/bin/true", "-u", "-m", "pkg.train", "--lr", "0.1"});

  LaunchOptions direct;
  direct.program = "/bin/true";
  direct.noPython = true;
  CHECK_FALSE(buildWorkerCommand(direct, kEnv).python);

  LaunchOptions noExec;  // without PYTHON_EXEC, python3 is looked up on PATH
  noExec.program = "x.py";
  auto cmd = buildWorkerCommand(noExec, Environment{{"PATH", "/usr/bin:/bin"}});
  CHECK(cmd.argv[0] == "python3");
}

TEST_CASE("flag --pass-local-rank puts --local_rank=N right after PROGRAM", "[launcher][command]") {
  LaunchOptions o;
  o.program = "train.py";
  o.programArgs = {"--epochs", "2"};
  o.passLocalRank = true;
  CHECK(argvForRank(buildWorkerCommand(o, kEnv), 2) ==
        std::vector<std::string>{"/bin/true", "-u", "train.py", "--local_rank=2", "--epochs", "2"});
}

TEST_CASE("macros follow Python's Template.safe_substitute, as torchrun's do",
          "[launcher][command]") {
  CHECK(substituteLocalRank("out.${local_rank}.log", 7) == "out.7.log");
  CHECK(substituteLocalRank("$local_rank", 7) == "7");
  CHECK(substituteLocalRank("$$", 7) == "$");
  CHECK(substituteLocalRank("kill -9 $$$$", 7) == "kill -9 $$");
  CHECK(substituteLocalRank("$HOME/${other}/$local_rankx", 7) == "$HOME/${other}/$local_rankx");
  CHECK(substituteLocalRank("${1bad} $ end$", 7) == "${1bad} $ end$");
  CHECK(substituteLocalRank("${local_rank", 7) == "${local_rank");
}

TEST_CASE("a missing or non-executable PROGRAM is a ProgramError (127 / 126)",
          "[launcher][command]") {
  LaunchOptions o;
  o.program = "no-such-program-ddprun";
  try {
    buildWorkerCommand(o, kEnv);
    FAIL("no error");
  } catch (const ProgramError& e) {
    CHECK(e.exitCode() == 127);
    CHECK_THAT(e.what(), Catch::Contains("no-such-program-ddprun' was not found on PATH"));
  }
  o.program = "/etc/passwd";  // a regular file without execute permission
  try {
    buildWorkerCommand(o, kEnv);
    FAIL("no error");
  } catch (const ProgramError& e) {
    CHECK(e.exitCode() == 126);
  }
  LaunchOptions py;
  py.program = "x.py";
  CHECK_THROWS_WITH(buildWorkerCommand(py, Environment{{"PATH", "/nonexistent"}}),
                    Catch::Contains("PYTHON_EXEC"));
}
