// Command line -> LaunchOptions. Two passes: first every flag's raw text is gathered from its
// source (command line, --config JSON, PET_* environment, default); then each raw value is
// converted by a pure parser (option_values.h). A bad value is reported with its source.
#include "launcher/options.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "launcher/devices.h"
#include "launcher/option_values.h"
#include "base/errors.h"
#include "base/log.h"

extern char** environ;

namespace ddprun::launcher {
namespace {

// One flag of torchrun (or of ddprun). `name` is the dash spelling; the underscore spelling
// and PET_<NAME> are derived from it.
struct Flag {
  const char* name;
  const char* shortName;  // "" when none
  bool isSwitch;
  const char* defaultValue;
  const char* help;
};

constexpr Flag kFlags[] = {
    {"nnodes", "", false, "1:1", "number of nodes: N or MIN:MAX"},
    {"nproc-per-node", "", false, "1", "workers per node: N, cpu, gpu or auto"},
    {"rdzv-backend", "", false, "static", "rendezvous backend: static, c10d or etcd-v3"},
    {"rdzv-endpoint", "", false, "", "rendezvous endpoint HOST[:PORT] (etcd-v3: every member, comma-separated)"},
    {"rdzv-id", "", false, "none", "job id shared by every node"},
    {"rdzv-conf", "", false, "", "rendezvous settings k=v,k2=v2"},
    {"standalone", "", true, "0", "single node with a free port and a random run id"},
    {"max-restarts", "", false, "0", "restarts of the worker group before the job fails"},
    {"monitor-interval", "", false, "0.1",
     "accepted for compatibility; unused (ddprun wakes on each worker exit)"},
    {"start-method", "", false, "spawn",
     "accepted for compatibility (spawn, fork, forkserver): Python entry points only"},
    {"role", "", false, "default", "user-defined role of the workers (ROLE_NAME)"},
    {"module", "m", true, "0", "PROGRAM is a Python module, run as python -m"},
    {"no-python", "", true, "0", "execute PROGRAM directly, even a .py file"},
    {"run-path", "", true, "0",
     "accepted for compatibility: runs PROGRAM as a Python script, like a .py file"},
    {"log-dir", "", false, "", "directory for worker logs and error files"},
    {"timeline", "", false, "",
     "write the job's timeline (Chrome trace JSON: Perfetto, chrome://tracing) to FILE"},
    {"redirects", "r", false, "0",
     "worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or 0:1,1:2"},
    {"tee", "t", false, "0", "worker streams to the console and to log files (as --redirects)"},
    {"local-ranks-filter", "", false, "", "local ranks whose output reaches the console: 0,1"},
    {"node-rank", "", false, "0", "rank of this node (static backend)"},
    {"master-addr", "", false, "127.0.0.1", "address of node 0 (static backend)"},
    {"master-port", "", false, "29500", "port of node 0's store (static backend; 0 = free)"},
    {"local-addr", "", false, "", "address this node advertises"},
    {"shutdown-timeout", "", false, "30", "seconds between the stop signal and SIGKILL"},
    {"stall-warning", "", false, "auto",
     "warn when a worker makes no progress for this long: SECONDS, auto (10 x its step time, "
     "at least 3 s) or 0 (off)"},
    {"peer-timeout", "", false, "5",
     "kill a worker whose heartbeat stopped this long (it is stopped or frozen, not slow) and "
     "restart: SECONDS or 0 (off); only workers whose runtime beats"},
    {"recovery", "", false, "auto",
     "after a worker's death: restart (every worker starts again), in-process (the others keep "
     "running, a replacement heals from their memory) or auto (in-process when every worker's "
     "runtime supports it, else restart); one node"},
    {"recovery-policy", "", false, "replace",
     "what an in-process recovery does with a dead rank: replace (a spare or a new process "
     "takes it; world size and data shards stay) or shrink (the others go on without it, the "
     "rest of the epoch split over them; on one node a replacement grows the group back at a "
     "commit; "
     "down to 1 rank, or shrink:MIN_RANKS)"},
    {"spares", "", false, "0",
     "hot spares per node: workers started and loaded, waiting for a rank, that take a dead "
     "worker's rank in an in-process recovery (under shrink too, when loaded: the group then "
     "does not shrink), or under shrink grow the group back at its next commit (0-64; not "
     "with --recovery=restart)"},
    {"signals-to-handle", "", false, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "signals forwarded to the workers"},
    {"pass-local-rank", "", true, "0",
     "give each worker --local_rank=N, as torch.distributed.launch did"},
    {"no-agent-store", "", true, "0",
     "workers get a free MASTER_PORT of their own instead of the agent's store"},
    {"hosts", "", false, "", "start one agent per host over ssh: HOST[:SLOTS],... (h1:2,h2:2)"},
    {"hostfile", "", false, "", "as --hosts, from a file of lines 'HOST slots=N' (# comments)"},
};

std::string underscored(std::string s) {
  for (auto& c : s) c = (c == '-') ? '_' : c;
  return s;
}
std::string envName(const Flag& f) {
  std::string s = "PET_" + underscored(f.name);
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A flag's text and where it came from, for error messages.
struct Raw {
  std::string value;
  std::string source;  // "" (command line or default), "PET_X", "config FILE", scheduler's
  bool given = false;  // not a default (neither the table's nor the scheduler's)
};

[[noreturn]] void badFlag(const std::string& flag, const Raw& raw, const std::string& allowed) {
  std::ostringstream os;
  os << "--" << flag << "=" << raw.value;
  if (!raw.source.empty()) os << " (from " << raw.source << ")";
  os << ": " << allowed;
  throw ConfigError(os.str());
}

// The --config file as flag name -> text. Unknown keys and non-scalar values are errors.
struct ConfigFile {
  std::map<std::string, std::string> flags;
  std::optional<std::string> program;
  std::vector<std::string> args;
};

ConfigFile readConfig(const std::string& path) {
  const std::string where = "--config " + path;
  std::ifstream in(path);
  if (!in) throw ConfigError(where + ": cannot read the file: " + std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError(where + ": expected a JSON object of flag: value");
  ConfigFile cfg;
  for (const auto& [rawKey, value] : j.items()) {
    std::string key = rawKey;
    while (!key.empty() && key.front() == '-') key.erase(0, 1);
    for (auto& c : key) c = (c == '_') ? '-' : c;
    if (key == "program") {
      if (!value.is_string()) throw ConfigError(where + ": \"program\" must be a string");
      cfg.program = value.get<std::string>();
      continue;
    }
    if (key == "args") {
      if (!value.is_array()) throw ConfigError(where + ": \"args\" must be an array of strings");
      for (const auto& a : value) {
        if (!a.is_string()) throw ConfigError(where + ": \"args\" must be an array of strings");
        cfg.args.push_back(a.get<std::string>());
      }
      continue;
    }
    const Flag* flag = nullptr;
    for (const auto& f : kFlags) {
      if (key == f.name) flag = &f;
    }
    if (flag == nullptr) {
      throw ConfigError(where + ": unknown key \"" + rawKey +
                        "\": allowed are the flags of ddprun --help without dashes, "
                        "\"program\" and \"args\"");
    }
    if (value.is_string()) {
      cfg.flags[key] = value.get<std::string>();
    } else if (value.is_boolean()) {
      cfg.flags[key] = value.get<bool>() ? "1" : "0";
    } else if (value.is_number_integer()) {
      cfg.flags[key] = std::to_string(value.get<long long>());
    } else if (value.is_number()) {
      cfg.flags[key] = value.dump();
    } else {
      throw ConfigError(where + ": \"" + rawKey + "\": " + value.dump() +
                        ": expected a string, a number or true/false");
    }
  }
  return cfg;
}

std::string randomRunId() {
  // A version-4 UUID, as torchrun uses for --standalone.
  std::random_device rd;
  std::uniform_int_distribution<int> byte(0, 255);
  unsigned char b[16];
  for (auto& x : b) x = static_cast<unsigned char>(byte(rd));
  b[6] = static_cast<unsigned char>((b[6] & 0x0F) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3F) | 0x80);
  char out[37];
  std::snprintf(out, sizeof out,
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

// Converts the gathered raw values into LaunchOptions.
LaunchOptions convert(const std::map<std::string, Raw>& raw, const SchedulerDefaults& scheduler) {
  auto get = [&](const char* name) -> const Raw& { return raw.at(name); };
  // Runs a pure parser; a BadValue becomes a ConfigError naming flag, value and source.
  auto parse = [&](const char* name, auto&& fn) {
    try {
      return fn(get(name).value);
    } catch (const BadValue& e) {
      badFlag(name, get(name), e.what());
    }
  };
  auto oneOf = [&](const char* name, std::initializer_list<const char*> allowed) {
    const std::string& v = get(name).value;
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return v;
      list += list.empty() ? std::string(a) : std::string(", ") + a;
    }
    badFlag(name, get(name), "expected one of " + list);
  };
  auto nonEmpty = [&](const char* name) {
    if (get(name).value.empty()) badFlag(name, get(name), "expected a non-empty value");
    return get(name).value;
  };
  auto flag = [&](const char* name) { return parse(name, [](auto& v) { return parseBool(v); }); };
  constexpr int kMaxInt = std::numeric_limits<int>::max();

  LaunchOptions o;
  o.nprocPerNode = parse("nproc-per-node", [&](auto& v) {
    // What a scheduler gave this node, else what the machine has.
    return parseNproc(v, DeviceCounts{
        .cpus = [&] { return scheduler.cpus ? *scheduler.cpus : cpuCount(); },
        .gpus = [&] { return scheduler.gpus ? *scheduler.gpus : cudaDeviceCount(); }});
  });
  std::tie(o.minNodes, o.maxNodes) = parse("nnodes", [](auto& v) { return parseNodeRange(v); });
  if (get("rdzv-backend").value == "etcd" || get("rdzv-backend").value == "etcd-v2") {
    badFlag("rdzv-backend", get("rdzv-backend"),
            "torchrun's etcd and etcd-v2 backends speak etcd's deprecated v2 API and keep "
            "pickled Python state; ddprun speaks etcd's v3 API: use --rdzv-backend=etcd-v3 with "
            "--rdzv-endpoint=HOST:PORT,HOST:PORT,... (every member of the cluster)");
  }
  o.rdzvBackend = oneOf("rdzv-backend", {"static", "c10d", "etcd-v3"});
  o.rdzvEndpoint = get("rdzv-endpoint").value;
  if (!o.rdzvEndpoint.empty()) {
    // etcd-v3 lists every member of the cluster; the others name one store.
    if (o.rdzvBackend == "etcd-v3") parse("rdzv-endpoint", [](auto& v) { return parseEndpointList(v); });
    else parse("rdzv-endpoint", [](auto& v) { return parseEndpoint(v); });
  }
  o.rdzvId = nonEmpty("rdzv-id");
  o.rdzvConf = parse("rdzv-conf", [](auto& v) { return parseKeyValues(v); });
  o.standalone = flag("standalone");
  o.maxRestarts = parse("max-restarts", [&](auto& v) { return parseInt(v, 0, kMaxInt); });
  o.monitorInterval = parse("monitor-interval", [](auto& v) { return parseSeconds(v); });
  o.startMethod = oneOf("start-method", {"spawn", "fork", "forkserver"});
  o.role = nonEmpty("role");
  o.module = flag("module");
  o.noPython = flag("no-python");
  o.runPath = flag("run-path");
  o.logDir = get("log-dir").value;
  o.timeline = get("timeline").value;
  o.redirects = parse("redirects", [](auto& v) { return parseStreamSelection(v); });
  o.tee = parse("tee", [](auto& v) { return parseStreamSelection(v); });
  o.localRanksFilter = parse("local-ranks-filter", [](auto& v) { return parseRankList(v); });
  o.nodeRank = parse("node-rank", [&](auto& v) { return parseInt(v, 0, kMaxInt); });
  o.masterAddr = nonEmpty("master-addr");
  o.masterPort = parse("master-port", [](auto& v) { return parseInt(v, 0, 65535); });
  o.localAddr = get("local-addr").value;
  const double grace = parse("shutdown-timeout", [](auto& v) { return parseSeconds(v); });
  o.shutdownTimeout = std::chrono::milliseconds(static_cast<int64_t>(grace * 1000));
  o.stallWarning = parse("stall-warning", [](auto& v) {
    if (v == "auto") return -1.0;
    try {
      return parseSeconds(v);
    } catch (const BadValue&) {
      throw BadValue("expected auto, 0 (off) or a number of seconds (e.g. 30 or 0.5)");
    }
  });
  o.peerTimeout = parse("peer-timeout", [](auto& v) {
    double s = -1;
    try {
      s = parseSeconds(v);
    } catch (const BadValue&) {
    }
    if (s != 0 && !(s >= 0.1)) {
      throw BadValue("expected 0 (off) or a number of seconds >= 0.1 (e.g. 5 or 0.5)");
    }
    return s;
  });
  {
    const std::string r = oneOf("recovery", {"restart", "in-process", "auto"});
    o.recovery = r == "restart"      ? LaunchOptions::Recovery::Restart
                 : r == "in-process" ? LaunchOptions::Recovery::InProcess
                                     : LaunchOptions::Recovery::Auto;
  }
  {
    // replace | shrink | shrink:MIN_RANKS
    std::tie(o.recoveryPolicy, o.shrinkMinRanks) = parse("recovery-policy", [&](auto& v) {
      const std::string bad = "expected replace, shrink or shrink:MIN_RANKS (a whole number of "
                              "ranks >= 1 the job may shrink to)";
      if (v == "replace") return std::pair{LaunchOptions::RecoveryPolicy::Replace, 1};
      if (v == "shrink") return std::pair{LaunchOptions::RecoveryPolicy::Shrink, 0};  // below
      if (v.rfind("shrink:", 0) != 0) throw BadValue(bad);
      try {
        return std::pair{LaunchOptions::RecoveryPolicy::Shrink, parseInt(v.substr(7), 1, 1 << 20)};
      } catch (const BadValue&) {
        throw BadValue(bad);
      }
    });
  }
  o.spares = parse("spares", [](auto& v) {
    try {
      return parseInt(v, 0, 64);
    } catch (const BadValue&) {
      throw BadValue("expected a whole number of hot spares per node from 0 to 64");
    }
  });
  o.signalsToHandle = parse("signals-to-handle", [](auto& v) { return parseSignalList(v); });
  o.passLocalRank = flag("pass-local-rank");
  o.agentStore = !flag("no-agent-store");
  o.hosts = get("hosts").value;
  o.hostfile = get("hostfile").value;
  o.schedulerNodeRank = scheduler.nodeRank;

  if (o.module && o.noPython) {
    throw ConfigError("--no-python and -m/--module cannot be used together: a module needs "
                      "the Python interpreter");
  }
  if (o.standalone) {
    // torchrun --standalone: a single node, c10d on localhost, a random run id. ddprun binds
    // a free port instead of torchrun 1.13's fixed 29400.
    if ((o.minNodes != 1 || o.maxNodes != 1) && get("nnodes").given) {
      DDPRUN_LOG(WARN, "launcher") << "--standalone runs a single node: --nnodes="
                                   << get("nnodes").value << " is replaced by 1";
    }
    o.minNodes = o.maxNodes = 1;
    o.rdzvBackend = "c10d";
    o.rdzvEndpoint = "127.0.0.1:0";
    o.rdzvId = randomRunId();
  }
  // --recovery-policy=shrink: down to the job's minimum as --nnodes defines it, its lower bound
  // of nodes, each with at least one rank (in-process recovery runs on one node: 1 rank).
  if (o.shrinkMinRanks == 0) o.shrinkMinRanks = std::max(1, o.minNodes);
  if (o.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      o.recovery == LaunchOptions::Recovery::Restart) {
    DDPRUN_LOG(WARN, "launcher") << "--recovery-policy=" << get("recovery-policy").value
                                 << " has no effect with --recovery=restart: every worker's death "
                                 << "restarts the group";
  }
  return o;
}

// The command line's CLI11 parser. CLI11 checks each option it adds against every option added
// before it (CLI::App::add_option: a quadratic scan, and each option is constructed twice): with
// all ~40 flags, most under two names, parsing the bench's agent command line took 1.5 M of the
// 1.9 M user instructions of a ddprun that exits right after it (callgrind), 0.46 M now. A parse
// can only match an option whose name the command line spells, so only the flags some token of
// argv names are added (--name, --name=V, either spelling; the three with a short name whenever a
// -x token is there, for -m, -r3, -mt3); every flag for --help. Same matches, errors and values.
struct CliParser {
  CLI::App app{"ddprun [OPTIONS] PROGRAM [ARGS...]: start, supervise and restart distributed "
               "training workers on this node (a drop-in for torchrun)",
               "ddprun"};
  std::map<std::string, std::string> text;
  std::map<std::string, bool> isSet;
  std::map<std::string, CLI::Option*> option;  // the flags added (all, or the ones argv names)
  std::string configPath;
  std::vector<std::string> sshOptions, exports;

  // The options of kFlags and the others that argv's tokens name (all when `everyFlag`).
  CliParser(const std::vector<std::string>& argv, bool everyFlag) {
    std::set<std::string> named;  // long names as spelled in argv, without "--" and "=VALUE"
    bool shortToken = false;      // a -x token: -m, -r3, -mt3 (CLI11 splits combined ones)
    for (const auto& t : argv) {
      if (t.size() > 2 && t[0] == '-' && t[1] == '-') named.insert(t.substr(2, t.find('=') - 2));
      if (t.size() > 1 && t[0] == '-' && t[1] != '-') shortToken = true;
    }
    auto wanted = [&](std::initializer_list<std::string> longNames) {
      if (everyFlag) return true;
      for (const auto& n : longNames) {
        if (named.count(n)) return true;
      }
      return false;
    };
    app.footer(
        "Every flag is also spelled with underscores (--nproc_per_node), read from "
        "PET_<NAME> when absent (PET_NPROC_PER_NODE), and settable in --config FILE.json; "
        "precedence: command line, config, environment, default. See docs/launcher.md.");
    app.prefix_command();  // PROGRAM and everything after it belong to the workers
    app.set_version_flag("--version", versionText());
    for (const auto& f : kFlags) {
      if (!(*f.shortName && shortToken) && !wanted({f.name, underscored(f.name)})) continue;
      std::string names = std::string("--") + f.name;
      if (underscored(f.name) != f.name) names += ",--" + underscored(f.name);
      if (*f.shortName) names = std::string("-") + f.shortName + "," + names;
      std::string help = std::string(f.help) + (*f.defaultValue && !f.isSwitch
                                                    ? std::string(" [") + f.defaultValue + "]"
                                                    : std::string());
      option[f.name] =
          f.isSwitch ? app.add_flag(names, isSet[f.name], help)
                     : app.add_option(names, text[f.name], help)
                           ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
    if (wanted({"config"})) {
      app.add_option("--config", configPath,
                     "JSON file of flags ({\"nproc_per_node\": 4, ...}); the command line wins");
    }
    if (wanted({"ssh-option", "ssh_option"})) {
      app.add_option("--ssh-option,--ssh_option", sshOptions,
                     "with --hosts: an ssh option, passed as ssh -o OPT (repeatable)")
          ->allow_extra_args(false);
    }
    if (wanted({"export"})) {
      app.add_option("--export", exports,
                     "with --hosts: VAR or VAR=VALUE (or PREFIX*) for the remote agents, besides "
                     "NCCL_*, PYTHONPATH, OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, DDPRUN_* "
                     "(repeatable)")
          ->allow_extra_args(false);
    }
  }

  // Whether the command line gave flag `name` (false when argv never names it: not added).
  bool given(const char* name) const {
    auto it = option.find(name);
    return it != option.end() && it->second->count() > 0;
  }
};

}  // namespace

Environment currentEnvironment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* entry = *e;
    const char* eq = std::strchr(entry, '=');
    if (eq != nullptr) env.emplace(std::string(entry, eq), std::string(eq + 1));
  }
  return env;
}

ParseOutcome parseLaunchOptions(const std::vector<std::string>& argv, const Environment& env,
                                const SchedulerDefaults& scheduler) {
  CliParser cli(argv, false);
  CLI::App& app = cli.app;
  std::vector<std::string> args(argv.size() > 1 ? argv.begin() + 1 : argv.end(), argv.end());
  std::reverse(args.begin(), args.end());  // CLI11 consumes a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    return ParseOutcome{.message = CliParser(argv, true).app.help()};
  } catch (const CLI::CallForVersion&) {
    return ParseOutcome{.message = versionText() + "\n"};
  } catch (const CLI::ParseError& e) {
    throw ConfigError(std::string(e.what()) + " (see ddprun --help)");
  }

