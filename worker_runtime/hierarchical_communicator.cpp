#include "worker_runtime/hierarchical_communicator.h"

#include <mutex>

#include "base/errors.h"
#include "rendezvous/prefix_store.h"
#include "worker_runtime/gloo_communicator.h"
#include "worker_runtime/reduce.h"
#include "worker_runtime/shm/shm_communicator.h"
#include "worker_runtime/work_queue.h"

namespace ddprun::runtime {
namespace {

class HierarchicalCommunicator final : public Communicator {
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
  ThreadCounts threadCounts() const override { return queue_.counts(); }
  void abort() override {
    for (const auto& c : {world_, local_, leaders_}) {
      if (c) c->abort();
    }
  }

  std::shared_ptr<Work> allreduceAsync(torch::Tensor tensor, ReduceOp op) override {
    checkAllreduce(tensor, op);
    return queue_.submit([this, tensor, op] { allreduceNow(tensor, op); });
  }

  std::shared_ptr<Work> broadcastAsync(torch::Tensor tensor, int root) override {
    checkBroadcast(tensor, root);
    return queue_.submit([this, tensor, root] { broadcastNow(tensor, root); });
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
  void allreduceBlocking(torch::Tensor tensor, ReduceOp op) override {
    checkAllreduce(tensor, op);
    queue_.runInline([&] { allreduceNow(tensor, op); });
  }

  void broadcastBlocking(torch::Tensor tensor, int root) override {
    checkBroadcast(tensor, root);
    queue_.runInline([&] { broadcastNow(tensor, root); });
  }

 private:
  bool leader() const { return options_.localRank == 0; }

  void checkAllreduce(const torch::Tensor& t, ReduceOp op) {
    checkCollectiveTensor(t, *this, "allreduce");
    if (op == ReduceOp::Avg && !c10::isFloatingType(t.scalar_type())) {
      throw ConfigError("shm+tcp allreduce: op avg needs a floating dtype, not " +
                        std::string(c10::toString(t.scalar_type())) + " (use sum and divide)");
    }
  }

  void checkBroadcast(const torch::Tensor& t, int root) {
    checkCollectiveTensor(t, *this, "broadcast");
    if (root < 0 || root >= size()) {
      throw ConfigError("shm+tcp broadcast: root " + std::to_string(root) + " is not a rank (0.." +
                        std::to_string(size() - 1) + ")");
    }
  }

  // Node, leaders, node again (see the header). Avg: sums, divided once on the leader.
  void allreduceNow(const torch::Tensor& t, ReduceOp op) {
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

  void broadcastNow(const torch::Tensor& t, int root) {
    guarded("broadcast", [&] { world_->broadcast(t, root); });
  }

  // Refuses at once after an earlier failure. An error passes unchanged: the inner communicators
  // already name the level, the collective, its size and the rank.
  template <typename Fn>
  void guarded(const char* what, Fn&& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.empty()) {
        throw BackendError(std::string("shm+tcp ") + what + " refused: the communicator is "
                           "broken since an earlier error (" + broken_ + ")");
      }
    }
    try {
      fn();
    } catch (const std::exception& e) {
      fail(e.what());
      throw;
    }
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = why;
  }

  HierarchicalOptions options_;
  std::shared_ptr<Communicator> world_;    // every rank, over TCP
  std::shared_ptr<Communicator> local_;    // this node's ranks, through shared memory
  std::shared_ptr<Communicator> leaders_;  // the nodes' local rank 0, over TCP (on leaders)
  std::mutex mu_;
  std::string broken_;
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
