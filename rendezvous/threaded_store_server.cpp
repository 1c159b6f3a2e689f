#include "rendezvous/threaded_store_server.h"

#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <future>

namespace ddprun::rendezvous {

namespace asio = boost::asio;

struct ThreadedStoreServer::State {
  asio::io_context io{1};
  std::unique_ptr<StoreServer> server;
  std::thread thread;
};

ThreadedStoreServer::ThreadedStoreServer(StoreServerOptions options)
    : state_(std::make_unique<State>()) {
  // Bind on the caller's thread so errors surface here as exceptions.
  state_->server = std::make_unique<StoreServer>(state_->io, std::move(options));
  port_ = state_->server->port();
  state_->thread = std::thread([s = state_.get()] { s->io.run(); });
}

ThreadedStoreServer::~ThreadedStoreServer() {
  asio::post(state_->io, [s = state_.get()] {
    s->server->stop();
    s->io.stop();
  });
  state_->thread.join();
  state_->server.reset();
}

StoreServerStats ThreadedStoreServer::stats() {
  std::promise<StoreServerStats> p;
  auto f = p.get_future();
  asio::post(state_->io, [&] { p.set_value(state_->server->stats()); });
  return f.get();
}

}  // namespace ddprun::rendezvous