  const std::string& configPath = cli.configPath;
  ConfigFile config;
  if (!configPath.empty()) config = readConfig(configPath);

  // Each flag from its first source: command line, --config, PET_*, the scheduler, default.
  auto gather = [&](const SchedulerDefaults& sched) {
    std::map<std::string, Raw> raw;
    for (const auto& f : kFlags) {
      Raw r;
      if (cli.given(f.name)) {
        r.value = f.isSwitch ? (cli.isSet[f.name] ? "1" : "0") : cli.text[f.name];
        r.given = true;
      } else if (auto it = config.flags.find(f.name); it != config.flags.end()) {
        r = Raw{it->second, "--config " + configPath, true};
      } else if (auto e = env.find(envName(f)); e != env.end()) {
        r = Raw{e->second, envName(f), true};
      } else if (auto s = sched.flags.find(f.name); s != sched.flags.end()) {
        r = Raw{s->second, sched.source};
      } else {
        r.value = f.defaultValue;
      }
      raw[f.name] = r;
    }
    return raw;
  };
  // --standalone and --hosts lay the job out themselves: a scheduler's layout does not apply.
  std::map<std::string, Raw> raw = gather({});
  auto on = [](const Raw& r) {
    try {
      return r.given && parseBool(r.value);
    } catch (const BadValue&) {
      return false;  // convert() reports it
    }
  };
  const bool ownLayout = raw["hosts"].given || raw["hostfile"].given || on(raw["standalone"]);
  const SchedulerDefaults& sched = ownLayout ? SchedulerDefaults{} : scheduler;
  if (!ownLayout && !scheduler.source.empty()) raw = gather(scheduler);
  LaunchOptions options = convert(raw, sched);
  options.sshOptions = std::move(cli.sshOptions);
  options.exports = std::move(cli.exports);

  // PROGRAM [ARGS...]: what CLI11 left over, in order. A leading "-x" is a flag we lack.
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    throw ConfigError("unknown flag " + rest.front() + " (see ddprun --help)");
  }
  if (rest.empty() && config.program) {
    rest.push_back(*config.program);
    rest.insert(rest.end(), config.args.begin(), config.args.end());
  }
  if (rest.empty()) {
    throw ConfigError("missing PROGRAM: usage: ddprun [OPTIONS] PROGRAM [ARGS...] (see ddprun "
                      "--help)");
  }
  options.program = rest.front();
  options.programArgs.assign(rest.begin() + 1, rest.end());
  ParseOutcome out{.options = std::move(options)};
  for (const auto& f : kFlags) {
    const Raw& r = raw[f.name];
    if (r.given) out.given.emplace_back(f.name, r.value);
    if (!r.given && sched.flags.count(f.name)) out.fromScheduler.push_back(f.name);
  }
  return out;
}

}  // namespace ddprun::launcher
