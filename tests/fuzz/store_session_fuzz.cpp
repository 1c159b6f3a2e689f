// Fuzz target: a whole store session. The input is the byte stream of one client connection,
// written to a real StoreServer over loopback in pieces while the replies are read, so the
// dialect detection, the incremental parser, the handlers, the caps, backpressure and the
// handshake before authentication all run as in production. Input:
//   byte 0: bit 0 = the server has a token (only the handshake is allowed before AUTH),
//           bits 1-7 = the size of the pieces the stream is written in (1..128 bytes)
//   rest  : the stream
// After the client hangs up, the server must have dropped the connection and every waiter
// (anything else traps). Small limits, so that the caps and the backpressure are reached.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <string_view>

#include "rendezvous/store_server.h"

using namespace ddprun::rendezvous;

namespace {

int connectTo(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);  // out of ports or descriptors: the machine's limit, not a finding
    return -1;
  }
  if (fd >= 0) ::fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

// Reads and drops whatever the server sent; false once it closed the connection.
bool drain(int fd) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool token = data[0] & 1;
  const size_t piece = 1 + (data[0] >> 1);
  std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);

  boost::asio::io_context io(1);
  StoreServerOptions options{
      .host = "127.0.0.1",
      .port = 0,
      .limits = {.frame = {.maxKeyBytes = 256, .maxValueBytes = 4096, .maxKeysPerRequest = 64,
                           .maxFrameBytes = 8192},
                 .maxUnsentReplyBytes = 1024,
                 .maxStoredBytes = 16384,
                 .maxKeys = 32,
                 .maxWaiters = 1}};
  if (token) options.authToken = "fuzz-token-0123456789";
  StoreServer server(io, options);
  const int fd = connectTo(server.port());
  if (fd < 0) return 0;
  bool open = true;
  while (!stream.empty() && open) {
    const size_t n = std::min(piece, stream.size());
    const ssize_t w = ::send(fd, stream.data(), n, MSG_NOSIGNAL);
    if (w > 0) stream.remove_prefix(static_cast<size_t>(w));
    io.poll();
    open = drain(fd);
    if (w < 0 && errno != EAGAIN) open = false;
  }
  // Hang up, and let the server see it (a paused connection sees it when its write fails).
  ::shutdown(fd, SHUT_WR);
  for (int i = 0; i < 1000 && open; ++i) {
    io.poll();
    open = drain(fd);
    if (open) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, 1);
    }
  }
  ::close(fd);
  for (int i = 0; i < 1000 && server.stats().connections > 0; ++i) {
    io.run_one_for(std::chrono::milliseconds(1));
  }
  const StoreServerStats st = server.stats();
  if (st.connections != 0 || st.waiters != 0) __builtin_trap();
  server.stop();
  io.poll();
  return 0;
}
