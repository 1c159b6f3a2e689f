#include "launcher/worker_store_link.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/recovery_keys.h"

namespace ddprun::launcher {

namespace asio = boost::asio;
namespace rdzv = ddprun::rendezvous;

WorkerStoreLink::WorkerStoreLink(asio::io_context& io, rdzv::TcpStoreOptions store,
                                 std::string attemptPrefix,
                                 std::function<void(int, const std::string&)> onRecord)
    : io_(io), options_(std::move(store)), prefix_(std::move(attemptPrefix)),
      onRecord_(std::move(onRecord)) {
  options_.tokenFromEnvironment = false;
  // Every connection is made by its first call, on its thread, so that the destructor can
  // interrupt it at once: when node 0's agent has ended (the job is over), a connect would
  // otherwise retry for connectTimeout and hold this agent's exit as long.
  options_.connectInConstructor = false;
  jobsConn_ = std::make_shared<rdzv::TcpStore>(options_);
  followConn_ = std::make_shared<rdzv::TcpStore>(options_);
  jobsThread_ = std::thread([this] { jobsMain(); });
  followThread_ = std::thread([this] { followMain(); });
}

WorkerStoreLink::~WorkerStoreLink() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    jobs_.clear();
    if (jobsConn_) jobsConn_->interrupt();
    if (followConn_) followConn_->interrupt();
    for (auto& c : waitConns_) c->interrupt();
  }
  cv_.notify_all();
  jobsThread_.join();
  followThread_.join();
  for (auto& t : waitThreads_) t.join();
}

void WorkerStoreLink::waitFor(std::vector<std::string> keys, std::function<void()> then) {
  auto conn = std::make_shared<rdzv::TcpStore>(options_);  // connects on its thread
  {
    std::lock_guard<std::mutex> g(mu_);
    waitConns_.push_back(conn);
  }
  waitThreads_.emplace_back([this, conn, keys = std::move(keys), then = std::move(then)] {
    try {
      rdzv::PrefixStore store(prefix_, conn);
      for (;;) {
        try {
          store.wait(keys, rdzv::Millis(60'000));
          break;
        } catch (const TimeoutError&) {
          std::lock_guard<std::mutex> g(mu_);
          if (stopping_) return;
        }
      }
      asio::post(io_, then);
    } catch (const std::exception& e) {
      DDPRUN_LOG(DEBUG, "launcher") << "a wait in the workers' store ended: " << e.what();
    }
  });
}

void WorkerStoreLink::run(std::function<void(rdzv::Store&)> job,
                          std::function<void(const std::string&)> then) {
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back([this, job = std::move(job), then = std::move(then)] {
      std::string error;
      try {
        rdzv::PrefixStore store(prefix_, jobsConn_);
        job(store);
      } catch (const std::exception& e) {
        error = e.what();
        if (error.empty()) error = "unknown error";
      }
      asio::post(io_, [then, error] { then(error); });
    });
  }
  cv_.notify_all();
}

void WorkerStoreLink::jobsMain() {
  // Connected now, while the store is there: a recovery's first job does not wait for a
  // connect (nor, when node 0 is gone, for the connect's retries).
  try {
    jobsConn_->ping();
  } catch (const std::exception& e) {  // a job's call connects again
    DDPRUN_LOG(DEBUG, "launcher") << "the workers' store is not reached yet: " << e.what();
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

void WorkerStoreLink::followMain() {
  namespace keys = rdzv::recovery;
  try {
    rdzv::PrefixStore store(prefix_, followConn_);
    for (int g = 1;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      try {
        store.wait({keys::generationKey(g)}, rdzv::Millis(60'000));
      } catch (const TimeoutError&) {
        continue;  // no recovery for a minute: wait another round
      }
      const std::string text = store.get(keys::generationKey(g));
      asio::post(io_, [fn = onRecord_, g, text] { fn(g, text); });
      ++g;
    }
  } catch (const std::exception& e) {
    // Stopped (interrupted), or the store went away (node 0's agent ended the round or the
    // job): the agent hears of that from the rendezvous.
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      DDPRUN_LOG(DEBUG, "launcher") << "the watch of the workers' generations ended: " << e.what();
    }
  }
}

}  // namespace ddprun::launcher
