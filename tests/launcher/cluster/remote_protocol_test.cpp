// What travels between the launching ddprun and its remote agents: the exported environment,
// its block on stdin, records, commands, and the shell-quoted remote command.
#include <catch2/catch.hpp>

#include "base/errors.h"
#include "launcher/cluster/remote_protocol.h"
#include "launcher/cluster/ssh_launch.h"

using namespace ddprun;
using namespace ddprun::launcher;
using namespace ddprun::launcher::cluster;

TEST_CASE("remote: the default set and --export", "[cluster][remote]") {
  const Environment local{{"NCCL_DEBUG", "INFO"},   {"NCCL_IB_HCA", "mlx5"},
                          {"PYTHONPATH", "/src"},   {"OMP_NUM_THREADS", "4"},
                          {"CUDA_VISIBLE_DEVICES", "0,1"}, {"DDPRUN_LOG_LEVEL", "debug"},
                          {"PYTHON_EXEC", "/usr/bin/python3"}, {"HOME", "/home/me"},
                          {"PATH", "/usr/bin"}, {"WANDB_API_KEY", "k"}, {"WANDB_MODE", "off"},
                          {"MY", "1"}};
  auto e = exportedEnvironment(local, {});
  CHECK(e == Environment{{"NCCL_DEBUG", "INFO"}, {"NCCL_IB_HCA", "mlx5"}, {"PYTHONPATH", "/src"},
                         {"OMP_NUM_THREADS", "4"}, {"CUDA_VISIBLE_DEVICES", "0,1"},
                         {"DDPRUN_LOG_LEVEL", "debug"}, {"PYTHON_EXEC", "/usr/bin/python3"}});
  auto more = exportedEnvironment(local, {"MY", "WANDB_*", "NEW=a=b", "NCCL_DEBUG=WARN"});
  CHECK(more.at("MY") == "1");
  CHECK(more.at("WANDB_API_KEY") == "k");
  CHECK(more.at("WANDB_MODE") == "off");
  CHECK(more.at("NEW") == "a=b");
  CHECK(more.at("NCCL_DEBUG") == "WARN");
  CHECK(more.count("HOME") == 0);
  CHECK_THROWS_WITH(exportedEnvironment(local, {"UNSET_HERE"}),
                    Catch::Contains("--export=UNSET_HERE: UNSET_HERE is not set here"));
  CHECK_THROWS_WITH(exportedEnvironment(local, {"1X=2"}),
                    Catch::Contains("--export=1X=2: expected VAR, VAR=VALUE or PREFIX*"));
  CHECK_THROWS_AS(exportedEnvironment(local, {""}), ConfigError);
}

TEST_CASE("remote: the environment block, fed in any pieces", "[cluster][remote]") {
  const Environment env{{"A", "1"}, {"B", "x=y\nz"}, {"EMPTY", ""}};
  const std::string bytes = encodeEnvBlock(env) + "signal 2\n";
  for (size_t piece : {1, 3, 7, 1000}) {
    EnvBlockDecoder d;
    bool done = false;
    std::string after;
    for (size_t i = 0; i < bytes.size(); i += piece) {
      const auto chunk = std::string_view(bytes).substr(i, piece);
      if (done) after += chunk;
      else if (d.feed(chunk)) {
        done = true;
        after = d.rest();
      }
    }
    CHECK(done);
    CHECK(d.environment() == env);
    CHECK(after == "signal 2\n");
  }
  EnvBlockDecoder bad;
  CHECK_THROWS_AS(bad.feed("GET / HTTP/1.1\r\n"), ProtocolError);
  EnvBlockDecoder badEntry;
  CHECK_THROWS_AS(badEntry.feed(std::string("DDPRUN-ENV\nnoequals") + '\0'), ProtocolError);
}

