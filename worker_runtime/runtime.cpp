#include "worker_runtime/runtime.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "base/errors.h"
#include "rendezvous/grow_record.h"
#include "rendezvous/memory_store.h"
#include "base/progress_file.h"
#include "base/log.h"
#include "base/resolve.h"
#include "base/timeline.h"
#include "rendezvous/clock_offset.h"
#include "rendezvous/auth.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/spare_fork.h"
#include "rendezvous/superseded_store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"
#include "worker_runtime/elastic/peer_watch.h"
#include "worker_runtime/gloo_communicator.h"
#include "worker_runtime/hierarchical_communicator.h"
#include "worker_runtime/malloc_tuning.h"
#include "worker_runtime/nccl_communicator.h"
#include "worker_runtime/progress.h"
#include "worker_runtime/runtime_internal.h"
#include "worker_runtime/shm/shm_communicator.h"
#include "worker_runtime/shm/transport.h"
#include "worker_runtime/spare/spare_template.h"
#include "worker_runtime/thread_pools.h"
#include "worker_runtime/tcp_mesh.h"
#include "worker_runtime/traced_communicator.h"

namespace ddprun::runtime {

using detail::connectAgentStore;
using detail::makeCommunicator;
using detail::timeoutFrom;

namespace {

using rendezvous::StoreDialect;
using rendezvous::TcpStore;
using rendezvous::TcpStoreOptions;

// The environment variable `name`, a number of seconds in (0, maxSeconds]: `fallback` when unset
// or empty, a ConfigError naming the variable and the value otherwise.
Millis secondsFromEnv(const InitOptions& o, const char* name, Millis fallback, double maxSeconds) {
  const auto v = o.env(name);
  if (!v || v->empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  const double s = std::strtod(v->c_str(), &end);
  if (errno != 0 || *end != '\0' || !(s > 0) || s > maxSeconds) {
    throw ConfigError(std::string(name) + "='" + *v +
                      "' is not valid: expected a number of seconds > 0 (default " +
                      std::to_string(fallback.count() / 1000) + ")");
  }
  return Millis(static_cast<int64_t>(s * 1000));
}

}  // namespace

namespace detail {

Millis timeoutFrom(const InitOptions& o) {
  if (o.timeout) return *o.timeout;
  return secondsFromEnv(o, "DDPRUN_TIMEOUT", kDefaultCollectiveTimeout, 7 * 24 * 3600.0);
}

// DDPRUN_RECOVERY_TIMEOUT (Runtime::recoveryTimeout).
Millis recoveryTimeoutFrom(const InitOptions& o) {
  return secondsFromEnv(o, "DDPRUN_RECOVERY_TIMEOUT", Millis(60'000), 24 * 3600.0);
}

}  // namespace detail

namespace {

// DDPRUN_TRANSPORT (shm/transport.h), auto when unset.
shm::Transport transportFrom(const InitOptions& o) {
  const auto v = o.env("DDPRUN_TRANSPORT");
  return v && !v->empty() ? shm::parseTransport(*v, "DDPRUN_TRANSPORT") : shm::Transport::Auto;
}

Backend backendFrom(const InitOptions& o) {
  if (o.backend) return *o.backend;
  const auto v = o.env("DDPRUN_BACKEND");
  return v && !v->empty() ? parseBackend(*v, "DDPRUN_BACKEND") : Backend::Auto;
}

bool isLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

std::string unbracket(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// Where rank 0 hosts the job's store (--no-agent-store): MASTER_ADDR itself, not every
// interface, when it is an IP address or a name of this host's loopback; a name that resolves
// elsewhere may be reached through any interface, so then all of them (as torch's TCPStore).
std::string storeBindAddress(const std::string& masterAddr) {
  const std::string host = unbracket(masterAddr);
  in6_addr probe{};
  if (::inet_pton(AF_INET, host.c_str(), &probe) == 1 || ::inet_pton(AF_INET6, host.c_str(), &probe) == 1) {
    return host;
  }
  try {
    const std::string first = resolveTcp(host).front().ip();
    if (isLoopback(first)) return first;
  } catch (const NetworkError&) {
    // Does not resolve here: every interface, and the clients' connect names the problem.
  }
  return "0.0.0.0";
}

// `token`: for rank 0's store (--no-agent-store) when the job has one; the agent's store is
// never authenticated (PyTorch's clients could not).
std::shared_ptr<rendezvous::Store> connect(const WorkerEnv& env, Millis timeout,
                                           StoreDialect dialect,
                                           std::optional<std::string> token = std::nullopt) {
  return std::make_shared<TcpStore>(TcpStoreOptions{.host = unbracket(env.masterAddr),
                                                    .port = env.masterPort,
                                                    .timeout = timeout,
                                                    .dialect = dialect,
                                                    .authToken = std::move(token),
                                                    .tokenFromEnvironment = false});
}

// The job's token, when DDPRUN_STORE_TOKEN_FILE names one (ddprun sets it from --rdzv-conf
// token_file): it authenticates rank 0's store and the allreduce mesh. A file that cannot be
// used (loose mode, too short) throws ConfigError naming it.
std::optional<std::string> jobToken(const InitOptions& o) {
  const auto f = o.env("DDPRUN_STORE_TOKEN_FILE");
  if (!f || f->empty()) return std::nullopt;
  return rendezvous::auth::readTokenFile(*f);
}

}  // namespace

namespace detail {

// The agent's store is a ddprun-store under ddprun and a torch TCPStore under torchrun.
// DDPRUN_STORE_DIALECT says which; unset, we probe: ddprun first (its handshake tells), then the
// torch 1.13 framing, then the newer one.
std::shared_ptr<rendezvous::Store> connectAgentStore(const WorkerEnv& env, Millis timeout,
                                                     const EnvLookup& lookup) {
  const auto v = lookup("DDPRUN_STORE_DIALECT");
  if (v && !v->empty()) {
    if (*v == "ddprun") return connect(env, timeout, StoreDialect::Ddprun);
    if (*v == "legacy") return connect(env, timeout, StoreDialect::Legacy);
    if (*v == "current") return connect(env, timeout, StoreDialect::Current);
    throw ConfigError("DDPRUN_STORE_DIALECT='" + *v +
                      "' is not valid: expected ddprun, legacy (torch < 2.2) or current");
  }
  try {
    return connect(env, timeout, StoreDialect::Ddprun);
  } catch (const AuthError&) {
    throw;
  } catch (const StoreError& e) {
    DDPRUN_LOG(DEBUG, "runtime") << "agent store is not a ddprun-store (" << e.what() << ")";
  } catch (const NetworkError& e) {
    if (std::string(e.what()).find("handshake") == std::string::npos) throw;
    DDPRUN_LOG(DEBUG, "runtime") << "agent store is not a ddprun-store (" << e.what() << ")";
  }
  try {
    auto s = connect(env, timeout, StoreDialect::Legacy);
    static_cast<TcpStore&>(*s).ping();
    DDPRUN_LOG(DEBUG, "runtime") << "agent store speaks the torch 1.13 TCPStore protocol";
    return s;
  } catch (const ddprun::Error& e) {
    DDPRUN_LOG(DEBUG, "runtime") << "agent store: legacy framing failed (" << e.what() << ")";
  }
  return connect(env, timeout, StoreDialect::Current);
}

// Whether the launcher may keep this process alive after a peer's death (Runtime::inProcessRecovery,
// before the store is connected): DDPRUN_RECOVERY=in-process|auto, the agent's store (on several
// nodes node rank 0's agent's, which every node's workers use), more than one rank.
bool inProcessRecoveryWanted(const WorkerEnv& env, const InitOptions& options) {
  const auto mode = options.env("DDPRUN_RECOVERY");
  if (!mode || (*mode != "in-process" && *mode != "auto")) return false;
  return env.useAgentStore && env.worldSize > 1;
}

}  // namespace detail

namespace {

// The GPUs this process may give NCCL: 0 when built without it. Asked once per process: the
// first ask is the CUDA runtime's driver probe, which in a spare forked from the spare template
// took 11-18 ms (about 255 page faults of memory the template shares) here, inside the
// communicator set-up of a grow back that every survivor waits for. A spare asks before it says
// ready (becomeRank), off that path; a rank's later generations reuse the answer. Never asked in
// a process that forks a spare afterwards (the spare template, a rank before it forks the
// template): CUDA does not survive a fork, and this reaches no further than the driver's probe.
int usableGpus() {
  static const int gpus = [] {
    if (!ncclBuilt()) return 0;
    const int visible = visibleGpuCount();
    return visible > 0 ? std::min<int>(visible, torch::cuda::device_count()) : 0;
  }();
  return gpus;
}

}  // namespace

namespace detail {

// The communicator of `generation` over `store` (the attempt's store; generation g > 0: its keys
// under gen/<g>/, recovery_keys.h), as the environment and options choose it (runtime.h).
// Records in `env` what it learns of the placement (WorkerEnv::onOneHost).
std::shared_ptr<Communicator> makeCommunicator(WorkerEnv& env,
                                               std::shared_ptr<rendezvous::Store> attemptStore,
                                               const InitOptions& options, int generation) {
  const Millis timeout = timeoutFrom(options);
  const Backend requested = backendFrom(options);
  const std::optional<std::string> token = jobToken(options);
  // A proof made in one generation is worthless in another, as across attempts.
  const std::string secretScope =
      generation == 0 ? env.runId : env.runId + "/gen" + std::to_string(generation);
  // Generation g > 0: its set-up gives up when generation g+1 is published (a peer of g died
  // before it joined; superseded_store.h), instead of waiting the collective timeout, and each
  // of its waits after DDPRUN_RECOVERY_TIMEOUT at most (a peer alive but not joining).
  std::shared_ptr<rendezvous::Store> store =
      generation == 0 ? attemptStore
                      : std::make_shared<rendezvous::SupersededStore>(
                            std::make_shared<rendezvous::PrefixStore>(
                                rendezvous::recovery::generationScope(generation), attemptStore),
                            attemptStore, generation, recoveryTimeoutFrom(options));
  // And its peers' connections (Gloo's pairs, the TCP mesh) within the same bound: a peer that
  // died after publishing its addresses is not waited for the whole collective timeout.
  const Millis setupTimeout = generation == 0 ? Millis(0) : recoveryTimeoutFrom(options);
  const int gpus = usableGpus();
  const BackendChoice choice = chooseBackend(requested, ncclBuilt(), gpus);
  if (env.rank == 0 && generation == 0) {
    DDPRUN_LOG(INFO, "runtime") << "backend " << toString(choice.backend) << " (" << choice.reason
                                << "), world size " << env.worldSize;
  }
  std::shared_ptr<Communicator> comm;
  if (choice.backend == Backend::Nccl) {
    // Under in-process recovery NCCL learns of a local peer's death from the peer watch
    // (elastic/peer_watch.h) instead of waiting out the collective timeout.
    std::function<std::string()> peerLost;
    if (inProcessRecoveryWanted(env, options)) {
      peerLost = [watch = elastic::PeerWatch::exchange(*store, env.rank, env.worldSize, timeout)] {
        return watch.lost();
      };
    }
    comm = makeNcclCommunicator(store, {.rank = env.rank,
                                        .size = env.worldSize,
                                        .device = env.localRank % gpus,
                                        .timeout = timeout,
                                        .peerLost = std::move(peerLost)});
  } else if (const shm::TransportChoice t =
                 env.ranksOffNode
                     ? shm::TransportChoice{shm::Transport::Tcp,
                                            "a lost node's rank runs on another node's spare: "
                                            "the flat mesh, whatever the placement"}
                     : shm::chooseTransport(
                 transportFrom(options), env.worldSize, env.localWorldSize, env.groupWorldSize,
                 [&] {
                   return shm::nodesOnOneHostOnce(*store, *attemptStore,
                                                  {.rank = env.rank,
                                                   .size = env.worldSize,
                                                   .node = env.groupRank,
                                                   .localRank = env.localRank,
                                                   .localSize = env.localWorldSize},
                                                  generation > 0, env.onOneHost);
                 });
             t.transport == shm::Transport::Shm) {
    if (env.rank == 0 && generation == 0) DDPRUN_LOG(INFO, "runtime") << "transport shm (" << t.reason << ")";
    const auto prefix = options.env("DDPRUN_SHM_PREFIX");  // tests look for leftovers with it
    const std::string shmPrefix = prefix && !prefix->empty() ? *prefix : std::string("ddprun");
    if (t.acrossNodes) {
      comm = makeHierarchicalCommunicator(
          store, {.rank = env.rank,
                  .size = env.worldSize,
                  .node = env.groupRank,
                  .nodes = env.groupWorldSize,
                  .localRank = env.localRank,
                  .localSize = env.localWorldSize,
                  .timeout = timeout,
                  .setupTimeout = setupTimeout,
                  .hostname = isLoopback(env.masterAddr) ? "127.0.0.1" : "",
                  .meshSecret = token ? meshSecret(*token, secretScope, env.restartCount)
                                      : std::string(),
                  .shmPrefix = shmPrefix});
    } else {
      // Under in-process recovery the survivors' lent buffers (DDP's buckets) are carried into
      // the next generation's communicator instead of mapped anew (shm/lent_carry.h).
      const bool carry = inProcessRecoveryWanted(env, options);
      if (carry && !env.lentCarry) env.lentCarry = std::make_shared<shm::LentCarry>();
      comm = shm::makeShmCommunicator(store, {.rank = env.rank,
                                              .size = env.worldSize,
                                              .timeout = timeout,
                                              .namePrefix = shmPrefix,
                                              .lentCarry = carry ? env.lentCarry : nullptr,
                                              .reuseLent = carry && generation > 0});
    }
  } else {
    if (env.rank == 0 && (generation == 0 || env.ranksOffNode) && env.worldSize > 1) {
      DDPRUN_LOG(INFO, "runtime") << "transport tcp (" << t.reason << ")";
    }
    comm = makeGlooCommunicator(store, {.rank = env.rank,
                                        .size = env.worldSize,
                                        .timeout = timeout,
                                        .setupTimeout = setupTimeout,
                                        .hostname = isLoopback(env.masterAddr) ? "127.0.0.1" : "",
                                        .meshSecret = token ? meshSecret(*token, secretScope,
                                                                         env.restartCount)
                                                            : std::string()});
  }
  return comm;
}

// A grow record (rendezvous/grow_record.h) applied to a rank of generation g-1 (`env`): its rank in
// generation g and g's world size. A record that cannot be read, or that does not follow g-1,
// is a BackendError naming it: the elastic run then fails as after any bad recovery. Returns the
// record's cause.
std::string applyGrow(WorkerEnv& env, const std::string& text, int g) {
  std::string why;
  const auto grow = rendezvous::recovery::parseGrowRecord(text, why);
  if (!grow || grow->generation != g || grow->worldSize != env.worldSize + 1) {
    throw BackendError("in-process recovery: the launcher's grow record of generation " +
                       std::to_string(g) + " is not valid (" +
                       (grow ? "world_size=" + std::to_string(grow->worldSize) + " after " +
                                   std::to_string(env.worldSize) + " rank(s)"
                             : why) +
                       "): '" + text.substr(0, 120) + "'");
  }
  const int offset = env.rank - env.localRank;  // one node: 0
  env.rank = rendezvous::recovery::growRank(env.rank, grow->added);
  env.localRank = env.rank - offset;
  env.worldSize = grow->worldSize;
  env.localWorldSize = grow->worldSize;  // in-process recovery runs on one node
  log::setIdentity("rank " + std::to_string(env.rank));
  return grow->cause;
}

}  // namespace detail

namespace {

// The program's warm-up of a hot spare (InitOptions::spareWarmup has the contract), on a
// communicator of this process alone (shared memory, one rank, an in-process store: whatever the
// job's transport, this runs DDP's code without a peer). Progress is held (ProgressHold): the
// spare has no record of its own yet. Never throws: a failed warm-up costs only the time it saves
// (false).
bool warmUpSpare(const std::string& self, const InitOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  try {
    progress::ProgressHold hold;
    auto store = std::make_shared<rendezvous::MemoryStore>(Millis(10'000));
    const auto prefix = options.env("DDPRUN_SHM_PREFIX");
    std::shared_ptr<Communicator> comm = shm::makeShmCommunicator(
        store, {.rank = 0,
                .size = 1,
                .timeout = Millis(10'000),
                .namePrefix = prefix && !prefix->empty() ? *prefix : std::string("ddprun")});
    options.spareWarmup(comm);
  } catch (const std::exception& e) {
    DDPRUN_LOG(WARN, "runtime") << self << ": the program's warm-up failed (ignored; the spare "
                                << "waits cold): " << e.what();
    return false;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  DDPRUN_LOG(INFO, "runtime") << self << " warmed up in " << static_cast<int64_t>(ms)
                              << " ms (the program's spare warm-up)";
  return true;
}

// A hot spare (ddprun --spares, DDPRUN_SPARE=<id>; docs/recovery.md#hot-spares): the program
// has loaded LibTorch and its data; this says so in the store and WAITs for the agent's
// assignment (in rounds of kSpareWaitRound: no busy loop, and a store that went away ends the
// wait with its error). Then the process takes the rank: its environment gets the rank's
// variables (for the program's own getenv too), and the returned lookup gives them to init().
// What becomeRank() gives init(): the rank's environment, and the connection the spare waited
// on, which the runtime's watch of the next generation takes over (Runtime::setWatchConnection).
struct TakenRank {
  EnvLookup env;
  std::shared_ptr<rendezvous::Store> connection;
};

TakenRank becomeRank(const std::string& spareText, const InitOptions& options, bool warmUp) {
  namespace keys = rendezvous::recovery;
  constexpr Millis kSpareWaitRound{60'000};
  char* end = nullptr;
  const long id = std::strtol(spareText.c_str(), &end, 10);
  if (*end != '\0' || id < 0 || id > (1 << 24)) {
    throw ConfigError("DDPRUN_SPARE='" + spareText + "' is not valid: expected a spare's number "
                      ">= 0 (ddprun --spares sets it)");
  }
  const std::string self = "spare " + std::to_string(id) + " (pid " + std::to_string(::getpid()) + ")";
  log::setIdentity("spare " + std::to_string(id));
  // The job's place without a rank: rank 0's stands in to read where the store is.
  const EnvLookup& base = options.env;
  const WorkerEnv env = readWorkerEnv([&](const std::string& name) -> std::optional<std::string> {
    if (name == "RANK" || name == "LOCAL_RANK") return std::string("0");
    return base(name);
  });
  if (!env.useAgentStore) {
    throw ConfigError("DDPRUN_SPARE=" + spareText + " but TORCHELASTIC_USE_AGENT_STORE is not "
                      "True: a spare waits in the agent's store (ddprun --spares)");
  }
  const auto start = std::chrono::steady_clock::now();
  auto connection = connectAgentStore(env, timeoutFrom(options), base);
  rendezvous::PrefixStore store(keys::attemptPrefix(env.restartCount), connection);
  if (warmUp && options.spareWarmup) warmUpSpare(self, options);
  // What the rank's communicator set-up asks first, asked while the group does not wait for it.
  (void)usableGpus();
  store.set(keys::spareReadyKey(static_cast<int>(id)), std::to_string(::getpid()));
  DDPRUN_LOG(INFO, "runtime") << self << " ready: loaded, waiting for a rank";
  const std::string key = keys::spareAssignKey(static_cast<int>(id));
  for (;;) {
    try {
      store.wait({key}, kSpareWaitRound);
      break;
    } catch (const TimeoutError&) {
      // Still no death to stand in for: wait another round.
    }
  }
  const std::string text = store.get(key);
  const auto a = keys::parseSpareAssignment(text);
  if (!a || a->rank >= env.worldSize ||
      a->localRank >= (a->localWorldSize > 0 ? a->localWorldSize : env.localWorldSize)) {
    throw ConfigError(self + ": the launcher's assignment '" + text + "' is not valid");
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  DDPRUN_LOG(INFO, "runtime") << self << " takes rank " << a->rank << " (local rank "
                              << a->localRank << ") in generation " << a->generation
                              << " after waiting " << static_cast<int64_t>(waited * 1000) << " ms";
  std::map<std::string, std::string> vars = {
      {"RANK", std::to_string(a->rank)},
      {"LOCAL_RANK", std::to_string(a->localRank)},
      {"ROLE_RANK", std::to_string(a->rank)},
      {"DDPRUN_PROGRESS_SLOT", std::to_string(a->localRank)},
      {"DDPRUN_GENERATION", std::to_string(a->generation)}};
  // A lost node's rank on this node: its local rank is a slot after the node's own.
  if (a->localWorldSize > 0) vars["LOCAL_WORLD_SIZE"] = std::to_string(a->localWorldSize);
  for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  ::unsetenv("DDPRUN_SPARE");
  return {.env = [vars, base](const std::string& name) -> std::optional<std::string> {
            if (name == "DDPRUN_SPARE") return std::nullopt;
            if (auto it = vars.find(name); it != vars.end()) return it->second;
            return base(name);
          },
          .connection = std::move(connection)};
}

// A descriptor number ddprun passes in `name`; -1 when unset.
int descriptorVariable(const InitOptions& options, const char* name) {
  const auto fd = options.env(name);
  if (!fd || fd->empty()) return -1;
  char* end = nullptr;
  const long n = std::strtol(fd->c_str(), &end, 10);
  if (*end != '\0' || n < 0 || n > 65535) {
    throw ConfigError(std::string(name) + "='" + *fd + "' is not valid: expected a descriptor "
                      "number (ddprun sets it for the spare template)");
  }
  return static_cast<int>(n);
}

// DDPRUN_SPARE_TEMPLATE_AHEAD: "0" makes a template forked from a rank fork every spare on
// request (ServeOptions::forkAhead); unset or "1" keeps one forked ahead.
bool forkAhead(const InitOptions& options) {
  const auto v = options.env("DDPRUN_SPARE_TEMPLATE_AHEAD");
  if (!v || v->empty() || *v == "1") return true;
  if (*v == "0") return false;
  throw ConfigError("DDPRUN_SPARE_TEMPLATE_AHEAD='" + *v + "' is not valid: expected 0 (fork "
                    "each spare on request) or 1 (keep one forked ahead, the default)");
}

}  // namespace

std::unique_ptr<Runtime> init(InitOptions options) {
  // First, so that the spare template and every process forked from it inherit it: freed
  // memory is kept for the next step instead of being faulted in again (malloc_tuning.h).
  if (const MallocTuning tuning = decideMallocTuning(options.env, processEnv); !tuning.apply) {
    DDPRUN_LOG(DEBUG, "runtime") << "malloc's thresholds left as they are: " << tuning.why;
  } else if (!applyMallocTuning()) {
    DDPRUN_LOG(WARN, "runtime") << "the allocator refused malloc's thresholds (mallopt): freed "
                                << "memory may be given back to the kernel and faulted in again "
                                << "every step";
  }
  // The spare template (spare/spare_template.h) stays here; each spare it forks goes on as a spare.
  // It is a process ddprun exec'd for it, or a fork of local rank 0 made right here.
  int templateFd = descriptorVariable(options, rendezvous::spare_fork::kTemplateFdVariable);
  bool forkedFromRank = false;
  const bool ahead = forkAhead(options);  // read here: a bad value stops the rank, not its fork
  if (const int fd = descriptorVariable(options, rendezvous::spare_fork::kTemplateForkFdVariable);
      fd >= 0 && templateFd < 0) {
    const auto idle = options.env(rendezvous::spare_fork::kTemplateIdleVariable);
    if (forkTemplateFromRank(fd, idle && *idle == "1")) {
      templateFd = fd;
      forkedFromRank = true;
      // Its forks size their pools again from their own environment (thread_pools.h).
      oneThreadPerPool();
    }
  }
  TakenRank taken;  // a hot spare's, once it has taken a rank
  if (templateFd >= 0) {
    resolveThreadPoolControls();  // once here, not in each spare it forks
    // The template runs the program's warm-up once, before its first fork (spare/spare_template.h):
    // every spare it forks starts warm. Unless a death already waits for it: started under
    // SCHED_IDLE (DDPRUN_SPARE_TEMPLATE_IDLE=1, shrink without spares), it is out of it only
    // once the agent moved it for a grow back that waits (agent_spares.cpp); that replacement
    // should not wait for a warm-up too, so the spares it forks warm up themselves.
    const ForkedSpare forked = serveSpareForks(templateFd, [&] {
      if (!options.spareWarmup) return false;
      const std::string self = "spare template (pid " + std::to_string(::getpid()) + ")";
      const auto idle = options.env(rendezvous::spare_fork::kTemplateIdleVariable);
      if (idle && *idle == "1" && ::sched_getscheduler(0) != SCHED_IDLE) {
        DDPRUN_LOG(INFO, "runtime") << self << ": a grow back already waits for it (it was "
                                    << "moved out of SCHED_IDLE): no warm-up here, the spares "
                                    << "it forks run their own";
        return false;
      }
      return warmUpSpare(self, options);
    }, {.guardsAsSiblings = forkedFromRank, .forkAhead = ahead});
    // The template ran with one thread per pool (thread_pools.h); a rank's process would not.
    DDPRUN_LOG(INFO, "runtime") << "spare " << forked.id << " (pid " << ::getpid()
                                << "): thread pools as a process started with its environment: "
                                << matchThreadPools();
    taken = becomeRank(std::to_string(forked.id), options, /*warmUp=*/!forked.warm);
  } else if (const auto spare = options.env("DDPRUN_SPARE"); spare && !spare->empty()) {
    // A hot spare waits here, loaded, until the launcher gives it a rank.
    taken = becomeRank(*spare, options, /*warmUp=*/true);
  }
  if (taken.env) options.env = std::move(taken.env);
  // First: from here on ddprun can tell this process stopped from slow (--peer-timeout),
  // through the store connection, the communicator set-up and every step.
  startHeartbeat();
  WorkerEnv env = readWorkerEnv(options.env);
  log::setIdentity("rank " + std::to_string(env.rank));
  // Under `ddprun --timeline`: this rank's track (docs/timeline.md).
  if (const auto dir = options.env(ddprun::timeline::kTimelineDirEnv); dir && !dir->empty()) {
    ddprun::timeline::open(*dir, "rank " + std::to_string(env.rank),
                           "rank-" + std::to_string(env.rank));
  }
  const int64_t initStart = ddprun::timeline::nowUs();
  const Millis timeout = timeoutFrom(options);
  const std::optional<std::string> token = jobToken(options);
  std::shared_ptr<void> hosted;
  std::shared_ptr<rendezvous::Store> base;
  if (env.useAgentStore) {
    base = connectAgentStore(env, timeout, options.env);
  } else {
    if (env.rank == 0) {
      try {
        hosted = std::make_shared<rendezvous::ThreadedStoreServer>(
            rendezvous::StoreServerOptions{.host = storeBindAddress(env.masterAddr),
                                           .port = env.masterPort,
                                           .authToken = token});
      } catch (const NetworkError& e) {
        throw NetworkError(std::string(e.what()) +
                           " (rank 0 hosts the job's store at MASTER_PORT=" +
                           std::to_string(env.masterPort) + ": is that port in use?)");
      }
    }
    base = connect(env, timeout, StoreDialect::Ddprun, token);
  }
  auto store = std::make_shared<rendezvous::PrefixStore>(
      "/worker/attempt_" + std::to_string(env.restartCount), base);
  const int64_t storeConnected = ddprun::timeline::nowUs();
  const ddprun::timeline::FaultCount faultsSinceConnect;
  ddprun::timeline::span("store connect", "runtime", initStart, storeConnected - initStart,
                         ddprun::timeline::Args()
                             .add("master", env.masterAddr + ":" + std::to_string(env.masterPort))
                             .add("hosted_by_rank0", env.useAgentStore ? 0 : 1));
  // The job's store runs on node rank 0's machine, whose agent writes the trace: this rank's
  // clock offset to it puts its events on that machine's axis (docs/timeline.md).
  if (ddprun::timeline::enabled()) {
    if (auto* tcp = dynamic_cast<TcpStore*>(base.get());
        tcp && tcp->options().dialect == StoreDialect::Ddprun) {
      try {
        // On the timeline too: a replacement measures on the path the survivors wait on.
        ddprun::timeline::Scope measuring("clock offset", "runtime");
        if (const auto c = rendezvous::measureClockOffset(*tcp)) {
          ddprun::timeline::recordClockOffset(c->offsetUs, c->boundUs, c->rttUs, c->samples,
                                              tcp->address());
        }
      } catch (const std::exception& e) {
        DDPRUN_LOG(WARN, "runtime") << "timeline: no clock offset to " << tcp->address() << ": "
                                    << e.what();
      }
    }
  }

  // A replacement started by in-process recovery joins the generation that replaced the dead.
  int generation = 0;
  if (const auto g = options.env("DDPRUN_GENERATION"); g && !g->empty()) {
    char* end = nullptr;
    const long v = std::strtol(g->c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > (1 << 30)) {
      throw ConfigError("DDPRUN_GENERATION='" + *g + "' is not valid: expected a number >= 0 "
                        "(ddprun sets it for a replacement worker)");
    }
    generation = static_cast<int>(v);
  }
  // A replacement that joins a shrunk group (grow back): generation g's world size and this
  // rank's place come from the agent's record (WORLD_SIZE is the start's).
  if (generation > 0) {
    const std::string text = store->get(rendezvous::recovery::generationKey(generation));
    if (rendezvous::recovery::isGrowRecord(text)) {
      std::string why;
      const auto grow = rendezvous::recovery::parseGrowRecord(text, why);
      if (!grow || grow->generation != generation || grow->added != env.rank) {
        throw BackendError("in-process recovery: the launcher's grow record of generation " +
                           std::to_string(generation) + " is not valid for rank " +
                           std::to_string(env.rank) + (grow ? "" : " (" + why + ")") + ": '" +
                           text.substr(0, 120) + "'");
      }
      env.worldSize = grow->worldSize;
      env.localWorldSize = grow->worldSize;  // in-process recovery runs on one node
      env.localRank = env.rank;
    }
  }
  // A process joining generation g (a replacement, a spare): whether a record up to g moved a
  // lost node's rank off its node, as the survivors learnt it record by record (applyShrinks).
  for (int g = 1; g <= generation && !env.ranksOffNode; ++g) {
    const auto text = store->get(rendezvous::recovery::generationKey(g));
    const auto record = rendezvous::recovery::parseGenerationRecord(text);
    if (record && !record->moved.empty()) env.ranksOffNode = true;
  }
  std::shared_ptr<Communicator> comm;
  std::string superseded;
  try {
    comm = makeCommunicator(env, store, options, generation);
  } catch (const BackendError& e) {
    // A replacement's generation superseded before it joined (a survivor died while it
    // loaded): it is still in the group, so it joins the newest generation (below).
    if (generation == 0 || !store->check({rendezvous::recovery::generationKey(generation + 1)})) {
      throw;
    }
    superseded = e.what();
  }
  if (!comm) {
    auto rt = std::make_unique<Runtime>(std::move(env), std::move(store), nullptr,
                                        std::move(hosted), std::move(options), generation);
    rt->setWatchConnection(std::move(taken.connection));
    rt->joinNewestGeneration(superseded);
    return rt;
  }
  ddprun::timeline::span("communicator setup", "runtime", storeConnected,
                         ddprun::timeline::nowUs() - storeConnected,
                         faultsSinceConnect.addTo(ddprun::timeline::Args()
                                                      .add("backend", comm->backend())
                                                      .add("world_size", env.worldSize)));
  if (ddprun::timeline::enabled()) {
    const auto group = options.env("DDPRUN_TIMELINE_GROUP");
    comm = makeTracedCommunicator(
        std::move(comm),
        (group ? *group : std::string("attempt ") + std::to_string(env.restartCount)) +
            (generation > 0 ? " gen " + std::to_string(generation) : std::string()));
  }
  auto rt = std::make_unique<Runtime>(std::move(env), std::move(store), std::move(comm),
                                      std::move(hosted), std::move(options), generation);
  rt->setWatchConnection(std::move(taken.connection));
  return rt;
}

void exitProcess(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace ddprun::runtime
