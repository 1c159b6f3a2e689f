#include "worker_runtime/gloo_communicator.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "base/errors.h"
#include "base/log.h"
#include "base/resolve.h"
#include "rendezvous/prefix_store.h"
#include "worker_runtime/gloo_store_adapter.h"
#include "worker_runtime/mesh_allreduce.h"
#include "worker_runtime/queued_communicator.h"
#include "worker_runtime/reduce.h"
#include "worker_runtime/work_queue.h"

namespace ddprun::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The address other ranks reach this one at, for Gloo's device and for the allreduce mesh alike:
// GlooOptions::hostname, else GLOO_SOCKET_IFNAME's IPv4 address, else this host's name when it
// resolves, else 127.0.0.1.
std::string chooseHost(const GlooOptions& o) {
  if (!o.hostname.empty()) return o.hostname;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    ifaddrs* list = nullptr;
    std::string found;
    if (::getifaddrs(&list) == 0) {
      for (ifaddrs* a = list; a; a = a->ifa_next) {
        if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && std::string(a->ifa_name) == ifname) {
          char text[INET_ADDRSTRLEN];
          ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                      sizeof(text));
          found = text;
          break;
        }
      }
      ::freeifaddrs(list);
    }
    if (found.empty()) {
      throw ConfigError(std::string("GLOO_SOCKET_IFNAME=") + ifname +
                        ": no such network interface with an IPv4 address");
    }
    return found;
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) {
    try {
      resolveTcp(host);
      return host;
    } catch (const NetworkError&) {
      DDPRUN_LOG(WARN, "gloo") << "host name " << host << " does not resolve; using 127.0.0.1 "
                               << "(set GLOO_SOCKET_IFNAME for jobs across machines)";
    }
  }
  return "127.0.0.1";
}

std::shared_ptr<gloo::transport::Device> makeDevice(const std::string& host) {
  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw ConfigError("gloo: cannot listen on address " + host + ": " + e.what());
  }
}