TEST_CASE("remote: records and commands", "[cluster][remote]") {
  for (const Record& r : {Record{.kind = Record::Kind::Started},
                          Record{.kind = Record::Kind::Store, .port = 41234},
                          Record{.kind = Record::Kind::RootCause, .rank = 3, .code = 7,
                                 .text = "exit code 7"}}) {
    const std::string line = formatRecord(r);
    CHECK(line.front() == kRecordMark);
    auto back = parseRecord(line);
    REQUIRE(back);
    CHECK(back->kind == r.kind);
    CHECK(back->port == r.port);
    CHECK(back->rank == r.rank);
    CHECK(back->code == r.code);
    CHECK(back->text == r.text);
  }
  CHECK_FALSE(parseRecord("[node 0 rank 0]: \x1fstarted"));
  CHECK_FALSE(parseRecord("started"));
  CHECK_FALSE(parseRecord("\x1fstore 0"));
  CHECK_FALSE(parseRecord("\x1fstore 70000"));
  CHECK_FALSE(parseRecord("\x1fstarted now"));
  CHECK(formatRecord({.kind = Record::Kind::RootCause, .text = "a\nb"}).find('\n') ==
        std::string::npos);
  CHECK(parseCommand("signal 15") == 15);
  CHECK_FALSE(parseCommand("signal 0"));
  CHECK_FALSE(parseCommand("signal x"));
  CHECK_FALSE(parseCommand("kill 9"));
}

TEST_CASE("remote: shell quoting and the remote command", "[cluster][remote]") {
  CHECK(shellQuote("plain") == "'plain'");
  CHECK(shellQuote("it's $HOME `x`") == "'it'\\''s $HOME `x`'");
  CHECK(remoteCommandLine("/work dir", {"/usr/bin/ddprun", "--remote-agent", "a b"}) ==
        "cd '/work dir' 2>/dev/null; exec '/usr/bin/ddprun' '--remote-agent' 'a b'");
}

TEST_CASE("ssh launch: each remote agent's command line", "[cluster][ssh]") {
  const HostSlots h{.host = "user@h2", .slots = 4};
  auto argv = remoteAgentArgv(RemoteAgentInputs{
      .ddprunPath = "/usr/bin/ddprun",
      .given = {{"nproc-per-node", "2"}, {"max-restarts", "3"}, {"hosts", "h1:2,user@h2:4"},
                {"rdzv-conf", "heartbeat=1"}, {"no-python", "1"}, {"module", "0"},
                {"log-dir", "/logs"}},
      .host = &h, .nodeRank = 1, .hostCount = 2, .runId = "job", .endpoint = "h1:41234",
      .isHost = false, .program = "train.py", .programArgs = {"--epochs", "3"}});
  CHECK(argv == std::vector<std::string>{
                    "/usr/bin/ddprun", "--remote-agent", "--max-restarts=3", "--no-python",
                    "--log-dir=/logs", "--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=h1:41234", "--rdzv-id=job", "--node-rank=1",
                    "--rdzv-conf=heartbeat=1,is_host=0", "--", "train.py", "--epochs", "3"});
  // No slots: the given --nproc-per-node travels as written (auto counts on the host).
  const HostSlots bare{.host = "h1"};
  auto first = remoteAgentArgv(RemoteAgentInputs{
      .ddprunPath = "ddprun", .given = {{"nproc-per-node", "auto"}, {"nnodes", "1:2"}},
      .host = &bare, .hostCount = 2, .runId = "r", .endpoint = "h1:0", .isHost = true,
      .program = "p"});
  CHECK(first == std::vector<std::string>{"ddprun", "--remote-agent", "--nnodes=1:2",
                                          "--nproc-per-node=auto", "--rdzv-backend=c10d",
                                          "--rdzv-endpoint=h1:0", "--rdzv-id=r", "--node-rank=0",
                                          "--rdzv-conf=is_host=1", "--", "p"});
}

TEST_CASE("ssh launch: ssh's command line", "[cluster][ssh]") {
  CHECK(sshArgv({}, {}, "h1", "cmd") ==
        std::vector<std::string>{"ssh", "-T", "-o", "BatchMode=yes", "--", "h1", "cmd"});
  CHECK(sshArgv(splitWords("  ssh -F /etc/x  "), {"Port=2222", "IdentityFile /k"}, "u@h", "c") ==
        std::vector<std::string>{"ssh", "-F", "/etc/x", "-o", "Port=2222", "-o",
                                 "IdentityFile /k", "-T", "-o", "BatchMode=yes", "--", "u@h", "c"});
}
