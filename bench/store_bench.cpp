// ddprun-bench store: ddprun-store against c10d::TCPStore (libtorch 1.13), same run, loopback.
//
// 1. Throughput and latency of SET, GET and ADD with 1, 4 and 32 client threads (one
//    connection each), both servers in this process on their own thread.
// 2. A K-client barrier (ADD, then WAIT for the "done" key the last arrival sets), K = 64,
//    1024, 8192, with the clients in child processes (re-executions of this binary), timed
//    from a common "go" until every client's WAIT has returned.
// Prints a table with the ratio ddprun/TCPStore and writes bench/results/store.csv.
#include <utility>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "bench/paths.h"
#include "bench/registry.h"
#include "rendezvous/store_server.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"

namespace {

using namespace ddprun::rendezvous;
using Clock = std::chrono::steady_clock;
constexpr auto kTimeout = std::chrono::milliseconds(120'000);

// The two clients behind one face, so every workload runs the same code for both.
struct Client {
  virtual ~Client() = default;
  virtual void set(const std::string& k, const std::string& v) = 0;
  virtual std::string get(const std::string& k) = 0;
  virtual int64_t add(const std::string& k, int64_t d) = 0;
  virtual void wait(const std::string& k) = 0;
};

struct DdprunClient : Client {
  explicit DdprunClient(uint16_t port)
      : s({.host = "127.0.0.1", .port = port, .timeout = kTimeout, .connectTimeout = kTimeout}) {}
  void set(const std::string& k, const std::string& v) override { s.set(k, v); }
  std::string get(const std::string& k) override { return s.get(k); }
  int64_t add(const std::string& k, int64_t d) override { return s.add(k, d); }
  void wait(const std::string& k) override { s.wait({k}); }
  TcpStore s;
};

struct TorchClient : Client {
  explicit TorchClient(uint16_t port) : s("127.0.0.1", options(port)) {}
  static c10d::TCPStoreOptions options(uint16_t port) {
    c10d::TCPStoreOptions o;
    o.port = port;
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = kTimeout;
    return o;
  }
  void set(const std::string& k, const std::string& v) override {
    s.set(k, std::vector<uint8_t>(v.begin(), v.end()));
  }
  std::string get(const std::string& k) override {
    auto v = s.get(k);
    return {v.begin(), v.end()};
  }
  int64_t add(const std::string& k, int64_t d) override { return s.add(k, d); }
  void wait(const std::string& k) override { s.wait({k}); }
  c10d::TCPStore s;
};

std::unique_ptr<Client> makeClient(const std::string& kind, uint16_t port) {
  if (kind == "ddprun") return std::make_unique<DdprunClient>(port);
  return std::make_unique<TorchClient>(port);
}

// A server of either kind on its own thread.
struct Server {
  explicit Server(const std::string& kind) {
    if (kind == "ddprun") {
      ddprun = std::make_unique<ThreadedStoreServer>(StoreServerOptions{.host = "127.0.0.1", .port = 0});
      port = ddprun->port();
    } else {
      c10d::TCPStoreOptions o;
      o.port = 0;
      o.isServer = true;
      o.waitWorkers = false;
      o.timeout = kTimeout;
      torch = std::make_unique<c10d::TCPStore>("127.0.0.1", o);
      port = torch->getPort();
    }
  }
  std::unique_ptr<ThreadedStoreServer> ddprun;
  std::unique_ptr<c10d::TCPStore> torch;
  uint16_t port = 0;
};

struct OpsResult {
  double opsPerSec = 0, p50us = 0, p99us = 0;
};

OpsResult runOps(const std::string& kind, const std::string& op, int clients, int opsPerClient) {
  Server server(kind);
  std::vector<std::unique_ptr<Client>> cs;
  for (int i = 0; i < clients; ++i) cs.push_back(makeClient(kind, server.port));
  // Keys exist before GET is measured; each client has its own key so no WAIT is involved.
  for (int i = 0; i < clients; ++i) cs[i]->set("key" + std::to_string(i), std::string(32, 'v'));
  std::vector<std::vector<float>> lat(clients);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      Client& c = *cs[i];
      const std::string key = "key" + std::to_string(i);
      const std::string value(32, 'v');
      lat[i].reserve(opsPerClient);
      ++ready;
      while (!go.load()) std::this_thread::yield();
      for (int n = 0; n < opsPerClient; ++n) {
        auto t0 = Clock::now();
        if (op == "set") c.set(key, value);
        else if (op == "get") c.get(key);
        else c.add("ctr" + std::to_string(i), 1);
        lat[i].push_back(std::chrono::duration<float, std::micro>(Clock::now() - t0).count());
      }
      // A SET has no reply: one round trip at the end makes sure the server handled them all.
      if (op == "set") c.get(key);
    });
  }
  while (ready.load() < clients) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<float> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  OpsResult r;
  r.opsPerSec = clients * static_cast<double>(opsPerClient) / secs;
  r.p50us = all[all.size() / 2];
  r.p99us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

