#include "launcher/multinode_rendezvous.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstdlib>
#include <malloc.h>

#include "launcher/local_rendezvous.h"
#include "launcher/option_values.h"
#include "launcher/options.h"
#include "rendezvous/auth.h"
#include "rendezvous/etcd/etcd_backend.h"
#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/node_address.h"
#include "rendezvous/rendezvous_config.h"
#include "rendezvous/store_server.h"
#include "rendezvous/threaded_store_server.h"
#include "rendezvous/tcp_store.h"

namespace ddprun::launcher {

namespace asio = boost::asio;
namespace rdzv = ddprun::rendezvous;

namespace {
// main() gives the agent one malloc arena for all its threads (launcher/main.cpp: an arena per
// thread cost 4-5% of a small agent's CPU). The agent that hosts the rendezvous store undoes
// that for the threads it starts from here on, the store's first: each allocates from an arena
// of its own. Sharing one, the store's thread (at nice -10) waited on the arena's lock whenever
// a thread of normal priority had been preempted while holding it -- at 256 agents on two
// cores for seconds, with no heartbeat answered (docs/rendezvous.md, "The store's malloc
// arena"). glibc fixes the limit when a second thread first allocates, so this takes effect
// only while no thread but main() has allocated: the store's thread is the agent's first.
void allowOwnMallocArenas() { ::mallopt(M_ARENA_MAX, 64); }

constexpr rdzv::Millis kReadTimeout{60'000};      // torchrun's read_timeout
constexpr rdzv::Millis kStaticTimeout{900'000};   // torchrun's static rendezvous timeout
// How much less nice than the agent the hosted rendezvous store's thread asks to be where it
// may not run at real-time priority (ThreadedStoreServerOptions::realtime, asked first): with
// hundreds of runnable threads on the host (its workers, or 256 agents on one machine) a
// thread at the agent's niceness got ~1/N of a core and answered no heartbeat for 3 s
// (docs/rendezvous.md, "The store host's thread"). -10 weighs ~9x a default thread.
constexpr int kStorePriority = 10;

std::string nnodesText(const LaunchOptions& o) {
  return o.minNodes == o.maxNodes ? std::to_string(o.maxNodes)
                                  : std::to_string(o.minNodes) + ":" + std::to_string(o.maxNodes);
}

// --rdzv-backend=etcd-v3: the cluster's members, TLS, key prefix and lease.
std::shared_ptr<rdzv::RendezvousBackend> etcdBackend(const LaunchOptions& o,
                                                     const rdzv::RendezvousConf& conf) {
  namespace etcd = rdzv::etcd;
  if (o.rdzvEndpoint.empty()) {
    throw ConfigError("--rdzv-backend=etcd-v3 needs --rdzv-endpoint=HOST:PORT[,HOST:PORT...] "
                      "(every member of the etcd cluster)");
  }
  if (conf.heartbeatInterval || conf.missedHeartbeats) {
    throw ConfigError("--rdzv-conf heartbeat and missed_heartbeats do not apply to etcd-v3: a "
                      "node's liveness is its etcd lease (set lease_ttl)");
  }
  if (conf.isHost) {
    throw ConfigError("--rdzv-conf is_host does not apply to etcd-v3: the etcd cluster holds "
                      "the rendezvous, no agent hosts it");
  }
  etcd::EtcdBackendOptions e;
  for (const auto& ep : rdzv::parseEndpoints(o.rdzvEndpoint, etcd::kDefaultEtcdPort))
    e.client.endpoints.push_back({ep.host, ep.port});
  e.client.timeout = conf.readTimeout.value_or(kReadTimeout);
  if (conf.protocol.value_or("http") == "https") {
    e.client.tls = etcd::makeTlsContext(
        {conf.cacert.value_or(""), conf.cert.value_or(""), conf.key.value_or("")});
  } else if (conf.cacert || conf.cert || conf.key) {
    throw ConfigError("--rdzv-conf cacert, cert and key are for TLS: add protocol=https");
  }
  if (conf.keyPrefix) e.keyPrefix = *conf.keyPrefix;
  if (conf.leaseTtl) e.leaseTtl = *conf.leaseTtl;
  return std::make_shared<etcd::EtcdBackend>(std::move(e));
}
}  // namespace

namespace {
rdzv::RendezvousConf rdzvConf(const LaunchOptions& o) {
  std::string confText;
  for (const auto& [k, v] : o.rdzvConf) confText += (confText.empty() ? "" : ",") + k + "=" + v;
  return rdzv::parseRdzvConf(confText);
}
}  // namespace

rdzv::ServerLimits hostedStoreLimits(const LaunchOptions& o) {
  return rdzv::storeLimitsFrom(rdzvConf(o));
}

rdzv::DynamicRendezvousOptions multiNodeOptions(const LaunchOptions& o, bool& hostStore) {
  const rdzv::RendezvousConf conf = rdzvConf(o);

  if (o.rdzvBackend != "etcd-v3" && conf.hasEtcdKeys()) {
    throw ConfigError("--rdzv-conf key_prefix, lease_ttl, protocol, cacert, cert and key are "
                      "for --rdzv-backend=etcd-v3 (this job uses " + o.rdzvBackend + ")");
  }
  rdzv::DynamicRendezvousOptions r;
  r.runId = o.rdzvId;
  // A lost node's ranks are recovered in process by node rank 0's agent when its workers' store
  // (the agent store) holds the group's generations (docs/recovery.md#a-lost-node).
  r.limits = {.minNodes = o.minNodes, .maxNodes = o.maxNodes, .maxRestarts = o.maxRestarts,
              .keepRoundOnNodeLoss =
                  o.agentStore && o.recovery != LaunchOptions::Recovery::Restart};
  r.localAddr = o.localAddr;
  r.nproc = o.nprocPerNode;
  r.store.timeout = kReadTimeout;
  r.store.connectTimeout = kReadTimeout;
  if (o.rdzvBackend == "static") {
    if (o.minNodes != o.maxNodes) {
      throw ConfigError("--nnodes=" + nnodesText(o) +
                        ": the static backend needs a fixed number of nodes (--nnodes=N); use "
                        "--rdzv-backend=c10d for MIN:MAX");
    }
    if (o.nodeRank >= o.maxNodes) {
      throw ConfigError("--node-rank=" + std::to_string(o.nodeRank) + " is out of range for --nnodes=" +
                        nnodesText(o) + " (allowed: 0.." + std::to_string(o.maxNodes - 1) + ")");
    }
    if (o.masterPort == 0) {
      throw ConfigError("--master-port=0: the static backend needs the port node 0 listens on");
    }
    r.store.host = o.masterAddr;
    r.store.port = static_cast<uint16_t>(o.masterPort);
    r.fixedRank = o.nodeRank;
    r.heartbeat.interval = rdzv::Millis(0);  // static: fixed membership, no liveness
    r.joinTimeout = conf.staticTimeout.value_or(conf.joinTimeout.value_or(kStaticTimeout));
    hostStore = conf.isHost.value_or(o.nodeRank == 0);
  } else if (o.rdzvBackend == "etcd-v3") {
    r.backend = etcdBackend(o, conf);
    hostStore = false;
  } else {
    if (o.rdzvEndpoint.empty()) {
      throw ConfigError("--rdzv-backend=c10d with --nnodes=" + nnodesText(o) +
                        " needs --rdzv-endpoint=HOST[:PORT] (the store every node meets at)");
    }
    // Port 0: the store's host binds a free port (the others must learn it: an ssh launch
    // relays it); any other node needs the real port.
    const Endpoint given = parseEndpoint(o.rdzvEndpoint);
    const rdzv::Endpoint ep = given.port == 0 ? rdzv::Endpoint{.host = given.host, .port = 0}
                                              : rdzv::parseEndpoint(o.rdzvEndpoint);
    r.store.host = ep.host;
    r.store.port = ep.port;
    hostStore = conf.isHost.value_or(rdzv::endpointIsThisNode(ep.host, o.localAddr));
    if (ep.port == 0 && !hostStore) {
      throw ConfigError("--rdzv-endpoint=" + o.rdzvEndpoint + ": port 0 (a free port) only "
                        "works on the node that hosts the store; the others need its port");
    }
    // A scheduler's node rank (SLURM_NODEID) is kept when the round has room for it.
    if (o.schedulerNodeRank >= 0 && o.schedulerNodeRank < o.maxNodes)
      r.fixedRank = o.schedulerNodeRank;
  }
  // The store's token: --rdzv-conf token_file, else DDPRUN_STORE_TOKEN_FILE; read (and its mode
  // and length checked) now, so that a bad file is reported before anything starts.
  if (conf.tokenFile && o.rdzvBackend == "etcd-v3") {
    throw ConfigError("--rdzv-conf token_file is for the store of the c10d and static backends "
                      "(etcd-v3 secures its cluster with protocol=https, cacert, cert and key)");
  }
  if (conf.tokenFile) {
    r.store.authToken = rdzv::auth::readTokenFile(*conf.tokenFile);
  } else if (const char* f = std::getenv("DDPRUN_STORE_TOKEN_FILE"); f && *f &&
             o.rdzvBackend != "etcd-v3") {
    r.store.authToken = rdzv::auth::readTokenFile(f);
  }
  rdzv::applyRdzvConf(conf, r);
  if (o.rdzvBackend == "static") r.heartbeat.interval = rdzv::Millis(0);
  r.isHost = hostStore;
  // The round watcher WAITs on the agent's own connection (CANCEL_WAIT hands it back at every
  // call of the agent): one connection per agent fewer to open, accept and close -- at 256
  // agents starting at once, 256 fewer handshakes on node 0's store. Ignored on etcd-v3.
  r.watcherOnAgentConnection = true;
  return r;
}

MultiNodeRendezvous::MultiNodeRendezvous(asio::io_context& io, const LaunchOptions& o)
    : io_(io), agentStore_(o.agentStore), backend_(o.rdzvBackend) {
  bool host = false;
  options_ = multiNodeOptions(o, host);
  storeLimits_ = hostedStoreLimits(o);
  std::string endpoint =
      options_.backend ? options_.backend->describe()
                       : options_.store.host + ":" + std::to_string(options_.store.port);
  const std::optional<std::string>& token = options_.store.authToken;
  if (host) {
    try {
      // Its own thread: the agent's io_context stalls while the agent forks its workers'
      // guards (and takes the page faults after each fork), and every node's heartbeat must
      // be answered meanwhile; that thread asks for a higher CPU priority (kStorePriority).
      // And its own malloc arena (allowOwnMallocArenas): sharing the agent's one arena, it
      // waited on the arena's lock whenever a thread of normal priority was preempted holding it.
      allowOwnMallocArenas();
      rendezvousStore_ = std::make_unique<rdzv::ThreadedStoreServer>(
          rdzv::StoreServerOptions{.host = resolveAddress(options_.store.host),
                                   .port = options_.store.port,
                                   .authToken = token,
                                   .jobId = options_.runId,
                                   .limits = storeLimits_},
          rdzv::ThreadedStoreServerOptions{.raisePriority = kStorePriority, .realtime = true});
    } catch (const NetworkError& e) {
      // Never fall back to joining whatever listens there: it may be another job's store. The
      // one exception: a ddprun store that answers for this very job -- another agent of it on
      // this machine, started with the same arguments (torchrun's multi-agent setup).
      const std::string held = heldBy(e.what());
      if (!held.empty()) {
        throw NetworkError("cannot host the rendezvous store at " + endpoint + " (this node is " +
                           "the endpoint's host): " + e.what() + " -- " + held +
                           "; is another job using this port? pick another one");
      }
      host = false;
      options_.isHost = false;
      DDPRUN_LOG(INFO, "launcher") << "the rendezvous store at " << endpoint
                                   << " is already hosted by another agent of job '"
                                   << options_.runId << "' on this machine: joining it as a client";
    }
  }
  if (host && options_.store.port == 0) {
    options_.store.port = rendezvousStore_->port();
    endpoint = options_.store.host + ":" + std::to_string(options_.store.port);
  }
  if (host) {
    // The store is in this process: its silence is for the other agents to judge (their
    // heartbeats, by the keep-alive bound). This agent's own beats are late only when the
    // store's thread is, and declaring itself lost then would take the store host out of a
    // job that the others may still find alive (heartbeat.h, ownStoreBound).
    options_.heartbeat.ownStoreBound = options_.store.timeout;
    DDPRUN_LOG(INFO, "launcher") << "hosting the rendezvous store at " << endpoint
                                 << (token ? " (with authentication)" : "") << " on a thread "
                                 << (rendezvousStore_->realtime()
                                         ? std::string("of its own at real-time priority (SCHED_RR 1)")
                                     : rendezvousStore_->priorityRaised()
                                         ? "of its own at nice -" + std::to_string(kStorePriority) +
                                               " from the agent's (real-time priority not allowed: "
                                               "no CAP_SYS_NICE, nor RLIMIT_RTPRIO)"
                                         : std::string("of its own (its priority could not be "
                                                       "raised: no CAP_SYS_NICE, nor RLIMIT_NICE "
                                                       "or RLIMIT_RTPRIO for it)"));
  }
  describe_ = backend_ + " rendezvous '" + options_.runId + "' at " + endpoint +
              (host ? " (store hosted here)" : "");
  thread_ = std::thread([this] { threadMain(); });
}

MultiNodeRendezvous::~MultiNodeRendezvous() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (auto* p = live_.load()) p->interrupt();
  if (thread_.joinable()) thread_.join();
  protocol_.reset();
  workerStore_.reset();
  rendezvousStore_.reset();
}

void MultiNodeRendezvous::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void MultiNodeRendezvous::threadMain() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    job();
    lock.lock();
    busy_ = false;
  }
}

