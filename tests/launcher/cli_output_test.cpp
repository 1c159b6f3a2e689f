// The real ddprun binary: what workers see (environment, argv) and what users see (console
// lines, log files, failure report, errors for bad flags).
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "ddprun_process.h"
#include "rendezvous/node_address.h"

using namespace ddprun::testing;

namespace {

// A worker's environment as its process got it (NUL-separated /proc/PID/environ).
Env readEnviron(const std::string& path) {
  Env env;
  const std::string raw = readFile(path);
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    const std::string entry = raw.substr(start, end - start);
    const auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
    start = end + 1;
  }
  return env;
}

}  // namespace

TEST_CASE("each worker gets the launcher's environment plus torchrun's variables",
          "[launcher][cli][env]") {
  for (int nproc : {1, 2, 4}) {
    INFO("nproc " << nproc);
    TempDir dir;
    auto r = runDdprun({"--standalone", "--nproc-per-node=" + std::to_string(nproc),
                        "--max-restarts=1", "sh", "-c",
                        "exec cat /proc/self/environ > " + dir.path() + "/env.$LOCAL_RANK"});
    REQUIRE(r.code == 0);
    std::smatch port;
    REQUIRE(std::regex_search(r.err, port, std::regex("agent store on 127\\.0\\.0\\.1:(\\d+)")));
    std::string runId;
    for (int lr = 0; lr < nproc; ++lr) {
      Env env = readEnviron(dir / ("env." + std::to_string(lr)));
      std::set<std::string> added;
      for (const auto& [k, v] : env) {
        if (!baseEnv().count(k) && k != "PWD") added.insert(k);  // dash exports PWD itself
      }
      std::set<std::string> expected{
          "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
          "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
          "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
          "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
          "DDPRUN_PROGRESS_FILE", "DDPRUN_PROGRESS_SLOT",  // --stall-warning's (progress_watch.h)
          "DDPRUN_RECOVERY"};  // --recovery (docs/recovery.md)
      if (nproc > 1) expected.insert("OMP_NUM_THREADS");
      CHECK(added == expected);
      for (const auto& [k, v] : baseEnv()) CHECK(env[k] == v);
      CHECK(env["RANK"] == std::to_string(lr));
      CHECK(env["LOCAL_RANK"] == std::to_string(lr));
      CHECK(env["ROLE_RANK"] == std::to_string(lr));
      CHECK(env["WORLD_SIZE"] == std::to_string(nproc));
      CHECK(env["LOCAL_WORLD_SIZE"] == std::to_string(nproc));
      CHECK(env["ROLE_WORLD_SIZE"] == std::to_string(nproc));
      CHECK(env["GROUP_RANK"] == "0");
      CHECK(env["GROUP_WORLD_SIZE"] == "1");
      CHECK(env["ROLE_NAME"] == "default");
      CHECK(env["MASTER_ADDR"] == "127.0.0.1");
      CHECK(env["MASTER_PORT"] == port[1].str());
      CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
      CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "1");
      CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");
      CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");
      CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
      CHECK_THAT(env["TORCHELASTIC_ERROR_FILE"],
                 Catch::EndsWith("/attempt_0/" + std::to_string(lr) + "/error.json"));
      if (nproc > 1) CHECK(env["OMP_NUM_THREADS"] == "1");
      CHECK(env["TORCHELASTIC_RUN_ID"].size() == 36);
      if (lr > 0) CHECK(env["TORCHELASTIC_RUN_ID"] == runId);
      runId = env["TORCHELASTIC_RUN_ID"];
    }
  }
}

TEST_CASE("flag --no-agent-store: a free MASTER_PORT and USE_AGENT_STORE=False",
          "[launcher][cli][env]") {
  TempDir dir;
  auto r = runDdprun({"--standalone", "--no-agent-store", "--nproc-per-node=2", "sh", "-c",
                      "echo $MASTER_ADDR $MASTER_PORT $TORCHELASTIC_USE_AGENT_STORE > " +
                          dir.path() + "/env.$RANK"});
  REQUIRE(r.code == 0);
  CHECK(readFile(dir / "env.0") == readFile(dir / "env.1"));
  CHECK_THAT(readFile(dir / "env.0"), Catch::Matches("127\\.0\\.0\\.1 [1-9]\\d* False\n"));
  CHECK(r.err.find("agent store") == std::string::npos);
}

