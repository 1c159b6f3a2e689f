// Slurm's environment -> flag defaults: what each variable becomes, explicit flags winning,
// --nproc-per-node=auto counting Slurm's GPUs, and clear errors for malformed variables.
#include <catch2/catch.hpp>

#include "base/errors.h"
#include "launcher/cluster/slurm.h"
#include "launcher/options.h"

using namespace ddprun;
using namespace ddprun::launcher;
using namespace ddprun::launcher::cluster;

namespace {

Environment step(Environment extra = {}) {
  Environment env{{"SLURM_JOB_ID", "4242"},           {"SLURM_STEP_ID", "0"},
                  {"SLURM_NNODES", "3"},              {"SLURM_NODEID", "1"},
                  {"SLURM_JOB_NODELIST", "gpu[07-09]"}, {"SLURMD_NODENAME", "gpu08"},
                  {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"}};
  for (auto& [k, v] : extra) env[k] = v;
  return env;
}

std::map<std::string, std::string> noScontrol(const std::vector<std::string>&) { return {}; }

std::string errorOf(const Environment& env) {
  try {
    readSlurmStep(env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

ParseOutcome parseUnder(const Environment& env, std::vector<std::string> args,
                        const NodeAddressLookup& lookup = noScontrol) {
  args.insert(args.begin(), "ddprun");
  auto s = readSlurmStep(env);
  REQUIRE(s);
  return parseLaunchOptions(args, env, slurmDefaults(*s, lookup));
}

}  // namespace

TEST_CASE("slurm: not under srun, no step", "[cluster][slurm]") {
  CHECK_FALSE(readSlurmStep({}));
  // An sbatch script or an salloc shell: a job, but no step on every node.
  auto env = step();
  env.erase("SLURM_STEP_ID");
  CHECK_FALSE(readSlurmStep(env));
}

TEST_CASE("slurm: the step's variables", "[cluster][slurm]") {
  auto s = readSlurmStep(step({{"SLURM_GPUS_ON_NODE", "4"}, {"SLURM_CPUS_ON_NODE", "32"}}));
  REQUIRE(s);
  CHECK(s->jobId == "4242");
  CHECK(s->nodeCount == 3);
  CHECK(s->nodeId == 1);
  CHECK(s->nodeName == "gpu08");
  CHECK(s->nodes == std::vector<std::string>{"gpu07", "gpu08", "gpu09"});
  CHECK(s->gpus == 4);
  CHECK(s->cpus == 32);
  // The step's own list and count win over the job's (a step on part of the allocation).
  auto sub = readSlurmStep(step({{"SLURM_STEP_NODELIST", "gpu[08-09]"},
                                 {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NODEID", "0"}}));
  REQUIRE(sub);
  CHECK(sub->nodes == std::vector<std::string>{"gpu08", "gpu09"});
  CHECK(sub->nodeCount == 2);
}

TEST_CASE("slurm: malformed variables are named with their value", "[cluster][slurm]") {
  CHECK_THAT(errorOf(step({{"SLURM_NNODES", "two"}})),
             Catch::Contains("Slurm: SLURM_NNODES=two: expected an integer >= 1"));
  CHECK_THAT(errorOf(step({{"SLURM_NODEID", "-1"}})),
             Catch::Contains("SLURM_NODEID=-1: expected an integer >= 0"));
  CHECK_THAT(errorOf(step({{"SLURM_JOB_NODELIST", "gpu[07-09"}})),
             Catch::Contains("Slurm: SLURM_JOB_NODELIST: hostlist 'gpu[07-09'"));
  CHECK_THAT(errorOf(step({{"SLURM_NNODES", "2"}})),
             Catch::Contains("names 3 node(s), but SLURM_NNODES=2"));
  CHECK_THAT(errorOf(step({{"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}})),
             Catch::Contains("use srun --ntasks-per-node=1"));
}

TEST_CASE("slurm: the step becomes flag defaults", "[cluster][slurm]") {
  auto s = readSlurmStep(step());
  REQUIRE(s);
  std::vector<std::string> asked;
  auto d = slurmDefaults(*s, [&](const std::vector<std::string>& names) {
    asked = names;
    return std::map<std::string, std::string>{{"gpu07", "10.1.0.7"}, {"gpu08", "10.1.0.8"}};
  });
  CHECK(asked == std::vector<std::string>{"gpu07", "gpu08"});  // the store's host and this node
  CHECK(d.source == "Slurm step 4242.0");
  CHECK(d.flags.at("rdzv-backend") == "c10d");
  CHECK(d.flags.at("rdzv-endpoint") == "10.1.0.7:29820");  // 29400 + (10 x 4242 + 0) mod 1000
  CHECK(d.flags.at("rdzv-id") == "4242.0");
  CHECK(d.flags.at("nnodes") == "3");
  CHECK(d.flags.at("local-addr") == "10.1.0.8");
  CHECK(d.flags.at("master-addr") == "10.1.0.7");
  CHECK(d.flags.at("master-port") == "29820");
  CHECK(d.flags.at("node-rank") == "1");
  CHECK(d.nodeRank == 1);
  // Without NodeAddr the names are used (resolved when connecting); IPv6 gets brackets.
  auto byName = slurmDefaults(*s, noScontrol);
  CHECK(byName.flags.at("rdzv-endpoint") == "gpu07:29820");
  CHECK(byName.flags.at("local-addr") == "gpu08");
  auto v6 = slurmDefaults(*s, [](const std::vector<std::string>&) {
    return std::map<std::string, std::string>{{"gpu07", "fd00::7"}};
  });
  CHECK(v6.flags.at("rdzv-endpoint") == "[fd00::7]:29820");
}

TEST_CASE("slurm: a one-node step asks slurmctld nothing", "[cluster][slurm]") {
  auto s = readSlurmStep(step({{"SLURM_NNODES", "1"}, {"SLURM_NODEID", "0"},
                               {"SLURM_JOB_NODELIST", "gpu07"}, {"SLURMD_NODENAME", "gpu07"}}));
  REQUIRE(s);
  bool asked = false;
  auto d = slurmDefaults(*s, [&](const std::vector<std::string>&) {
    asked = true;
    return std::map<std::string, std::string>{};
  });
  CHECK_FALSE(asked);
  CHECK(d.flags.at("nnodes") == "1");
}

TEST_CASE("slurm: scontrol's node lines", "[cluster][slurm]") {
  const std::string text =
      "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=127.0.0.2 "
      "NodeHostName=box Version=22.05.8\n"
      "NodeName=n2 Arch=x86_64 NodeAddr=127.0.0.3 NodeHostName=box\n"
      "NodeName=n3 Arch=x86_64 NodeHostName=box\n";
  auto m = parseScontrolNodes(text);
  CHECK(m == std::map<std::string, std::string>{{"n1", "127.0.0.2"}, {"n2", "127.0.0.3"}});
}

TEST_CASE("slurm: defaults fill LaunchOptions, explicit flags win", "[cluster][slurm]") {
  auto out = parseUnder(step(), {"--nproc-per-node=2", "train.py"});
  REQUIRE(out.options);
  const LaunchOptions& o = *out.options;
  CHECK(o.rdzvBackend == "c10d");
  CHECK(o.rdzvEndpoint == "gpu07:29820");
  CHECK(o.rdzvId == "4242.0");
  CHECK(o.minNodes == 3);
  CHECK(o.maxNodes == 3);
  CHECK(o.localAddr == "gpu08");
  CHECK(o.schedulerNodeRank == 1);
  CHECK(o.nprocPerNode == 2);
  CHECK(std::find(out.fromScheduler.begin(), out.fromScheduler.end(), "rdzv-endpoint") !=
        out.fromScheduler.end());

  // Explicit flags (command line, PET_*) win; --nnodes=MIN:MAX keeps the job elastic.
  auto env = step({{"PET_RDZV_ID", "mine"}});
  auto elastic = parseUnder(env, {"--nnodes=2:3", "--rdzv-endpoint=store:1234", "train.py"});
  REQUIRE(elastic.options);
  CHECK(elastic.options->minNodes == 2);
  CHECK(elastic.options->maxNodes == 3);
  CHECK(elastic.options->rdzvEndpoint == "store:1234");
  CHECK(elastic.options->rdzvId == "mine");
  CHECK(elastic.options->rdzvBackend == "c10d");
  for (const char* f : {"nnodes", "rdzv-endpoint", "rdzv-id"}) {
    CHECK(std::find(elastic.fromScheduler.begin(), elastic.fromScheduler.end(), f) ==
          elastic.fromScheduler.end());
  }
  auto line = describeSlurmDefaults(*readSlurmStep(env), slurmDefaults(*readSlurmStep(env), noScontrol),
                                    elastic.fromScheduler, "c10d");
  CHECK(line == "taken from Slurm step 4242.0 (node 1 of 3, gpu08): --rdzv-backend=c10d "
                "--local-addr=gpu08 (node rank 1)");

  // --standalone lays the job out itself: Slurm's layout does not apply.
  auto alone = parseUnder(step(), {"--standalone", "train.py"});
  CHECK(alone.options->maxNodes == 1);
  CHECK(alone.fromScheduler.empty());
}

TEST_CASE("slurm: steps of one job running at once get their own store and run id",
          "[cluster][slurm]") {
  auto first = readSlurmStep(step());
  auto second = readSlurmStep(step({{"SLURM_STEP_ID", "1"}}));
  REQUIRE(first);
  REQUIRE(second);
  const auto a = slurmDefaults(*first, noScontrol), b = slurmDefaults(*second, noScontrol);
  CHECK(a.flags.at("rdzv-id") == "4242.0");
  CHECK(b.flags.at("rdzv-id") == "4242.1");
  CHECK(a.flags.at("rdzv-endpoint") == "gpu07:29820");
  CHECK(b.flags.at("rdzv-endpoint") == "gpu07:29821");
  // Neighbouring jobs' first steps do not collide either.
  CHECK(slurmStorePort("4243", 0) == 29830);
  CHECK(slurmStorePort("4242", 9) != slurmStorePort("4243", 0));
  CHECK(errorOf(step({{"SLURM_STEP_ID", "x1"}})) ==
        "Slurm: SLURM_STEP_ID=x1: expected a step number (ddprun reads the step's layout from "
        "Slurm's environment)");
}

TEST_CASE("slurm: --nproc-per-node=gpu|auto count the GPUs Slurm gave", "[cluster][slurm]") {
  auto gpus = parseUnder(step({{"SLURM_GPUS_ON_NODE", "4"}, {"SLURM_CPUS_ON_NODE", "16"}}),
                         {"--nproc-per-node=auto", "train.py"});
  CHECK(gpus.options->nprocPerNode == 4);
  auto cpus = parseUnder(step({{"SLURM_GPUS_ON_NODE", "0"}, {"SLURM_CPUS_ON_NODE", "6"}}),
                         {"--nproc-per-node=auto", "train.py"});
  CHECK(cpus.options->nprocPerNode == 6);
  auto none = step({{"SLURM_GPUS_ON_NODE", "0"}});
  auto s = readSlurmStep(none);
  CHECK_THROWS_AS(parseLaunchOptions({"ddprun", "--nproc-per-node=gpu", "x"}, none,
                                     slurmDefaults(*s, noScontrol)),
                  ConfigError);
}
