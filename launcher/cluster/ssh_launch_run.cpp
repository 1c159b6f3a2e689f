// The running half of the ssh launch (ssh_launch.h): one SshSession per host on one
// io_context, records and lines from each, the launcher's signals relayed, the exit code.
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <climits>
#include <csignal>
#include <deque>
#include <random>

#include "base/errors.h"
#include "base/log.h"
#include "launcher/cluster/remote_protocol.h"
#include "launcher/cluster/ssh_launch.h"
#include "launcher/cluster/ssh_session.h"
#include "launcher/option_values.h"
#include "launcher/output.h"

namespace ddprun::launcher::cluster {

namespace asio = boost::asio;

namespace {

constexpr size_t kHeldLines = 20;  // ssh's stderr kept until the agent starts

std::string selfPath() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find ddprun's own path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

std::string currentDirectory() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string("/");
}

std::string randomRunId() {
  std::random_device rd;
  char out[24];
  std::snprintf(out, sizeof out, "ssh-%08x%08x", rd(), rd());
  return out;
}

std::string withPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

class Launch {
 public:
  Launch(const LaunchOptions& o, const std::vector<std::pair<std::string, std::string>>& given,
         const Environment& env)
      : options_(o), given_(given), signals_(io_), children_(io_, SIGCHLD), killTimer_(io_) {
    hosts_ = launchHosts(o);
    auto isGiven = [&](const char* name) {
      for (const auto& [n, v] : given_)
        if (n == name) return true;
      return false;
    };
    if (o.standalone)
      throw ConfigError("--standalone runs one node: it cannot be used with --hosts/--hostfile");
    if (isGiven("rdzv-backend") && o.rdzvBackend != "c10d")
      throw ConfigError("--rdzv-backend=" + o.rdzvBackend + ": an ssh launch uses c10d");
    if (isGiven("local-addr"))
      throw ConfigError("--local-addr names one node's address: with --hosts each host finds "
                        "its own (or use rdzv-conf)");
    if (isGiven("nnodes") && o.maxNodes < static_cast<int>(hosts_.size())) {
      throw ConfigError("--nnodes allows at most " + std::to_string(o.maxNodes) +
                        " nodes, but " + std::to_string(hosts_.size()) + " hosts are listed");
    }
    runId_ = isGiven("rdzv-id") ? o.rdzvId : randomRunId();
    ownStore_ = !isGiven("rdzv-endpoint");
    block_ = encodeEnvBlock(exportedEnvironment(env, o.exports));
    if (auto it = env.find("DDPRUN_SSH"); it != env.end()) sshCommand_ = splitWords(it->second);
    self_ = selfPath();
    dir_ = currentDirectory();
    fixedSize_ = o.minNodes == o.maxNodes || !isGiven("nnodes");
  }

  int run() {
    for (int sig : options_.signalsToHandle) signals_.add(sig);
    waitForSignal();
    waitForChildren();
    sessions_.resize(hosts_.size());
    if (ownStore_) {
      // The first host binds a free port; the others start once it has told us which.
      startSession(0, withPort(hostAddress(hosts_[0].host), 0));
    } else {
      for (size_t i = 0; i < hosts_.size(); ++i) startSession(i, options_.rdzvEndpoint);
    }
    io_.run();
    for (auto& s : sessions_)
      if (s.ssh) s.ssh->kill();
    return exitCode();
  }

 private:
  struct Session {
    std::unique_ptr<SshSession> ssh;
    bool started = false;  // the remote agent runs (its "started" record arrived)
    bool done = false;
    std::deque<std::string> held;  // stderr before it started: ssh's own messages
  };

  void startSession(size_t i, const std::string& endpoint) {
    const HostSlots& h = hosts_[i];
    std::optional<bool> isHost;
    if (ownStore_) isHost = i == 0;
    const auto agent = remoteAgentArgv(RemoteAgentInputs{
        .ddprunPath = self_, .given = given_, .host = &h, .nodeRank = static_cast<int>(i),
        .hostCount = static_cast<int>(hosts_.size()), .runId = runId_, .endpoint = endpoint,
        .isHost = isHost, .program = options_.program, .programArgs = options_.programArgs});
    auto argv = sshArgv(sshCommand_, options_.sshOptions, h.host, remoteCommandLine(dir_, agent));
    sessions_[i].ssh = std::make_unique<SshSession>(
        io_, std::move(argv),
        SshSession::Callbacks{
            .line = [this, i](const std::string& l, bool err) { onLine(i, l, err); },
            .ended = [this, i] { onEnded(i); }});
    sessions_[i].ssh->start();
    sessions_[i].ssh->send(block_);
    if (signal_) sessions_[i].ssh->send("signal " + std::to_string(signal_) + "\n");
    ++launched_;
  }

  void onLine(size_t i, const std::string& line, bool fromStderr) {
    Session& s = sessions_[i];
    if (fromStderr) {
      if (auto rec = parseRecord(line)) return onRecord(i, *rec);
      if (!s.started) {
        s.held.push_back(line);
        if (s.held.size() > kHeldLines) s.held.pop_front();
        return;
      }
    }
    // Worker lines come prefixed "[node N rank R]: "; anything else is the host's own.
    const bool worker = line.rfind("[node ", 0) == 0;
    writeFully(fromStderr ? STDERR_FILENO : STDOUT_FILENO,
               (worker ? line : "[" + hosts_[i].host + "]: " + line) + "\n");
  }

