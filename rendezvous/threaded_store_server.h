#pragma once
// ThreadedStoreServer: a StoreServer on its own thread and io_context, for processes that
// have no event loop of their own (a worker whose rank 0 hosts the store, tests, benchmarks).
// The server is listening when the constructor returns; the destructor stops it and joins.
#include <memory>
#include <thread>

#include "rendezvous/store_server.h"

namespace ddprun::rendezvous {

class ThreadedStoreServer {
 public:
  explicit ThreadedStoreServer(StoreServerOptions options);
  ~ThreadedStoreServer();
  ThreadedStoreServer(const ThreadedStoreServer&) = delete;
  ThreadedStoreServer& operator=(const ThreadedStoreServer&) = delete;

  uint16_t port() const { return port_; }
  // A snapshot taken on the server's thread.
  StoreServerStats stats();

 private:
  struct State;
  std::unique_ptr<State> state_;
  uint16_t port_ = 0;
};

}  // namespace ddprun::rendezvous