class GlooCommunicator final : public QueuedCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<rendezvous::Store> store, GlooOptions options)
      : options_(std::move(options)) {
    // The n-th communicator of this rank, counted in the store (not in the process, so ranks
    // as threads of one process also agree).
    const int64_t n = store->add("gloo/count/" + std::to_string(options_.rank), 1);
    const std::string prefix = "gloo/" + std::to_string(n);
    auto scoped = std::make_shared<rendezvous::PrefixStore>(prefix, std::move(store));
    GlooStoreAdapter adapter(*scoped, options_.rank, options_.size, options_.timeout);
    const std::string host = chooseHost(options_);
    auto device = makeDevice(host);
    auto context = std::make_shared<gloo::rendezvous::Context>(options_.rank, options_.size);
    // Gloo gives each pair the context's timeout when it creates it, and a pair waits up to five
    // times that for its connection (the listening side: for the peer to connect). So the pairs
    // are made with a fifth of the set-up bound, then the collectives get the collective timeout
    // (ours pass it explicitly too). A pair keeps its timeout after, but it bounds only Gloo's
    // sync mode and its old bound buffers, neither used here (the sockets are non-blocking).
    const Millis setup = setupTimeout();
    context->setTimeout(std::max(Millis(1), setup / 5));
    try {
      context->connectFullMesh(adapter, device);
      context->setTimeout(options_.timeout);
    } catch (const ddprun::Error&) {
      throw;  // the store's own error names the key and the address
    } catch (const std::exception& e) {
      throw BackendError("gloo: rank " + std::to_string(options_.rank) + " of " +
                         std::to_string(options_.size) + " could not connect to its peers (" +
                         "bound " + std::to_string(setup.count() / 1000.0).substr(0, 5) +
                         " s): " + e.what());
    }
    context_ = context;
    if (options_.size > 1) {
      allreduce_ = std::make_unique<MeshAllreduce>(std::make_unique<TcpMesh>(
          *scoped, "mesh", options_.rank, options_.size, host, setup,
          options_.meshSecret));
    }
  }

  ~GlooCommunicator() override {
    queue_.drain();
    if (closer_.joinable()) closer_.join();
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string_view backend() const override { return "gloo"; }
  torch::Device device() const override { return torch::kCPU; }
  Millis timeout() const override { return options_.timeout; }

  // Gloo's collectives (barrier, broadcast, allgather) cannot be cancelled, but a peer waiting
  // in one on this rank fails once this rank's side of their pair is closed: without that, a
  // peer that was a step behind (in a barrier this rank left when another peer died) waited on
  // this live rank for the whole collective timeout, while this rank waited for it in the next
  // generation's set-up (nodes_recovery_test.cpp, "ready spares SIGKILLed three times").
  // Closing a pair waits for a tick of Gloo's event loop (10-20 ms for 1-3 peers here), so it
  // runs on a thread of its own instead of in the recovery; the destructor joins it.
  void abort() override {
    fail("aborted by this rank (in-process recovery)");
    if (allreduce_) allreduce_->abort();
    if (!closer_.joinable()) {
      closer_ = std::thread([context = context_] {
        try {
          context->closeConnections();
        } catch (const std::exception& e) {  // a failed epoll_ctl: the pairs close with the context
          DDPRUN_LOG(WARN, "gloo") << "closing the aborted communicator's connections: " << e.what();
        }
      });
    }
  }

  torch::Tensor allgather(const torch::Tensor& input) override {
    checkCollectiveTensor(input, *this, "allgather");
    torch::Tensor out = allgatherOutput(input, size());
    queue_.runInline([&] {
      guarded("allgather", input.nbytes(), [&] {
        if (size() == 1) {
          out[0].copy_(input);
          return;
        }
        if (input.nbytes() == 0) return;
        gloo::AllgatherOptions o(context_);
        o.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
        o.setOutput(static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
        o.setTag(nextTag_++);
        o.setTimeout(options_.timeout);
        gloo::allgather(o);
      });
    });
    return out;
  }

  void barrier() override {
    queue_.runInline([&] {
      guarded("barrier", 0, [&] {
        if (size() == 1) return;
        gloo::BarrierOptions o(context_);
        o.setTag(nextTag_++);
        o.setTimeout(options_.timeout);
        gloo::barrier(o);
      });
    });
  }

 protected:
  WorkQueue& queue() override { return queue_; }
  const WorkQueue& queue() const override { return queue_; }

  void allreduceNow(const torch::Tensor& t, ReduceOp op) override {
    guarded("allreduce", t.nbytes(), [&] {
      const size_t n = static_cast<size_t>(t.numel());
      // An empty tensor still goes through the mesh: its header tells a rank that reduces N
      // elements at once (both fail naming both shapes) instead of leaving it to time out.
      if (size() == 1) return;
      const ReduceBuffer buf{t.data_ptr(), n, t.scalar_type()};
      const auto deadline = Clock::now() + options_.timeout;
      const ReduceOp kernelOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
      const RingTuning tuning{.segmentBytes = options_.ringSegmentBytes,
                              .window = options_.ringWindow};
      switch (algorithmFor(t.nbytes())) {
        case AllreduceAlgorithm::Direct: allreduce_->direct(buf, kernelOp, deadline); break;
        case AllreduceAlgorithm::HalvingDoubling:
          allreduce_->halvingDoubling(buf, kernelOp, deadline, tuning);
          break;
        case AllreduceAlgorithm::Ring:
        case AllreduceAlgorithm::Auto: allreduce_->ring(buf, kernelOp, deadline, tuning); break;
      }
      if (op == ReduceOp::Avg) divideBy(buf.ptr, n, buf.type, size());
    });
  }

 private:
  // The bound of connecting to the peers (GlooOptions::setupTimeout; zero: the collective's).
  Millis setupTimeout() const {
    return options_.setupTimeout > Millis(0) ? options_.setupTimeout : options_.timeout;
  }
  AllreduceAlgorithm algorithmFor(size_t bytes) const {
    const bool powerOfTwo = (size() & (size() - 1)) == 0;
    if (options_.allreduce == AllreduceAlgorithm::HalvingDoubling && !powerOfTwo) {
      return AllreduceAlgorithm::Ring;
    }
    if (options_.allreduce != AllreduceAlgorithm::Auto) return options_.allreduce;
    if (bytes * static_cast<size_t>(size() - 1) <= options_.directMaxBytes) {
      return AllreduceAlgorithm::Direct;
    }
    const bool hd = powerOfTwo && options_.preferHalvingDoubling &&
                    bytes <= options_.halvingDoublingMaxBytes;
    return hd ? AllreduceAlgorithm::HalvingDoubling : AllreduceAlgorithm::Ring;
  }

  void broadcastNow(const torch::Tensor& t, int root) override {
    guarded("broadcast", t.nbytes(), [&] {
      if (size() == 1 || t.nbytes() == 0) return;
      gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
      o.setRoot(root);
      o.setTag(nextTag_++);
      o.setTimeout(options_.timeout);
      gloo::broadcast(o);
    });
  }

  // Runs one collective: refuses at once when an earlier one failed, and turns Gloo's exceptions
  // into ours, naming the collective, its size and this rank.
  template <typename Fn>
  void guarded(const char* what, size_t bytes, Fn&& fn) {
    broken_.throwIfBroken(backend(), what);
    const std::string where = std::string("gloo ") + what + " of " + std::to_string(bytes) +
                              " bytes on rank " + std::to_string(rank()) + "/" +
                              std::to_string(size());
    try {
      fn();
    } catch (const gloo::IoException& e) {
      const std::string msg = e.what();
      fail(msg);
      if (msg.find("Timed out") != std::string::npos || msg.find("timeout") != std::string::npos) {
        throw TimeoutError(where + " timed out after " + std::to_string(timeout().count()) +
                           " ms: " + msg);
      }
      throw BackendError(where + " failed (did a peer exit?): " + msg);
    } catch (const TimeoutError& e) {
      fail(e.what());
      throw TimeoutError(where + " timed out after " + std::to_string(timeout().count()) + " ms: " +
                         e.what());
    } catch (const BackendError& e) {
      fail(e.what());
      throw BackendError(where + " failed: " + e.what());
    } catch (const gloo::Exception& e) {
      fail(e.what());
      throw BackendError(where + " failed: " + e.what());
    } catch (const ddprun::Error& e) {
      fail(e.what());
      throw;
    }
  }

  void fail(const std::string& why) { broken_.set(why); }

  GlooOptions options_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<MeshAllreduce> allreduce_;
  std::thread closer_;  // abort()'s: closes context_'s connections
  uint32_t nextTag_ = 1;  // only touched by the one thread running collectives
  BrokenLatch broken_;
  WorkQueue queue_;  // last member: its thread stops before the rest is destroyed
};

}  // namespace

std::shared_ptr<Communicator> makeGlooCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                   GlooOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw ConfigError("gloo: rank " + std::to_string(options.rank) + " is outside 0.." +
                      std::to_string(options.size - 1));
  }
  return std::make_shared<GlooCommunicator>(std::move(store), std::move(options));
}

}  // namespace ddprun::runtime