// Child process: `clients` threads, each connects, reports, waits for go, then ADD + WAIT.
int barrierChild(const std::string& kind, uint16_t port, int clients, int total) {
  std::vector<std::unique_ptr<Client>> cs;
  try {
    for (int i = 0; i < clients; ++i) cs.push_back(makeClient(kind, port));
  } catch (const std::exception& e) {
    std::cout << "connect-failed " << cs.size() << std::endl;
    return 3;
  }
  // Threads are started before the go, so that only the barrier itself is timed.
  std::promise<void> goSignal;
  std::shared_future<void> go = goSignal.get_future().share();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      go.wait();
      try {
        if (cs[i]->add("arrived", 1) == total) cs[i]->set("done", "1");
        cs[i]->wait("done");
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  std::cout << "connected" << std::endl;
  char g;
  const bool gotGo = ::read(STDIN_FILENO, &g, 1) == 1;  // the parent's "go"
  goSignal.set_value();
  if (!gotGo) failures = clients;
  for (auto& t : threads) t.join();
  std::cout << (failures ? "failed" : "done") << std::endl;
  return failures ? 5 : 0;
}

struct BarrierResult {
  bool ok = false;
  double seconds = 0;
  std::string note;
};

BarrierResult runBarrier(const std::string& kind, int k) {
  Server server(kind);
  const int procs = std::max(1, std::min(16, k / 64));
  struct Child { pid_t pid; FILE* out; int in; };
  std::vector<Child> children;
  for (int p = 0; p < procs; ++p) {
    const int n = k / procs + (p < k % procs ? 1 : 0);
    int toChild[2], fromChild[2];
    if (::pipe(toChild) != 0 || ::pipe(fromChild) != 0) return {false, 0, "pipe failed"};
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(toChild[0], STDIN_FILENO);
      ::dup2(fromChild[1], STDOUT_FILENO);
      ::close(toChild[1]);
      ::close(fromChild[0]);
      std::string ps = std::to_string(server.port), ns = std::to_string(n), ks = std::to_string(k);
      ::execl("/proc/self/exe", "ddprun-bench", "store", "--barrier-child", kind.c_str(),
              "--port", ps.c_str(), "--clients", ns.c_str(), "--total", ks.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(toChild[0]);
    ::close(fromChild[1]);
    children.push_back({pid, ::fdopen(fromChild[0], "r"), toChild[1]});
  }
  auto readLine = [](FILE* f) {
    char buf[256];
    return std::fgets(buf, sizeof buf, f) ? std::string(buf) : std::string("eof");
  };
  BarrierResult r;
  int connectFailures = 0;
  for (auto& c : children)
    if (readLine(c.out).rfind("connected", 0) != 0) ++connectFailures;
  if (connectFailures == 0) {
    auto t0 = Clock::now();
    for (auto& c : children) (void)!::write(c.in, "g", 1);
    int failed = 0;
    for (auto& c : children)
      if (readLine(c.out).rfind("done", 0) != 0) ++failed;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.ok = failed == 0;
    if (failed) r.note = std::to_string(failed) + " client processes failed";
  } else {
    r.note = std::to_string(connectFailures) + " of " + std::to_string(procs) +
             " client processes could not connect all their clients";
  }
  for (auto& c : children) {
    ::close(c.in);
    if (!r.ok) ::kill(c.pid, SIGKILL);
    int st;
    ::waitpid(c.pid, &st, 0);
    std::fclose(c.out);
  }
  return r;
}

// The physical floor in this run: a raw TCP ping-pong of 32 bytes over loopback, with an echo
// thread that does nothing else. Reported next to the store figures.
double loopbackRoundTripUs(int iterations) {
  boost::asio::io_context io;
  using tcp = boost::asio::ip::tcp;
  tcp::acceptor acc(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  std::thread echo([&] {
    tcp::socket s = acc.accept();
    s.set_option(tcp::no_delay(true));
    char buf[32];
    boost::system::error_code ec;
    for (int i = 0; i < iterations; ++i) {
      boost::asio::read(s, boost::asio::buffer(buf), ec);
      boost::asio::write(s, boost::asio::buffer(buf), ec);
    }
  });
  tcp::socket c(io);
  c.connect(acc.local_endpoint());
  c.set_option(tcp::no_delay(true));
  char buf[32] = {};
  auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    boost::asio::write(c, boost::asio::buffer(buf));
    boost::asio::read(c, boost::asio::buffer(buf));
  }
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iterations;
  echo.join();
  return us;
}

int benchStore(int argc, char** argv) {
  CLI::App app{"ddprun-store vs c10d::TCPStore: ops/s, latency, K-client barrier"};
  std::string childKind;
  int port = 0, clients = 0, total = 0, ops = 20000;
  std::vector<int> barrierSizes{64, 1024, 8192};
  std::string csv = ddprun::bench::resultsPath("store.csv");
  app.add_option("--barrier-child", childKind)->group("");  // internal: a barrier client process
  app.add_option("--port", port)->group("");
  app.add_option("--clients", clients)->group("");
  app.add_option("--total", total)->group("");
  app.add_option("--ops", ops, "operations per client thread");
  app.add_option("--barrier", barrierSizes, "barrier sizes K");
  app.add_option("--csv", csv, "where to write the results");
  CLI11_PARSE(app, argc, argv);
  raiseFileLimit();
  if (!childKind.empty()) return barrierChild(childKind, static_cast<uint16_t>(port), clients, total);

  const double rtt = loopbackRoundTripUs(20000);
  std::printf("raw loopback round trip (32 B, TCP_NODELAY) in this run: %.1f us = %.0f round trips/s\n\n",
              rtt, 1e6 / rtt);
  std::ofstream out(csv);
  out << "# raw loopback round trip us," << rtt << "\n";
  out << "workload,clients,ddprun_ops_per_s,torch_ops_per_s,ratio,ddprun_p50_us,torch_p50_us,"
         "ddprun_p99_us,torch_p99_us\n";
  std::printf("%-8s %7s | %12s %12s %6s | %9s %9s | %9s %9s\n", "op", "clients", "ddprun op/s",
              "TCPStore op/s", "ratio", "p50 ddp", "p50 torch", "p99 ddp", "p99 torch");
  for (const char* op : {"set", "get", "add"}) {
    for (int c : {1, 4, 32}) {
      const int n = std::max(2000, ops / std::max(1, c / 4));
      OpsResult d = runOps("ddprun", op, c, n);
      OpsResult t = runOps("torch", op, c, n);
      std::printf("%-8s %7d | %12.0f %12.0f %5.2fx | %7.1fus %7.1fus | %7.1fus %7.1fus\n", op, c,
                  d.opsPerSec, t.opsPerSec, d.opsPerSec / t.opsPerSec, d.p50us, t.p50us, d.p99us,
                  t.p99us);
      out << op << "," << c << "," << d.opsPerSec << "," << t.opsPerSec << ","
          << d.opsPerSec / t.opsPerSec << "," << d.p50us << "," << t.p50us << "," << d.p99us << ","
          << t.p99us << "\n";
      std::fflush(stdout);
    }
  }
  std::printf("\n%-8s %7s | %12s %12s %6s\n", "barrier", "K", "ddprun s", "TCPStore s", "ratio");
  out << "\nworkload,clients,ddprun_s,torch_s,ratio,note\n";
  for (int k : barrierSizes) {
    BarrierResult d = runBarrier("ddprun", k);
    BarrierResult t = runBarrier("torch", k);
    auto fmt = [](const BarrierResult& r) {
      std::ostringstream s;
      if (r.ok) s << r.seconds; else s << "failed";
      return s.str();
    };
    std::string ratio = d.ok && t.ok ? std::to_string(t.seconds / d.seconds) + "x faster" : "-";
    std::printf("%-8s %7d | %12s %12s  %s %s %s\n", "barrier", k, fmt(d).c_str(), fmt(t).c_str(),
                ratio.c_str(), d.note.c_str(), t.note.c_str());
    out << "barrier," << k << "," << fmt(d) << "," << fmt(t) << "," << ratio << ","
        << d.note << (t.note.empty() ? "" : " torch: " + t.note) << "\n";
    std::fflush(stdout);
  }
  std::printf("\nwritten: %s\n", csv.c_str());
  return 0;
}

}  // namespace

DDPRUN_BENCH("store", "ddprun-store vs c10d::TCPStore: ops/s, p50/p99, K-client barrier", benchStore)
