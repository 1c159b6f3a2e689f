#include "worker_runtime/traced_communicator.h"

#include <atomic>
#include <mutex>

#include "base/timeline.h"

namespace ddprun::runtime {
namespace {

namespace events = ddprun::timeline;

// The span of one collective, written once when it is known to be over. A blocking one nests
// in what its caller is doing, on the caller's thread; async ones overlap each other and the
// caller's spans, so each takes a lane (base/timeline.h) from submission to completion.
class CollectiveSpan {
 public:
  CollectiveSpan(const char* name, events::Args args, bool async)
      : name_(name), args_(std::move(args)), start_(events::nowUs()),
        lane_(async ? events::acquireLane() : -1) {}
  ~CollectiveSpan() { end(); }
  void end() {
    std::call_once(once_, [&] {
      const int64_t dur = events::nowUs() - start_;
      if (lane_ < 0) {
        events::span(name_, "collective", start_, dur, args_);
      } else {
        events::spanOnLane(lane_, name_, "collective", start_, dur, args_);
        events::releaseLane(lane_);
      }
    });
  }

 private:
  const char* name_;
  events::Args args_;
  int64_t start_;
  int lane_;
  std::once_flag once_;
};

class TracedWork final : public Work {
 public:
  TracedWork(std::shared_ptr<Work> inner, std::shared_ptr<CollectiveSpan> span)
      : inner_(std::move(inner)), span_(std::move(span)) {}
  void wait() override {
    try {
      inner_->wait();
    } catch (...) {
      span_->end();
      throw;
    }
    span_->end();
  }
  bool completed() override {
    const bool done = inner_->completed();
    if (done) span_->end();
    return done;
  }

 private:
  std::shared_ptr<Work> inner_;
  std::shared_ptr<CollectiveSpan> span_;
};

class TracedCommunicator final : public Communicator {
 public:
  TracedCommunicator(std::shared_ptr<Communicator> inner, std::string group)
      : inner_(std::move(inner)), group_(std::move(group)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  torch::Device device() const override { return inner_->device(); }
  Millis timeout() const override { return inner_->timeout(); }

  std::shared_ptr<Work> allreduceAsync(torch::Tensor tensor, ReduceOp op) override {
    auto span = begin("allreduce", tensor);
    span.second.add("op", toString(op));
    auto s = std::make_shared<CollectiveSpan>(span.first, std::move(span.second), true);
    return std::make_shared<TracedWork>(inner_->allreduceAsync(std::move(tensor), op), s);
  }
  std::shared_ptr<Work> broadcastAsync(torch::Tensor tensor, int root) override {
    auto span = begin("broadcast", tensor);
    span.second.add("root", root);
    auto s = std::make_shared<CollectiveSpan>(span.first, std::move(span.second), true);
    return std::make_shared<TracedWork>(inner_->broadcastAsync(std::move(tensor), root), s);
  }
  torch::Tensor allgather(const torch::Tensor& input) override {
    auto span = begin("allgather", input);
    CollectiveSpan s(span.first, std::move(span.second), false);
    torch::Tensor out = inner_->allgather(input);
    s.end();
    return out;
  }
  ThreadCounts threadCounts() const override { return inner_->threadCounts(); }
  void abort() override { inner_->abort(); }
  AllreduceBytes allreduceBytes() const override { return inner_->allreduceBytes(); }
  torch::Tensor lendSharedBuffer(size_t bytes) override { return inner_->lendSharedBuffer(bytes); }

 protected:
  // Blocking calls stay blocking (on the caller's thread, communicator.h) and nest in the
  // caller's spans.
  void allreduceBlocking(torch::Tensor tensor, ReduceOp op) override {
    auto span = begin("allreduce", tensor);
    span.second.add("op", toString(op));
    CollectiveSpan s(span.first, std::move(span.second), false);
    inner_->allreduce(std::move(tensor), op);
  }
  void broadcastBlocking(torch::Tensor tensor, int root) override {
    auto span = begin("broadcast", tensor);
    span.second.add("root", root);
    CollectiveSpan s(span.first, std::move(span.second), false);
    inner_->broadcast(std::move(tensor), root);
  }

 public:
  void barrier() override {
    CollectiveSpan s("barrier", events::Args()
                                    .add("seq", seq_++)
                                    .add("group", group_)
                                    .add("bytes", int64_t{0})
                                    .add("backend", inner_->backend()),
                     false);
    inner_->barrier();
    s.end();
  }

 private:
  std::pair<const char*, events::Args> begin(const char* name, const torch::Tensor& t) {
    return {name, events::Args()
                      .add("seq", seq_++)
                      .add("group", group_)
                      .add("bytes", static_cast<int64_t>(t.numel() * t.element_size()))
                      .add("dtype", std::string(c10::toString(t.scalar_type())))
                      .add("backend", inner_->backend())};
  }

  std::shared_ptr<Communicator> inner_;
  std::string group_;
  int64_t seq_ = 0;  // one thread at a time uses a communicator (communicator.h)
};

}  // namespace

std::shared_ptr<Communicator> makeTracedCommunicator(std::shared_ptr<Communicator> inner,
                                                     std::string group) {
  return std::make_shared<TracedCommunicator>(std::move(inner), std::move(group));
}

}  // namespace ddprun::runtime
