#include "worker_runtime/hierarchical_communicator.h"

#include "base/errors.h"
#include "rendezvous/prefix_store.h"
#include "worker_runtime/gloo_communicator.h"
#include "worker_runtime/queued_communicator.h"
#include "worker_runtime/reduce.h"
#include "worker_runtime/shm/shm_communicator.h"
#include "worker_runtime/work_queue.h"

namespace ddprun::runtime {
namespace {

class HierarchicalCommunicator final : public QueuedCommunicator {
 public:
  HierarchicalCommunicator(std::shared_ptr<rendezvous::Store> store, HierarchicalOptions options)
      : options_(std::move(options)) {
    // The n-th hierarchical communicator of this rank, counted in the store (as Gloo's).
    const int64_t n = store->add("hier/count/" + std::to_string(options_.rank), 1);
    const std::string prefix = "hier/" + std::to_string(n) + "/";
    auto scoped = [&](const std::string& sub) {
      return std::make_shared<rendezvous::PrefixStore>(prefix + sub, store);
    };
    // Set-up order is the same on every rank: the world (everyone), then the node, then the
    // leaders; each waits only for its own members, who have all finished the step before.
    world_ = makeGlooCommunicator(scoped("world"), {.rank = options_.rank,
                                                    .size = options_.size,
                                                    .timeout = options_.timeout,
                                                    .setupTimeout = options_.setupTimeout,
                                                    .hostname = options_.hostname,
                                                    .meshSecret = options_.meshSecret});
    if (options_.localSize > 1) {
      local_ = shm::makeShmCommunicator(scoped("node/" + std::to_string(options_.node)),
                                        {.rank = options_.localRank,
                                         .size = options_.localSize,
                                         .timeout = options_.timeout,
                                         .namePrefix = options_.shmPrefix});
    }
    if (leader() && options_.nodes > 1) {
      leaders_ = makeGlooCommunicator(scoped("leaders"), {.rank = options_.node,
                                                          .size = options_.nodes,
                                                          .timeout = options_.timeout,
                                                          .setupTimeout = options_.setupTimeout,
                                                          .hostname = options_.hostname,
                                                          .meshSecret = options_.meshSecret});
    }
  }

  ~HierarchicalCommunicator() override { queue_.drain(); }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string_view backend() const override { return "shm+tcp"; }
  torch::Device device() const override { return torch::kCPU; }
  Millis timeout() const override { return options_.timeout; }
  void abort() override {
    for (const auto& c : {world_, local_, leaders_}) {
      if (c) c->abort();
    }
  }

  torch::Tensor allgather(const torch::Tensor& input) override {
    checkCollectiveTensor(input, *this, "allgather");
    torch::Tensor out;
    queue_.runInline([&] { guarded("allgather", [&] { out = world_->allgather(input); }); });
    return out;
  }

  void barrier() override {
    queue_.runInline([&] { guarded("barrier", [&] { world_->barrier(); }); });
  }

 protected:
  WorkQueue& queue() override { return queue_; }
  const WorkQueue& queue() const override { return queue_; }

  // Node, leaders, node again (see the header). Avg: sums, divided once on the leader.
  void allreduceNow(const torch::Tensor& t, ReduceOp op) override {
    guarded("allreduce", [&] {
      const ReduceOp sumOrOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
      if (local_) local_->allreduce(t, sumOrOp);
      if (leader()) {
        if (leaders_) leaders_->allreduce(t, sumOrOp);
        if (op == ReduceOp::Avg && t.numel() > 0) {
          divideBy(t.data_ptr(), static_cast<size_t>(t.numel()), t.scalar_type(), size());
        }
      }
      if (local_) local_->broadcast(t, 0);
    });
  }

  void broadcastNow(const torch::Tensor& t, int root) override {
    guarded("broadcast", [&] { world_->broadcast(t, root); });
  }

 private:
  bool leader() const { return options_.localRank == 0; }

  // Refuses at once after an earlier failure. An error passes unchanged: the inner communicators
  // already name the level, the collective, its size and the rank.
  template <typename Fn>
  void guarded(const char* what, Fn&& fn) {
    broken_.throwIfBroken(backend(), what);
    try {
      fn();
    } catch (const std::exception& e) {
      broken_.set(e.what());
      throw;
    }
  }

  HierarchicalOptions options_;
  std::shared_ptr<Communicator> world_;    // every rank, over TCP
  std::shared_ptr<Communicator> local_;    // this node's ranks, through shared memory
  std::shared_ptr<Communicator> leaders_;  // the nodes' local rank 0, over TCP (on leaders)
  BrokenLatch broken_;
  WorkQueue queue_;  // last member: its thread stops before the rest is destroyed
};

}  // namespace

std::shared_ptr<Communicator> makeHierarchicalCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                           HierarchicalOptions options) {
  const auto& o = options;
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size || o.nodes < 1 || o.node < 0 ||
      o.node >= o.nodes || o.localSize < 1 || o.localRank < 0 || o.localRank >= o.localSize ||
      o.nodes * o.localSize != o.size) {
    throw ConfigError("shm+tcp: inconsistent placement: rank " + std::to_string(o.rank) + "/" +
                      std::to_string(o.size) + ", node " + std::to_string(o.node) + "/" +
                      std::to_string(o.nodes) + ", local rank " + std::to_string(o.localRank) +
                      "/" + std::to_string(o.localSize));
  }
  return std::make_shared<HierarchicalCommunicator>(std::move(store), std::move(options));
}

}  // namespace ddprun::runtime