TEST_CASE("console lines carry the rank prefix, whole, and in order per worker",
          "[launcher][cli][output]") {
  // Each line is written in three pieces, so the pieces of different workers race.
  auto r = runDdprun({"--standalone", "--nproc-per-node=4", "sh", "-c",
                      "i=0; while [ $i -lt 300 ]; do printf 'w%s-' $RANK; printf 'line%s-' $i; "
                      "printf 'end\\n'; printf 'e%s-%s\\n' $RANK $i >&2; i=$((i+1)); done"});
  REQUIRE(r.code == 0);
  for (auto [text, tag] : {std::pair{r.out, "w"}, std::pair{r.err, "e"}}) {
    std::map<int, int> next;
    int count = 0;
    const std::regex re(std::string("\\[rank (\\d)\\]: ") + tag + "(\\d)-(?:line)?(\\d+)(?:-end)?");
    for (const auto& line : lines(text)) {
      if (line.rfind("[ddprun ", 0) == 0) continue;  // ddprun's own log lines
      std::smatch m;
      INFO(line);
      REQUIRE(std::regex_match(line, m, re));
      const int rank = std::stoi(m[1]);
      CHECK(std::stoi(m[2]) == rank);
      CHECK(std::stoi(m[3]) == next[rank]);
      next[rank] = std::stoi(m[3]) + 1;
      ++count;
    }
    CHECK(count == 4 * 300);
  }
}

TEST_CASE("a single worker's lines carry no prefix", "[launcher][cli][output]") {
  auto r = runDdprun({"--standalone", "sh", "-c", "echo plain"});
  CHECK(r.code == 0);
  CHECK(r.out == "plain\n");
}

TEST_CASE("flag --log-dir, --redirects and --tee use torchrun's layout", "[launcher][cli][output]") {
  TempDir logs;
  const std::vector<std::string> args{"--log-dir=" + logs.path(), "--rdzv-id=myjob",
                                      "--nproc-per-node=2", "--master-port=0", "-r", "1",
                                      "-t", "2", "sh", "-c",
                                      "echo out$RANK; echo err$RANK >&2; "
                                      "echo $TORCHELASTIC_ERROR_FILE > $(dirname "
                                      "$TORCHELASTIC_ERROR_FILE)/where"};
  auto r = runDdprun(args);
  REQUIRE(r.code == 0);
  CHECK(r.out.empty());  // stdout redirected to files only
  CHECK_THAT(r.err, Catch::Contains("[rank 0]: err0") && Catch::Contains("[rank 1]: err1"));
  for (int lr = 0; lr < 2; ++lr) {
    const std::string d = logs.path() + "/myjob/attempt_0/" + std::to_string(lr);
    CHECK(readFile(d + "/stdout.log") == "out" + std::to_string(lr) + "\n");
    CHECK(readFile(d + "/stderr.log") == "err" + std::to_string(lr) + "\n");
    CHECK(readFile(d + "/where") == d + "/error.json\n");
  }
  // The same run id again: the first job's logs are kept, the second goes next to them.
  auto again = runDdprun(args);
  REQUIRE(again.code == 0);
  CHECK(readFile(logs.path() + "/myjob.1/attempt_0/1/stdout.log") == "out1\n");
  CHECK(readFile(logs.path() + "/myjob/attempt_0/1/stdout.log") == "out1\n");
}

TEST_CASE("flag --local-ranks-filter: other ranks go to their log files only",
          "[launcher][cli][output]") {
  TempDir logs;
  auto r = runDdprun({"--standalone", "--log-dir", logs.path(), "--nproc-per-node=3",
                      "--local-ranks-filter=1", "sh", "-c", "echo hello$RANK"});
  REQUIRE(r.code == 0);
  CHECK(r.out == "[rank 1]: hello1\n");
  const std::string listing = [&] {
    std::string s;
    for (auto& e : std::filesystem::directory_iterator(logs.path())) s += e.path().filename().string();
    return s;
  }();
  CHECK(readFile(logs.path() + "/" + listing + "/attempt_0/0/stdout.log") == "hello0\n");
  CHECK(readFile(logs.path() + "/" + listing + "/attempt_0/2/stdout.log") == "hello2\n");
}

