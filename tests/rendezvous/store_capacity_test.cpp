// The store holds 8192 concurrent connections, each with a WAIT held on the server, and one SET
// wakes them all. Exits 77 (ctest: skipped) when this process may not open ~16.5k descriptors.
#include <fcntl.h>
#include <poll.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "raw_socket.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store_server.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"

using namespace ddprun::rendezvous;

int main() {
  constexpr int kClients = 8192;
  const uint64_t limit = raiseFileLimit();
  if (limit < 2 * kClients + 256) {
    std::printf("SKIP: the descriptor limit is %llu, this test needs %d\n",
                static_cast<unsigned long long>(limit), 2 * kClients + 256);
    return 77;
  }
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  std::string frame;
  protocol::FrameWriter(frame)
      .u8(0).u32(protocol::kValidateMagic)  // current dialect
      .u8(static_cast<uint8_t>(protocol::CurrentCommand::Wait)).u64(1).str("go");
  std::vector<std::unique_ptr<ddprun::test::RawSocket>> clients;
  clients.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<ddprun::test::RawSocket>(server.port()));
    clients.back()->send(frame);
  }
  for (int i = 0; i < 500 && server.stats().waiters < kClients; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto st = server.stats();
  std::printf("connections %zu, waiters %zu\n", st.connections, st.waiters);
  if (st.connections != kClients || st.waiters != kClients) {
    std::printf("FAIL: expected %d connections each holding a WAIT\n", kClients);
    return 1;
  }
  TcpStore setter({.host = "127.0.0.1", .port = server.port()});
  setter.set("go", "1");
  int woken = 0;
  for (auto& c : clients) {
    if (c->read(1, 10'000) == std::string(1, static_cast<char>(protocol::WaitReply::StopWaiting))) ++woken;
  }
  std::printf("woken %d of %d\n", woken, kClients);
  if (woken != kClients) return 1;
  clients.clear();
  for (int i = 0; i < 500 && server.stats().connections > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  st = server.stats();
  std::printf("after the clients left: connections %zu, waiters %zu\n", st.connections, st.waiters);
  return st.connections == 1 && st.waiters == 0 ? 0 : 1;
}
