#pragma once
// WorkerStoreLink: an agent's connection to the workers' store of a job on several nodes, for
// in-process recovery (docs/recovery.md#several-nodes).
//
// With the agent store, node rank 0's agent hosts the store every node's workers meet in (on its
// I/O thread); the generations of the worker group are published there, and every node's agent
// must read and write them. The store protocol blocks and an agent's I/O thread must not (node 0's
// serves the very store), so the link owns two threads, each with a connection of its own
// (node 0's agent reaches its own store through it too, as any client):
//   - jobs: run in order on one thread with its connection (`run`), their result handed back on
//     the I/O thread (`then`), never an exception thrown there: a failed job's error goes to
//     `then` as a message;
//   - the follower: WAITs for ddprun/generation/1, 2, ... of the attempt, in order, and posts
//     each record's text to the I/O thread (`onRecord`), so that every agent learns of every
//     generation, its own and the others'.
// The destructor interrupts both connections and joins (bounded by a call in progress).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::launcher {

class WorkerStoreLink {
 public:
  // `store`: the workers' store (no token: PyTorch workers could not authenticate to it);
  // `attemptPrefix`: the keys' prefix ("/worker/attempt_<N>"); `onRecord(g, text)` runs on `io`.
  WorkerStoreLink(boost::asio::io_context& io, rendezvous::TcpStoreOptions store,
                  std::string attemptPrefix,
                  std::function<void(int generation, const std::string& text)> onRecord);
  ~WorkerStoreLink();
  WorkerStoreLink(const WorkerStoreLink&) = delete;
  WorkerStoreLink& operator=(const WorkerStoreLink&) = delete;

  // Runs `job` on the jobs' thread with the attempt's store (keys without the prefix); then
  // `then(error)` on the I/O thread, error empty when the job succeeded.
  void run(std::function<void(rendezvous::Store&)> job,
           std::function<void(const std::string& error)> then);

  // Waits (on a thread and connection of its own, in rounds of a minute: no polling) until
  // every key of `keys` is set, then runs `then` on the I/O thread; never when the store goes
  // away or the link is destroyed first.
  void waitFor(std::vector<std::string> keys, std::function<void()> then);

 private:
  void jobsMain();
  void followMain();

  boost::asio::io_context& io_;
  rendezvous::TcpStoreOptions options_;
  std::string prefix_;
  std::function<void(int, const std::string&)> onRecord_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  // Made (unconnected) by the constructor, connected by their threads' first calls.
  std::shared_ptr<rendezvous::TcpStore> jobsConn_;
  std::shared_ptr<rendezvous::TcpStore> followConn_;
  std::vector<std::shared_ptr<rendezvous::TcpStore>> waitConns_;  // under mu_
  std::thread jobsThread_;
  std::thread followThread_;
  std::vector<std::thread> waitThreads_;
};

}  // namespace ddprun::launcher