TEST_CASE("the failure report shows the error file written by the worker and its stderr",
          "[launcher][cli][report]") {
  const std::string json =
      R"({"message": {"message": "RuntimeError: loss is NaN", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 7\nRuntimeError: loss is NaN", "timestamp": "1700000000"}}})";
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                      "if [ $RANK = 1 ]; then echo 'step 99 diverged' >&2; printf '%s' '" + json +
                          "' > $TORCHELASTIC_ERROR_FILE; exit 5; fi; sleep 30"});
  CHECK(r.code == 5);
  CHECK_THAT(r.err, Catch::Contains("message    : RuntimeError: loss is NaN"));
  CHECK_THAT(r.err, Catch::Contains("    File \"train.py\", line 7"));
  CHECK_THAT(r.err, Catch::Contains("timestamp  : 1700000000"));
  CHECK_THAT(r.err, Catch::Contains("last 1 lines of its stderr:\n    step 99 diverged\n"));
  CHECK_THAT(r.err, Catch::Matches("(.|\n)*pid        : [1-9][0-9]*\n(.|\n)*"));
}

TEST_CASE(".py runs under $PYTHON_EXEC -u, with --pass-local-rank and ${local_rank}",
          "[launcher][cli][command]") {
  TempDir dir;
  // A shell script stands in for the interpreter: `sh -u script.py ARGS` runs it as a script.
  const std::string script = dir / "train.py";
  std::ofstream(script) << "echo \"$@\" > " << dir.path() << "/argv.$LOCAL_RANK\n";
  Env env = baseEnv();
  env["PYTHON_EXEC"] = "/bin/sh";
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--pass-local-rank", script,
                      "--out=file.${local_rank}"},
                     env);
  REQUIRE(r.code == 0);
  CHECK(readFile(dir / "argv.0") == "--local_rank=0 --out=file.0\n");
  CHECK(readFile(dir / "argv.1") == "--local_rank=1 --out=file.1\n");
}

TEST_CASE("bad flags: one line naming flag, value and what is allowed (exit 2)",
          "[launcher][cli][errors]") {
  auto r = runDdprun({"--nproc-per-node=abc", "true"});
  CHECK(r.code == 2);
  CHECK(r.err == "ddprun: --nproc-per-node=abc: expected a number of workers >= 1, 'cpu', "
                 "'gpu' or 'auto'\n");
  Env env = baseEnv();
  env["PET_NNODES"] = "3:1";
  auto pet = runDdprun({"true"}, env);
  CHECK(pet.code == 2);
  CHECK(pet.err == "ddprun: --nnodes=3:1 (from PET_NNODES): expected N or MIN:MAX with 1 <= "
                   "MIN <= MAX (e.g. 2 or 1:4)\n");
  auto unknown = runDdprun({"--nproc-per-nod=2", "true"});
  CHECK(unknown.code == 2);
  CHECK(unknown.err == "ddprun: unknown flag --nproc-per-nod=2 (see ddprun --help)\n");
  auto rank = runDdprun({"--node-rank=1", "true"});
  CHECK(rank.code == 2);
  CHECK(rank.err == "ddprun: --node-rank=1: expected 0 for a single-node job (--nnodes=1)\n");
  auto help = runDdprun({"--help"});
  CHECK(help.code == 0);
  CHECK_THAT(help.out, Catch::Contains("--max-restarts,--max_restarts"));
}

TEST_CASE("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE replaces the prefix", "[launcher][cli][output]") {
  Env env = baseEnv();
  env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[${role_name}${local_rank}]:";
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--role=trainer", "sh", "-c",
                      "echo hi$LOCAL_RANK"},
                     env);
  REQUIRE(r.code == 0);
  auto out = lines(r.out);
  std::sort(out.begin(), out.end());
  CHECK(out == std::vector<std::string>{"[trainer0]:hi0", "[trainer1]:hi1"});
}

