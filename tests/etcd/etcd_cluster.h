#pragma once
// A real etcd cluster for a test: N members of Debian's etcd-server on free loopback ports,
// each with its own data directory in a temporary directory, started as child processes and
// stopped (by pid, SIGKILL) when the object goes. Nothing else on the machine is touched.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/node_address.h"

extern char** environ;

namespace etcdtest {

using namespace ddprun::rendezvous::etcd;
using ddprun::rendezvous::Millis;

inline const char* kEtcdBinary = ETCD_BINARY;

class EtcdCluster {
 public:
  // `extra`: flags for every member; `tls`: the members serve https (with `extra` naming
  // their certificates) and the test's clients use this context.
  // `parent`: where the members' data directories go (the bench uses a tmpfs, where etcd's
  // fsyncs cost nothing).
  explicit EtcdCluster(int members = 3, std::vector<std::string> extra = {},
                       std::shared_ptr<boost::asio::ssl::context> tls = nullptr,
                       const std::string& parent = "/tmp")
      : extra_(std::move(extra)), scheme_(tls ? "https" : "http"), tls_(std::move(tls)) {
    std::string tmpl = parent + "/ddprun-etcd-test-XXXXXX";
    if (!::mkdtemp(tmpl.data()))
      throw ddprun::Error("cannot make a directory in " + parent + " for etcd's data");
    dir_ = tmpl;
    // A free port picked here can be taken by another test before the member binds it (ctest
    // runs several at once): that member exits, and the cluster starts again on new ports.
    for (int attempt = 1;; ++attempt) {
      members_.clear();
      initial_.clear();
      for (int i = 0; i < members; ++i) {
        members_.push_back(
            {ddprun::rendezvous::pickFreePort(), ddprun::rendezvous::pickFreePort(), -1});
      }
      for (int i = 0; i < members; ++i) {
        initial_ += (i ? "," : "") + name(i) + "=http://127.0.0.1:" +
                    std::to_string(members_[i].peerPort);
      }
      for (int i = 0; i < members; ++i) start(i, "new");
      try {
        waitForLeader(Millis(30'000));
        return;
      } catch (const MemberExited&) {
        if (attempt == 3) throw;
        for (int i = 0; i < members; ++i) kill(i);
        for (int i = 0; i < members; ++i) std::filesystem::remove_all(dir_ + "/" + name(i));
      }
    }
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) kill(static_cast<int>(i));
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::vector<MemberAddress> endpoints() const {
    std::vector<MemberAddress> out;
    for (const auto& m : members_) out.push_back({"127.0.0.1", m.clientPort});
    return out;
  }
  EtcdClientOptions clientOptions(Millis timeout = Millis(10'000)) const {
    return {.endpoints = endpoints(), .tls = tls_, .timeout = timeout};
  }
  std::string dir() const { return dir_; }

  void kill(int i) {
    auto& m = members_[i];
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
  // Starts a killed member again on its data directory: it rejoins the cluster.
  void restart(int i) { start(i, "existing"); }

  // The index of the member that leads, or -1 (asked to each live member in turn).
  int leader(EtcdClientOptions opts) const {
    opts.timeout = Millis(2'000);
    EtcdClient c(opts);
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].pid <= 0) continue;
      try {
        if (c.status(i).isLeader()) return static_cast<int>(i);
      } catch (const ddprun::Error&) {
      }
    }
    return -1;
  }
  int leader() const { return leader(clientOptions()); }

  // CPU seconds (user + system) the live members have used so far.
  double cpuSeconds() const {
    double total = 0;
    const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
    for (const auto& m : members_) {
      if (m.pid <= 0) continue;
      std::ifstream in("/proc/" + std::to_string(m.pid) + "/stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::istringstream rest(stat.substr(stat.rfind(')') + 2));
      std::string field;
      for (int i = 3; i <= 13 && rest >> field; ++i) {
      }
      long utime = 0, stime = 0;
      rest >> utime >> stime;
      total += (utime + stime) / tick;
    }
    return total;
  }

  // A member that exited (it could not bind its ports, ...): what its log ends with.
  struct MemberExited : ddprun::Error {
    using ddprun::Error::Error;
  };

  // Throws MemberExited as soon as a member has exited, TimeoutError (with each member's log
  // tail) when no leader is known within `timeout`.
  void waitForLeader(Millis timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (leader() < 0) {
      for (size_t i = 0; i < members_.size(); ++i) {
        auto& m = members_[i];
        int status = 0;
        if (m.pid <= 0 || ::waitpid(m.pid, &status, WNOHANG) != m.pid) continue;
        m.pid = -1;
        throw MemberExited("etcd test member " + name(static_cast<int>(i)) + " exited (status " +
                           std::to_string(status) + "): " + logTail(static_cast<int>(i)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::string tails;
        for (size_t i = 0; i < members_.size(); ++i) {
          tails += "\n" + name(static_cast<int>(i)) + ": " + logTail(static_cast<int>(i));
        }
        throw ddprun::TimeoutError("etcd test cluster in " + dir_ + " elected no leader within " +
                                   std::to_string(timeout.count()) + " ms; the members' logs end:" +
                                   tails);
      }
      std::this_thread::sleep_for(Millis(50));
    }
  }

 private:
  struct Member {
    uint16_t clientPort, peerPort;
    pid_t pid;
  };
  static std::string name(int i) { return "m" + std::to_string(i); }

  // The last 600 bytes of member i's log.
  std::string logTail(int i) const {
    std::ifstream in(dir_ + "/" + name(i) + ".log");
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return log.size() > 600 ? log.substr(log.size() - 600) : log;
  }

  void start(int i, const std::string& state) {
    auto& m = members_[i];
    const std::string client = scheme_ + "://127.0.0.1:" + std::to_string(m.clientPort);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peerPort);
    std::vector<std::string> args = {kEtcdBinary, "--name", name(i), "--data-dir",
                                     dir_ + "/" + name(i), "--listen-client-urls", client,
                                     "--advertise-client-urls", client, "--listen-peer-urls",
                                     peer, "--initial-advertise-peer-urls", peer,
                                     "--initial-cluster", initial_, "--initial-cluster-state",
                                     state, "--initial-cluster-token", "ddprun-test"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = dir_ + "/" + name(i) + ".log";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw ddprun::Error(std::string("cannot start ") + kEtcdBinary);
    m.pid = pid;
  }

  std::vector<std::string> extra_;
  std::string scheme_;
  std::shared_ptr<boost::asio::ssl::context> tls_;
  std::string dir_;
  std::string initial_;
  std::vector<Member> members_;
};

}  // namespace etcdtest