  void onRecord(size_t i, const Record& r) {
    Session& s = sessions_[i];
    switch (r.kind) {
      case Record::Kind::Started:
        s.started = true;
        for (const auto& l : s.held) writeFully(STDERR_FILENO, "[" + hosts_[i].host + "]: " + l + "\n");
        s.held.clear();
        break;
      case Record::Kind::Store:
        if (i != 0 || !ownStore_ || launched_ > 1 || failed_ || signal_) break;
        DDPRUN_LOG(INFO, "launcher") << "the rendezvous store runs on " << hosts_[0].host
                                     << " port " << r.port << "; starting the other "
                                     << hosts_.size() - 1 << " host(s)";
        for (size_t k = 1; k < hosts_.size(); ++k)
          startSession(k, withPort(hostAddress(hosts_[0].host), r.port));
        break;
      case Record::Kind::RootCause:
        if (!rootCause_) rootCause_ = std::make_pair(i, r);
        break;
    }
  }

  void onEnded(size_t i) {
    Session& s = sessions_[i];
    s.done = true;
    const int code = s.ssh->exitCode();
    if (!s.started && !signal_ && !failed_) {
      // Unreachable, refused, or the agent could not run: the job fails at once.
      std::string msg;
      for (const auto& l : s.held) msg += (msg.empty() ? "" : " ") + l;
      if (msg.empty()) msg = "ssh exited with " + std::to_string(code) + " and said nothing";
      writeFully(STDERR_FILENO, "ddprun: host " + hosts_[i].host + ": " +
                                    (code == 255 ? "cannot connect over ssh: "
                                                 : "the remote agent did not start (exit " +
                                                       std::to_string(code) + "): ") +
                                    msg + "\n");
      failed_ = true;
      failCode_ = 1;
      for (auto& other : sessions_)
        if (other.ssh) other.ssh->kill();  // the remote agents see EOF and stop
    } else if (code != 0 && !firstError_) {
      firstError_ = std::make_pair(i, code);
      if (fixedSize_ && !rootCause_ && !signal_ && !failed_) {
        // This job cannot go on without the host: stop the others.
        DDPRUN_LOG(ERROR, "launcher") << "host " << hosts_[i].host << " ended with exit code "
                                      << code << ": stopping the other hosts";
        relay(SIGTERM, false);
      }
    }
    bool all = true;
    for (const auto& x : sessions_) all = all && (!x.ssh || x.done);
    if (all) finish();
  }

  void finish() {
    boost::system::error_code ec;
    signals_.cancel(ec);
    children_.cancel(ec);
    killTimer_.cancel();
    io_.stop();
  }

  void waitForSignal() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      DDPRUN_LOG(WARN, "launcher") << "received " << signalName(sig)
                                   << (signal_ ? " again: the remote agents kill their workers now"
                                               : ": relaying it to every host");
      relay(sig, true);
      waitForSignal();
    });
  }

  // Sends "signal N" to every remote agent; without an answer within the grace, the ssh
  // clients are killed (their remote agents then see EOF).
  void relay(int sig, bool fromUser) {
    if (fromUser && !signal_) signal_ = sig;
    for (auto& s : sessions_)
      if (s.ssh && s.ssh->running()) s.ssh->send("signal " + std::to_string(sig) + "\n");
    killTimer_.expires_after(options_.shutdownTimeout + std::chrono::seconds(10));
    killTimer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      DDPRUN_LOG(WARN, "launcher") << "the remote agents did not stop in time: closing their "
                                      "ssh connections";
      for (auto& s : sessions_)
        if (s.ssh) s.ssh->kill();
    });
  }

  void waitForChildren() {
    children_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      for (auto& s : sessions_)
        if (s.ssh) s.ssh->reap();
      waitForChildren();
    });
  }

  int exitCode() const {
    if (failed_) return failCode_;
    if (signal_) return 128 + signal_;
    if (rootCause_) {
      const auto& [i, r] = *rootCause_;
      writeFully(STDERR_FILENO, "ddprun: the job failed on host " + hosts_[i].host + ": rank " +
                                    std::to_string(r.rank) + " (" + r.text +
                                    ") is the root cause -> ddprun exits with " +
                                    std::to_string(r.code) + "\n");
      return r.code;
    }
    if (firstError_) return firstError_->second;
    return 0;
  }

  const LaunchOptions& options_;
  const std::vector<std::pair<std::string, std::string>>& given_;
  asio::io_context io_{1};
  asio::signal_set signals_;
  asio::signal_set children_;
  asio::steady_timer killTimer_;
  std::vector<HostSlots> hosts_;
  std::vector<Session> sessions_;
  std::vector<std::string> sshCommand_;
  std::string runId_, block_, self_, dir_;
  bool ownStore_ = true;
  bool fixedSize_ = true;
  size_t launched_ = 0;
  int signal_ = 0;
  bool failed_ = false;
  int failCode_ = 1;
  std::optional<std::pair<size_t, Record>> rootCause_;
  std::optional<std::pair<size_t, int>> firstError_;
};

}  // namespace

int runSshLaunch(const LaunchOptions& options,
                 const std::vector<std::pair<std::string, std::string>>& given,
                 const Environment& env) {
  Launch launch(options, given, env);
  return launch.run();
}

}  // namespace ddprun::launcher::cluster
