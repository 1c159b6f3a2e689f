#pragma once
// EtcdWatch: a watch on one key or a range of keys, from a given revision on, that survives the
// loss of the member serving it. Over gRPC (usesGrpc) it is a Watch call -- an HTTP/2 stream on
// the connection its options' ChannelPool shares with the agent's other clients and watches;
// over the gateway, the streamed reply of /v3/watch on a connection of its own.
//
// Events arrive in revision order. When the stream breaks (the member died, lost its leader,
// or ended the stream) it is opened again on the next member from the revision after the
// last event seen, so no event is lost or delivered twice. Re-opening is bounded by the
// client timeout: when no member serves the watch for that long, next() throws NetworkError
// naming every endpoint. A watch never polls: between events it holds one idle connection.
//
// One thread calls next(); cancel() and wake() may come from any thread (under a
// rendezvous::Blocking: from a fiber of that thread; next() then parks the fiber, and so does
// the backoff between re-opening attempts).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/etcd/etcd_client.h"

namespace ddprun::rendezvous::etcd {

// The revision a watch had to start from has been compacted away: read the key(s) again.
class CompactedError : public StoreError {
 public:
  CompactedError(const std::string& what, int64_t compactRevision)
      : StoreError(what), compactRevision_(compactRevision) {}
  int64_t compactRevision() const { return compactRevision_; }

 private:
  int64_t compactRevision_;
};

class EtcdWatch {
 public:
  // Watches [create.key, create.rangeEnd) from create.startRevision (> 0: the revision the
  // caller read at, plus one). Opens the stream at the first next().
  // Over gRPC without options.channels the watch has a connection of its own.
  EtcdWatch(EtcdClientOptions options, WatchCreate create);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // The next events, or an empty vector when `deadline` passes or wake() is called first.
  // While the stream is being re-opened the deadline does not apply (only the timeout).
  // Throws NetworkError (no member serves it; cancelled), CompactedError.
  std::vector<Event> next(Clock::time_point deadline);
  // Every event up to (not including) this revision has been delivered.
  int64_t nextRevision() const { return next_; }

  // Any thread: next() in progress, and every later call, throw NetworkError.
  void cancel();
  // Any thread: a next() in progress returns an empty vector at once (once).
  void wake();

 private:
  void open(Clock::time_point failingSince);
  // The next message of the open stream; nullopt at `deadline` or when woken. Throws
  // NetworkError when the stream breaks (an error line of the gateway included).
  std::optional<WatchMessage> read(Clock::time_point deadline);

  EtcdClientOptions options_;
  WatchCreate create_;
  int64_t next_;
  size_t member_;
  std::string lastError_;
  std::mutex mu_;  // guards conn_ against cancel()/wake()
  std::unique_ptr<HttpConnection> conn_;
  std::unique_ptr<grpc::Call> call_;  // gRPC
  bool open_ = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> woken_{false};
};

}  // namespace ddprun::rendezvous::etcd