// The endpoint's port is taken: empty when a ddprun store answering for this job holds it
// (another agent of the job on this machine hosts it), else what holds it, for the error.
std::string MultiNodeRendezvous::heldBy(const std::string& bindError) const {
  if (options_.store.port == 0 || bindError.find("in use") == std::string::npos)
    return "the port could not be bound";
  try {
    rdzv::TcpStoreOptions probe = options_.store;
    probe.timeout = probe.connectTimeout = rdzv::Millis(5'000);
    probe.tokenFromEnvironment = false;
    rdzv::TcpStore store(probe);
    const auto info = store.serverInfo();
    if (info.job == options_.runId) return "";
    return info.job.empty() ? "a standalone ddprun-store holds it"
                            : "the ddprun store of job '" + info.job + "' holds it";
  } catch (const std::exception& e) {
    return std::string("something that is not this job's store holds it (") + e.what() + ")";
  }
}

// No split brain: the store this node hosts must be the one the endpoint reaches. When another
// node also believes it is the endpoint's host (a shared virtual address, localhost in a
// container) the endpoint leads to its store, not ours, and two jobs would form under one id.
void MultiNodeRendezvous::checkOwnStore() {
  rdzv::TcpStoreOptions probe = options_.store;
  probe.tokenFromEnvironment = false;
  rdzv::TcpStore store(probe);
  const auto info = store.serverInfo();
  if (info.instance != rendezvousStore_->instanceId()) {
    throw NetworkError("split brain: this node hosts the rendezvous store (instance " +
                       rendezvousStore_->instanceId() + ") but " + options_.store.host + ":" +
                       std::to_string(options_.store.port) + " reaches another store (instance " +
                       info.instance + (info.job.empty() ? "" : ", job '" + info.job + "'") +
                       "): another node also believes it hosts the endpoint; refusing to go on "
                       "(set --rdzv-conf is_host=false on every node but one)");
  }
}

rdzv::DynamicRendezvous& MultiNodeRendezvous::protocol() {
  if (!protocol_) {
    if (rendezvousStore_) checkOwnStore();
    protocol_ = std::make_unique<rdzv::DynamicRendezvous>(
        options_, [this](const rdzv::RoundEvent& e) { onEvent(e); });
    live_ = protocol_.get();
    if (leaving_) protocol_->interruptForLeave();  // a signal came while it was connecting
  }
  return *protocol_;
}

void MultiNodeRendezvous::setListener(Listener listener) { listener_ = std::move(listener); }

bool MultiNodeRendezvous::storeLost() const {
  auto* p = live_.load();  // set once, on the handler's thread; lives as long as this handler
  return p != nullptr && p->storeLost();
}

std::string MultiNodeRendezvous::summary(bool failed, int exitCode,
                                         const std::string& reason) const {
  return "job '" + options_.runId + "' " +
         (failed ? "FAILED (exit code " + std::to_string(exitCode) + ")" : std::string("finished")) +
         ": " + reason;
}

void MultiNodeRendezvous::onEvent(const rdzv::RoundEvent& e) {
  JobDecision d;
  d.reason = e.message;
  d.restartCount = e.restarts;
  switch (e.kind) {
    case rdzv::RoundEvent::Kind::Superseded:
      d.kind = JobDecision::Kind::NextRound;
      break;
    case rdzv::RoundEvent::Kind::JobFailed:
      d.kind = JobDecision::Kind::Failed;
      d.exitCode = e.exitCode;
      d.summary = summary(true, e.exitCode, e.message);
      break;
    case rdzv::RoundEvent::Kind::JobFinished:
      d.kind = JobDecision::Kind::Finished;
      d.summary = summary(false, 0, e.message);
      break;
    case rdzv::RoundEvent::Kind::StoreLost:
      d.kind = JobDecision::Kind::Failed;
      d.exitCode = 1;
      d.storeLost = true;
      break;
    case rdzv::RoundEvent::Kind::NodeLost:
      d.kind = JobDecision::Kind::NodeLost;
      d.lostNode = e.lostNodeRank;
      d.lostId = e.lostId;
      break;
  }
  asio::post(io_, [this, d] {
    if (listener_) listener_(d);
  });
}

void MultiNodeRendezvous::asyncNextRound(int localWorldSize, RoundHandler done) {
  DDPRUN_CHECK(localWorldSize == options_.nproc, "nproc changed from " << options_.nproc
                                                                      << " to " << localWorldSize);
  submit([this, done = std::move(done)] {
    std::exception_ptr error;
    RoundInfo info;
    try {
      const rdzv::RoundInfo r = protocol().nextRound();
      info = RoundInfo{.round = static_cast<uint64_t>(r.round),
                       .restartCount = r.restartCount,
                       .nodeRank = r.nodeRank,
                       .nodeCount = r.nodeCount,
                       .rankOffset = r.rankOffset,
                       .worldSize = r.worldSize,
                       .masterAddr = r.masterAddr,
                       .masterPort = r.masterPort,
                       .useAgentStore = agentStore_,
                       .runId = options_.runId};
      // The slot join's agents know only their own entry (asyncNodeWorkers reads the rest).
      for (const auto& n : r.nodes) info.nodeWorkers.push_back(n.nproc);
    } catch (const rdzv::JobEndedError& e) {
      const int code = e.failed() ? e.exitCode() : 0;
      error = std::make_exception_ptr(JobEnded(e.what(), code, summary(e.failed(), code, e.reason())));
    } catch (...) {
      error = std::current_exception();
    }
    asio::post(io_, [this, done, error, info] {
      std::exception_ptr err = error;
      if (!err) {
        try {
          hostWorkerStore(info);
        } catch (...) {
          err = std::current_exception();
        }
      }
      done(err, info);
    });
  });
}

void MultiNodeRendezvous::hostWorkerStore(const RoundInfo& info) {
  workerStore_.reset();
  const std::string base = describe_.substr(0, describe_.find(", node rank"));
  describe_ = base + ", node rank " + std::to_string(info.nodeRank) + " of " +
              std::to_string(info.nodeCount);
  if (!agentStore_ || info.nodeRank != 0) return;
  workerStore_ = std::make_unique<rdzv::StoreServer>(
      io_, rdzv::StoreServerOptions{.host = resolveAddress(info.masterAddr),
                                    .port = info.masterPort,
                                    .limits = storeLimits_});
}

void MultiNodeRendezvous::submitDecision(
    std::function<JobDecision(rdzv::DynamicRendezvous&)> decide, DecisionHandler done) {
  submit([this, decide = std::move(decide), done = std::move(done)] {
    std::exception_ptr error;
    JobDecision d;
    try {
      d = decide(protocol());
    } catch (...) {
      error = std::current_exception();
    }
    asio::post(io_, [done, error, d] { done(error, d); });
  });
}

JobDecision MultiNodeRendezvous::jobFailed() {
  auto& p = protocol();
  return JobDecision{.kind = JobDecision::Kind::Failed, .exitCode = p.jobExitCode(),
                     .reason = p.jobFailure(),
                     .summary = summary(true, p.jobExitCode(), p.jobFailure())};
}

JobDecision MultiNodeRendezvous::afterRecovery(rdzv::DynamicRendezvous::AfterRecovery outcome,
                                               const std::string& what) {
  switch (outcome) {
    case rdzv::DynamicRendezvous::AfterRecovery::Recover:
      return JobDecision{.kind = JobDecision::Kind::NextRound, .reason = what,
                         .restartCount = protocol().state().restarts, .recovered = true};
    case rdzv::DynamicRendezvous::AfterRecovery::Restart:
      return JobDecision{.kind = JobDecision::Kind::NextRound, .reason = what,
                         .restartCount = protocol().state().restarts};
    case rdzv::DynamicRendezvous::AfterRecovery::JobFailed:
      break;
  }
  return jobFailed();
}

void MultiNodeRendezvous::asyncReportFailure(int exitCode, const std::string& what,
                                             bool retryable, DecisionHandler done) {
  submitDecision(
      [this, exitCode, what, retryable](rdzv::DynamicRendezvous& p) {
        if (p.reportFailure(exitCode, what, retryable) ==
            rdzv::DynamicRendezvous::AfterFailure::Restart) {
          return JobDecision{.kind = JobDecision::Kind::NextRound, .reason = what,
                             .restartCount = p.state().restarts};
        }
        return jobFailed();
      },
      std::move(done));
}

void MultiNodeRendezvous::asyncReportFailedRecovery(int exitCode, const std::string& what,
                                                    DecisionHandler done) {
  (void)exitCode;  // the recovery's report named the exit; the job does not end here
  submitDecision(
      [this, what](rdzv::DynamicRendezvous& p) {
        if (p.reportFailedRecovery(what) == rdzv::DynamicRendezvous::AfterFailure::Restart) {
          return JobDecision{.kind = JobDecision::Kind::NextRound, .reason = what,
                             .restartCount = p.state().restarts};
        }
        return jobFailed();
      },
      std::move(done));
}

void MultiNodeRendezvous::asyncReportRecovery(int exitCode, const std::string& what,
                                              bool retryable, DecisionHandler done) {
  submitDecision(
      [this, exitCode, what, retryable](rdzv::DynamicRendezvous& p) {
        return afterRecovery(p.reportRecovery(exitCode, what, retryable), what);
      },
      std::move(done));
}

void MultiNodeRendezvous::asyncReportNodeLoss(const std::string& what, bool inProcess,
                                              DecisionHandler done) {
  submitDecision(
      [this, what, inProcess](rdzv::DynamicRendezvous& p) {
        return afterRecovery(p.reportNodeLoss(what, inProcess), what);
      },
      std::move(done));
}

void MultiNodeRendezvous::asyncFinish(DecisionHandler done) {
  submitDecision(
      [this](rdzv::DynamicRendezvous& p) {
        switch (p.finishRound()) {
          case rdzv::DynamicRendezvous::AfterSuccess::Finished:
            return JobDecision{.kind = JobDecision::Kind::Finished, .reason = p.state().reason,
                               .summary = summary(false, 0, p.state().reason)};
          case rdzv::DynamicRendezvous::AfterSuccess::Rejoin:
            return JobDecision{.kind = JobDecision::Kind::NextRound,
                               .reason = "the round ended before every node had finished",
                               .restartCount = p.state().restarts};
          case rdzv::DynamicRendezvous::AfterSuccess::JobFailed:
            break;
        }
        return jobFailed();
      },
      std::move(done));
}

void MultiNodeRendezvous::asyncLeave(const std::string& reason, DoneHandler done) {
  // A join or exit barrier may be waiting on the handler's thread (or about to): cut it short.
  // Only then: an interrupted protocol reconnects to leave, and when the store's host has
  // already gone (every node got the signal at once) that connect would hold this node for
  // connect_timeout.
  leaving_ = true;
  bool busy;
  {
    std::lock_guard<std::mutex> g(mu_);
    busy = busy_ || !jobs_.empty();
  }
  if (auto* p = live_.load(); p && busy) p->interruptForLeave();
  submit([this, reason, done = std::move(done)] {
    std::exception_ptr error;
    try {
      if (protocol_) protocol_->leave(reason);
    } catch (...) {
      error = std::current_exception();
    }
    asio::post(io_, [done, error] { done(error); });
  });
}

void MultiNodeRendezvous::asyncNodeWorkers(const RoundInfo& round,
                                           std::function<void(std::vector<int>)> done) {
  submit([this, round, done = std::move(done)] {
    std::vector<int> counts = round.nodeWorkers;
    try {
      auto& p = protocol();
      // roundMembers() answers for the protocol's newest round: only if that is still `round`.
      if (counts.empty() && p.state().round == static_cast<int64_t>(round.round)) {
        for (const auto& n : p.roundMembers()) counts.push_back(n.nproc);
      }
    } catch (const std::exception& e) {
      // Not when the read was cut short by this node declaring the store lost: that line said
      // why, and the read's own error (a closed connection) would mislead.
      if (!storeLost()) {
        DDPRUN_LOG(WARN, "launcher") << "each node's worker count in round " << round.round
                                     << " could not be read: " << e.what();
      }
      counts.clear();
    }
    if (static_cast<int>(counts.size()) != round.nodeCount) counts.clear();
    asio::post(io_, [counts, done] { done(counts); });
  });
}

void MultiNodeRendezvous::asyncShutdown(DoneHandler done) {
  submit([this, done = std::move(done)] {
    if (protocol_) protocol_->closeJob();
    asio::post(io_, [done] { done(nullptr); });
  });
}

std::string MultiNodeRendezvous::describe() const { return describe_; }

uint16_t MultiNodeRendezvous::hostedStorePort() const {
  return rendezvousStore_ ? options_.store.port : 0;
}

std::optional<rdzv::TcpStoreOptions> MultiNodeRendezvous::sharedStore(const RoundInfo& round) const {
  if (!options_.backend) return options_.store;  // its port is the real one also when the endpoint said 0
  // etcd-v3: the workers' store of the round, hosted by node rank 0's agent (hostWorkerStore);
  // with --no-agent-store it is rank 0's own and ends with it: nothing outlives the workers.
  if (!agentStore_ || round.masterPort == 0) return std::nullopt;
  std::string host = round.masterAddr;  // "[::1]" -> "::1"
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return rdzv::TcpStoreOptions{.host = host, .port = round.masterPort,
                               .dialect = rdzv::StoreDialect::Ddprun,
                               .tokenFromEnvironment = false};
}

}  // namespace ddprun::launcher
