// Command line -> LaunchOptions: torchrun's flags in both spellings, PET_* fallback, --config
// merge, and one clear line for every bad value.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "launcher/devices.h"
#include "launcher/options.h"
#include "base/errors.h"
#include "tests/support/temp_dir.h"

using namespace ddprun;
using namespace ddprun::launcher;

namespace {

LaunchOptions parse(std::vector<std::string> args, const Environment& env = {}) {
  args.insert(args.begin(), "ddprun");
  auto out = parseLaunchOptions(args, env);
  REQUIRE(out.options);
  return *out.options;
}

std::string parseError(std::vector<std::string> args, const Environment& env = {}) {
  args.insert(args.begin(), "ddprun");
  try {
    parseLaunchOptions(args, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

// A config file in a directory removed when the test process exits.
std::string writeConfig(const std::string& json) {
  static ddprun::testing::TempDir dir;
  static int count = 0;
  const std::string path = dir / ("config-" + std::to_string(count++) + ".json");
  std::ofstream(path) << json;
  return path;
}

}  // namespace

TEST_CASE("defaults are torchrun's", "[launcher][options]") {
  auto o = parse({"train.py"});
  CHECK(o.nprocPerNode == 1);
  CHECK(o.minNodes == 1);
  CHECK(o.maxNodes == 1);
  CHECK(o.rdzvBackend == "static");
  CHECK(o.rdzvId == "none");
  CHECK(o.maxRestarts == 0);
  CHECK(o.role == "default");
  CHECK(o.masterAddr == "127.0.0.1");
  CHECK(o.masterPort == 29500);
  CHECK(o.startMethod == "spawn");
  CHECK(o.shutdownTimeout == std::chrono::seconds(30));
  CHECK(o.signalsToHandle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(o.agentStore);
  CHECK_FALSE(o.standalone);
  CHECK(o.program == "train.py");
  CHECK(o.programArgs.empty());
}

TEST_CASE("every flag is accepted with dashes and with underscores", "[launcher][options]") {
  auto dashes = parse({"--nproc-per-node=3", "--max-restarts", "2", "--rdzv-id=job7",
                       "--master-addr=10.0.0.1", "--master-port=1234", "--node-rank=0",
                       "--monitor-interval=5", "--start-method=fork", "--log-dir=/tmp/x",
                       "--local-ranks-filter=0,2", "--no-python", "--shutdown-timeout=1.5",
                       "--signals-to-handle=SIGTERM,INT", "--pass-local-rank",
                       "--no-agent-store", "--rdzv-conf=join_timeout=5", "prog"});
  auto underscores = parse({"--nproc_per_node=3", "--max_restarts", "2", "--rdzv_id=job7",
                            "--master_addr=10.0.0.1", "--master_port=1234", "--node_rank=0",
                            "--monitor_interval=5", "--start_method=fork", "--log_dir=/tmp/x",
                            "--local_ranks_filter=0,2", "--no_python", "--shutdown_timeout=1.5",
                            "--signals_to_handle=SIGTERM,INT", "--pass_local_rank",
                            "--no_agent_store", "--rdzv_conf=join_timeout=5", "prog"});
  for (const auto* o : {&dashes, &underscores}) {
    CHECK(o->nprocPerNode == 3);
    CHECK(o->maxRestarts == 2);
    CHECK(o->rdzvId == "job7");
    CHECK(o->masterAddr == "10.0.0.1");
    CHECK(o->masterPort == 1234);
    CHECK(o->monitorInterval == 5.0);
    CHECK(o->startMethod == "fork");
    CHECK(o->logDir == "/tmp/x");
    CHECK(o->localRanksFilter == std::set<int>{0, 2});
    CHECK(o->noPython);
    CHECK(o->shutdownTimeout == std::chrono::milliseconds(1500));
    CHECK(o->signalsToHandle == std::vector<int>{SIGTERM, SIGINT});
    CHECK(o->passLocalRank);
    CHECK_FALSE(o->agentStore);
    REQUIRE(o->rdzvConf.size() == 1);
    CHECK(o->rdzvConf[0] == std::pair<std::string, std::string>{"join_timeout", "5"});
  }
}

TEST_CASE("short flags -m, -r, -t", "[launcher][options]") {
  auto o = parse({"-m", "-r", "3", "-t", "0:1,1:2", "pkg.train", "--lr", "0.1"});
  CHECK(o.module);
  CHECK(o.redirects.forRank(5) == kStdAll);
  CHECK(o.tee.forRank(0) == kStdOut);
  CHECK(o.tee.forRank(1) == kStdErr);
  CHECK(o.tee.forRank(2) == kStdNone);
  CHECK(o.program == "pkg.train");
  CHECK(o.programArgs == std::vector<std::string>{"--lr", "0.1"});
}

// The parser adds to CLI11 only the flags argv names (launcher/options.cpp, CliParser): short
// flags combined in one token, a flag whose only mention is its underscore spelling, and --help
// after a few flags must still see every flag.
TEST_CASE("the parser knows every flag whatever few argv names", "[launcher][options]") {
  auto combined = parse({"-mr3", "pkg.train"});
  CHECK(combined.module);
  CHECK(combined.redirects.forRank(1) == kStdAll);
  auto attached = parse({"-t3", "--no_python", "prog"});
  CHECK(attached.tee.forRank(0) == kStdAll);
  CHECK(attached.noPython);
  CHECK_THAT(parseError({"--nnodes=2", "-x", "prog"}), Catch::StartsWith("unknown flag -x"));
  auto help = parseLaunchOptions({"ddprun", "--nnodes=2", "--rdzv_id=j", "--help"}, {});
  REQUIRE_FALSE(help.options);
  for (const char* flag : {"-m,--module", "-r,--redirects", "-t,--tee", "--spares", "--hostfile",
                           "--peer-timeout,--peer_timeout", "--config", "--ssh-option,--ssh_option",
                           "--export", "--version"}) {
    CHECK_THAT(help.message, Catch::Contains(flag));
  }
  auto shortHelp = parseLaunchOptions({"ddprun", "-h"}, {});
  CHECK(shortHelp.message == help.message);
}

TEST_CASE("everything after PROGRAM belongs to PROGRAM", "[launcher][options]") {
  auto o = parse({"--nproc-per-node", "2", "train.py", "--nproc-per-node=9", "--help", "-m"});
  CHECK(o.nprocPerNode == 2);
  CHECK_FALSE(o.module);
  CHECK(o.programArgs == std::vector<std::string>{"--nproc-per-node=9", "--help", "-m"});
  auto dashdash = parse({"--", "prog", "-x"});
  CHECK(dashdash.program == "prog");
  CHECK(dashdash.programArgs == std::vector<std::string>{"-x"});
}

TEST_CASE("PET_<NAME> is read when the flag is absent and the command line wins",
          "[launcher][options]") {
  Environment env{{"PET_NPROC_PER_NODE", "4"}, {"PET_MAX_RESTARTS", "3"},
                  {"PET_STANDALONE", "1"}, {"PET_ROLE", "trainer"}};
  auto fromEnv = parse({"prog"}, env);
  CHECK(fromEnv.nprocPerNode == 4);
  CHECK(fromEnv.maxRestarts == 3);
  CHECK(fromEnv.standalone);
  CHECK(fromEnv.role == "trainer");
  auto cli = parse({"--nproc-per-node=2", "prog"}, env);
  CHECK(cli.nprocPerNode == 2);
  CHECK(cli.maxRestarts == 3);
}

TEST_CASE("flag --config: any flag from JSON, below the command line and above PET_*",
          "[launcher][options]") {
  const std::string path = writeConfig(
      R"({"nproc_per_node": 3, "max-restarts": 2, "standalone": true, "tee": "3",
          "shutdown_timeout": 0.25, "role": "fromconfig"})");
  Environment env{{"PET_MAX_RESTARTS", "7"}, {"PET_ROLE", "fromenv"}, {"PET_MASTER_PORT", "4321"}};
  auto o = parse({"--config", path, "--nproc-per-node=5", "prog"}, env);
  CHECK(o.nprocPerNode == 5);       // command line beats config
  CHECK(o.maxRestarts == 2);        // config beats PET_*
  CHECK(o.role == "fromconfig");
  CHECK(o.masterPort == 4321);      // PET_* beats the default
  CHECK(o.standalone);
  CHECK(o.tee.forRank(0) == kStdAll);
  CHECK(o.shutdownTimeout == std::chrono::milliseconds(250));
  std::remove(path.c_str());
}

TEST_CASE("flag --config may name the program and its arguments", "[launcher][options]") {
  const std::string path = writeConfig(R"({"program": "train.py", "args": ["--epochs", "3"]})");
  auto o = parse({"--config=" + path});
  CHECK(o.program == "train.py");
  CHECK(o.programArgs == std::vector<std::string>{"--epochs", "3"});
  auto cli = parse({"--config=" + path, "other.py"});  // the command line's PROGRAM wins
  CHECK(cli.program == "other.py");
  CHECK(cli.programArgs.empty());
  std::remove(path.c_str());
}

TEST_CASE("flag --standalone: one node, c10d on loopback, a random run id", "[launcher][options]") {
  auto a = parse({"--standalone", "prog"});
  auto b = parse({"--standalone", "--nnodes=2", "prog"});
  CHECK(a.rdzvBackend == "c10d");
  CHECK(a.maxNodes == 1);
  CHECK(b.maxNodes == 1);
  CHECK(a.rdzvId.size() == 36);
  CHECK(a.rdzvId[14] == '4');  // a version-4 UUID
  CHECK(a.rdzvId != b.rdzvId);
}

TEST_CASE("flag --nproc-per-node takes cpu, auto, and gpu only with a CUDA device",
          "[launcher][options]") {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  CHECK(parse({"--nproc-per-node=cpu", "p"}).nprocPerNode == cpus);
  // Whatever this machine has: auto takes the GPUs, else the CPUs; gpu without one is an error.
  const int gpus = cudaDeviceCount();
  INFO("visible CUDA devices: " << gpus);
  CHECK(parse({"--nproc-per-node=auto", "p"}).nprocPerNode == (gpus > 0 ? gpus : cpus));
  if (gpus > 0) {
    CHECK(parse({"--nproc-per-node=gpu", "p"}).nprocPerNode == gpus);
  } else {
    CHECK(parseError({"--nproc-per-node=gpu", "p"}) ==
          "--nproc-per-node=gpu: no CUDA device is visible here; use a number, 'cpu' or 'auto'");
  }
}

TEST_CASE("etcd-v3 takes every member of the cluster as --rdzv-endpoint", "[launcher][options]") {
  auto o = parse({"--rdzv-backend=etcd-v3", "--rdzv-endpoint=10.0.0.1:2379,10.0.0.2:2379,[::1]:2379",
                  "--nnodes=2", "p"});
  CHECK(o.rdzvBackend == "etcd-v3");
  CHECK(o.rdzvEndpoint == "10.0.0.1:2379,10.0.0.2:2379,[::1]:2379");
  const std::string bad = parseError({"--rdzv-backend=etcd-v3", "--rdzv-endpoint=h1:2379,:2379", "p"});
  CHECK_THAT(bad, Catch::StartsWith("--rdzv-endpoint=h1:2379,:2379: ") &&
                      Catch::Contains("':2379' is not an endpoint"));
}

TEST_CASE("a bad value is one line naming the flag, the value, its source and what is allowed",
          "[launcher][options]") {
  CHECK(parseError({"--nproc-per-node=abc", "p"}) ==
        "--nproc-per-node=abc: expected a number of workers >= 1, 'cpu', 'gpu' or 'auto'");
  CHECK(parseError({"--max-restarts=-1", "p"}) == "--max-restarts=-1: expected an integer >= 0");
  CHECK(parseError({"--master-port=70000", "p"}) ==
        "--master-port=70000: expected an integer from 0 to 65535");
  CHECK(parseError({"--rdzv-backend=zookeeper", "p"}) ==
        "--rdzv-backend=zookeeper: expected one of static, c10d, etcd-v3");
  // torchrun's v2-API etcd backends: pointed at ours.
  for (const char* v2 : {"etcd", "etcd-v2"}) {
    const std::string e = parseError({std::string("--rdzv-backend=") + v2, "p"});
    CHECK_THAT(e, Catch::StartsWith(std::string("--rdzv-backend=") + v2 + ": ") &&
                      Catch::Contains("v2 API") && Catch::Contains("--rdzv-backend=etcd-v3"));
  }
  CHECK(parseError({"--start-method=thread", "p"}) ==
        "--start-method=thread: expected one of spawn, fork, forkserver");
  CHECK(parseError({"p"}, {{"PET_MAX_RESTARTS", "lots"}}) ==
        "--max-restarts=lots (from PET_MAX_RESTARTS): expected an integer >= 0");
  CHECK(parseError({"p"}, {{"PET_STANDALONE", "maybe"}}) ==
        "--standalone=maybe (from PET_STANDALONE): expected 1/0, true/false, yes/no or on/off");
  CHECK_THAT(parseError({"--tee=7", "p"}), Catch::StartsWith("--tee=7: expected 0 (none)"));
  CHECK_THAT(parseError({"--bogus", "p"}), Catch::StartsWith("unknown flag --bogus"));
  CHECK_THAT(parseError({"--nproc-per-node"}), Catch::Contains("--nproc-per-node"));
  CHECK_THAT(parseError({}), Catch::StartsWith("missing PROGRAM"));
  CHECK_THAT(parseError({"-m", "--no-python", "p"}),
             Catch::StartsWith("--no-python and -m/--module cannot be used together"));
  for (const auto& msg : {parseError({"--nproc-per-node=abc", "p"}), parseError({"--bogus", "p"})}) {
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("bad --config files are named with the problem", "[launcher][options]") {
  CHECK_THAT(parseError({"--config=/nonexistent/ddprun.json", "p"}),
             Catch::StartsWith("--config /nonexistent/ddprun.json: cannot read the file"));
  const std::string notJson = writeConfig("{nproc_per_node: 2");
  CHECK_THAT(parseError({"--config", notJson, "p"}), Catch::Contains(": not valid JSON: "));
  const std::string unknown = writeConfig(R"({"nproc_per_nodes": 2})");
  CHECK_THAT(parseError({"--config", unknown, "p"}),
             Catch::Contains("unknown key \"nproc_per_nodes\""));
  const std::string badValue = writeConfig(R"({"max_restarts": "many"})");
  CHECK(parseError({"--config", badValue, "p"}) ==
        "--max-restarts=many (from --config " + badValue + "): expected an integer >= 0");
  const std::string badType = writeConfig(R"({"nnodes": [1, 2]})");
  CHECK_THAT(parseError({"--config", badType, "p"}),
             Catch::Contains("expected a string, a number or true/false"));
  for (const auto& p : {notJson, unknown, badValue, badType}) std::remove(p.c_str());
}

TEST_CASE("flag --help and --version print and launch nothing", "[launcher][options]") {
  auto help = parseLaunchOptions({"ddprun", "--help"}, {});
  CHECK_FALSE(help.options);
  CHECK_THAT(help.message, Catch::Contains("--nproc-per-node,--nproc_per_node"));
  CHECK_THAT(help.message, Catch::Contains("PET_"));
  auto version = parseLaunchOptions({"ddprun", "--version"}, {});
  CHECK_FALSE(version.options);
  CHECK_THAT(version.message, Catch::StartsWith("ddprun "));
}

TEST_CASE("the example configs/launch_*.json files parse", "[launcher][options]") {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(DDPRUN_SOURCE_DIR) + "/configs")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("launch_", 0) != 0 || entry.path().extension() != ".json") continue;
    INFO(name);
    auto out = parseLaunchOptions({"ddprun", "--config", entry.path().string(), "prog"}, {});
    CHECK(out.options);
    ++seen;
  }
  CHECK(seen >= 3);
}

TEST_CASE("the recovery-policy flag takes replace (the default) or shrink (down to the nnodes "
          "lower bound) or shrink:MIN_RANKS and refuses anything else naming flag and value",
          "[launcher][options][recovery]") {
  CHECK(parse({"prog"}).recoveryPolicy == LaunchOptions::RecoveryPolicy::Replace);
  const auto shrink = parse({"--standalone", "--recovery-policy=shrink", "prog"});
  CHECK(shrink.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink);
  CHECK(shrink.shrinkMinRanks == 1);
  CHECK(parse({"--nnodes=2:4", "--recovery-policy=shrink", "prog"}).shrinkMinRanks == 2);
  const auto floor = parse({"--recovery_policy", "shrink:3", "prog"});
  CHECK(floor.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink);
  CHECK(floor.shrinkMinRanks == 3);
  for (const char* bad : {"grow", "shrink:0", "shrink:", "shrink:x", "Shrink", "shrink:-1"}) {
    INFO(bad);
    CHECK_THAT(parseError({std::string("--recovery-policy=") + bad, "prog"}),
               Catch::Contains(std::string("--recovery-policy=") + bad +
                               ": expected replace, shrink or shrink:MIN_RANKS"));
  }
}