TEST_CASE("ddprun's own TORCHELASTIC_ERROR_FILE holds the root cause, written only on failure",
          "[launcher][cli][report]") {
  TempDir dir;
  const std::string own = dir / "ddprun-error.json";
  Env env = baseEnv();
  env["TORCHELASTIC_ERROR_FILE"] = own;

  // Success: nothing is written.
  auto ok = runDdprun({"--standalone", "--nproc-per-node=2", "true"}, env);
  REQUIRE(ok.code == 0);
  CHECK_FALSE(std::filesystem::exists(own));

  // The root cause wrote an error file: its document, with the exit code as errorCode.
  const std::string json =
      R"({"message": {"message": "RuntimeError: loss is NaN", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}})";
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                      "if [ $RANK = 1 ]; then printf '%s' '" + json +
                          "' > $TORCHELASTIC_ERROR_FILE; exit 5; fi; sleep 30"},
                     env);
  REQUIRE(r.code == 5);
  auto j = nlohmann::json::parse(readFile(own));
  CHECK(j["message"]["message"] == "RuntimeError: loss is NaN");
  CHECK(j["message"]["extraInfo"]["py_callstack"] == "Traceback ...");
  CHECK(j["message"]["errorCode"] == 5);
  // The worker got its own path, not ddprun's.
  std::smatch m;
  REQUIRE(std::regex_search(r.err, m, std::regex(R"(error file : (\S+error\.json))")));
  CHECK(m[1] != own);

  // A worker killed by a signal wrote none: a generated record names the signal.
  auto k = runDdprun({"--standalone", "--nproc-per-node=1", "sh", "-c", "kill -9 $$$$"}, env);
  REQUIRE(k.code == 137);
  j = nlohmann::json::parse(readFile(own));
  CHECK_THAT(j["message"]["message"].get<std::string>(),
             Catch::Matches("Signal 9 \\(SIGKILL\\) received by PID [0-9]+"));
  CHECK(j["message"]["errorCode"] == 137);
  CHECK(j["message"]["extraInfo"].contains("timestamp"));
  // No temporary file is left next to it (written under another name, then renamed).
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("a failed job keeps its run directory: the error file the report names exists",
          "[launcher][cli][report]") {
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                      "if [ $RANK = 1 ]; then echo '{\"message\": \"disk on fire\"}' > "
                      "$TORCHELASTIC_ERROR_FILE; exit 3; fi; sleep 30"});
  REQUIRE(r.code == 3);
  std::smatch m;
  REQUIRE(std::regex_search(r.err, m, std::regex(R"(error file : (\S+error\.json))")));
  const std::string path = m[1];
  CHECK(std::filesystem::exists(path));
  CHECK_THAT(readFile(path), Catch::Contains("disk on fire"));
  CHECK_THAT(r.err, Catch::Contains("Worker logs and error files are kept in "));
  // A C++ (or shell) worker is not told to decorate a Python main.
  auto s = runDdprun({"--standalone", "--nproc-per-node=1", "sh", "-c", "exit 4"});
  CHECK_THAT(s.err, !Catch::Contains("torch.distributed.elastic"));
  CHECK_THAT(s.err, Catch::Contains("ddprun::runtime::recordError"));
  // After a success the temporary directory is gone.
  auto ok = runDdprun({"--standalone", "--nproc-per-node=1", "sh", "-c",
                       "dirname $(dirname $(dirname $TORCHELASTIC_ERROR_FILE))"});
  REQUIRE(ok.code == 0);
  std::string base = ok.out;
  while (!base.empty() && (base.back() == '\n' || base.back() == ' ')) base.pop_back();
  REQUIRE(!base.empty());
  CHECK_FALSE(std::filesystem::exists(base));
}

TEST_CASE("a failed job whose workers wrote no file leaves nothing in TMPDIR, and its report "
          "names no directory", "[launcher][cli][report]") {
  TempDir tmp;
  Env env = baseEnv();
  env["TMPDIR"] = tmp.path();
  // No error file, no redirected output: the run directory holds only empty worker directories.
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                      "test -d $(dirname $TORCHELASTIC_ERROR_FILE) || exit 9; "
                      "if [ $RANK = 1 ]; then exit 3; fi; sleep 30"},
                     env);
  CHECK(r.code == 3);
  CHECK_THAT(r.err, Catch::Contains("exit code 3 -> ddprun exits with 3"));
  CHECK_THAT(r.err, !Catch::Contains("are kept in"));
  CHECK(std::filesystem::is_empty(tmp.path()));
  // One file anywhere in it (a worker's own, not an error file): the directory is kept and named.
  auto kept = runDdprun({"--standalone", "--nproc-per-node=2", "sh", "-c",
                         "if [ $RANK = 1 ]; then echo partial > $(dirname "
                         "$TORCHELASTIC_ERROR_FILE)/notes.txt; exit 3; fi; sleep 30"},
                        env);
  CHECK(kept.code == 3);
  std::smatch m;
  REQUIRE(std::regex_search(kept.err, m, std::regex(R"(are kept in (\S+) \(ddprun deletes)")));
  CHECK(std::filesystem::path(m[1].str()).parent_path() == std::filesystem::path(tmp.path()));
  CHECK(readFile(m[1].str() + "/attempt_0/1/notes.txt") == "partial\n");
}

TEST_CASE("the run directory is made when the workers start: the rendezvous creates nothing",
          "[launcher][cli][report]") {
  // A job whose workers never start (its rendezvous times out) leaves nothing in TMPDIR.
  TempDir tmp;
  Env env = baseEnv();
  env["TMPDIR"] = tmp.path();
  auto lone = runDdprun({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                         "--rdzv-endpoint=127.0.0.1:" + std::to_string(ddprun::rendezvous::pickFreePort()),
                         "--rdzv-id=lazy", "--rdzv-conf=join_timeout=1", "true"},
                        env);
  CHECK(lone.code != 0);
  CHECK(std::filesystem::is_empty(tmp.path()));
  // Its workers' directories are there once they run, and only those: the progress table is
  // in the agent's memory, named in /proc, readable and writable by the worker.
  auto ok = runDdprun({"--standalone", "--nproc-per-node=1", "sh", "-c",
                       "case $DDPRUN_PROGRESS_FILE in /proc/*/fd/*) ;; *) exit 5 ;; esac; "
                       "test -r $DDPRUN_PROGRESS_FILE -a -w $DDPRUN_PROGRESS_FILE || exit 6; "
                       "ls -A $(dirname $(dirname $(dirname $TORCHELASTIC_ERROR_FILE)))"},
                      env);
  CHECK(ok.code == 0);
  CHECK(ok.out == "attempt_0\n");
  CHECK(std::filesystem::is_empty(tmp.path()));  // and gone after the success
  // A missing TMPDIR is still refused at the start, naming it.
  env["TMPDIR"] = tmp / "missing";
  auto bad = runDdprun({"--standalone", "--nproc-per-node=1", "true"}, env);
  CHECK(bad.code != 0);
  CHECK_THAT(bad.err, Catch::Contains("cannot create a temporary directory " + tmp.path() +
                                      "/missing/ddprun-"));
  CHECK_THAT(bad.err, Catch::Contains("No such file or directory"));
}

TEST_CASE("an error a restart cannot fix ends the job at once, whatever the budget",
          "[launcher][cli][report]") {
  const std::string json =
      R"({"message": {"message": "IncompatibleCheckpoint: checkpoint ckpt-5.ddpck does not fit this model", "extraInfo": {"timestamp": "1700000000", "exceptionType": "ddprun::runtime::IncompatibleCheckpoint", "retryable": false}}})";
  TempDir dir;
  auto r = runDdprun({"--standalone", "--nproc-per-node=2", "--max-restarts=5", "sh", "-c",
                      "echo start >> " + dir.path() + "/starts.$RANK; if [ $RANK = 1 ]; then printf '%s' '" +
                          json + "' > $TORCHELASTIC_ERROR_FILE; exit 2; fi; sleep 30"});
  CHECK(r.code == 2);
  CHECK(readFile(dir / "starts.1") == "start\n");  // one attempt: no restart spent
  CHECK_THAT(r.err, Catch::Contains("type       : ddprun::runtime::IncompatibleCheckpoint"));
  CHECK_THAT(r.err, Catch::Contains("retryable  : no"));
  CHECK_THAT(r.err, Catch::Contains("0 of 5 restarts used"));
  CHECK_THAT(r.err, !Catch::Contains("restarting"));
}
