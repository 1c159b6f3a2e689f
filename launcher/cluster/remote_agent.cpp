#include "launcher/cluster/remote_agent.h"

#include <poll.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>

#include "base/errors.h"
#include "base/log.h"
#include "launcher/cluster/remote_protocol.h"
#include "launcher/worker_group.h"

namespace ddprun::launcher::cluster {

namespace asio = boost::asio;

std::pair<Environment, std::string> readEnvBlock(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  EnvBlockDecoder decoder;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) throw TimeoutError("--remote-agent: no environment on stdin within 30 s");
    struct pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno != EINTR) throw Error(std::string("--remote-agent: poll: ") + std::strerror(errno));
    if (n <= 0) continue;
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) throw ProtocolError("--remote-agent: stdin ended before the environment block");
    if (decoder.feed(std::string_view(buf, static_cast<size_t>(got))))
      return {decoder.environment(), decoder.rest()};
  }
}

void RemoteAgentLink::attach(asio::io_context& io, std::function<void(int)> deliver,
                             uint16_t hostedStorePort) {
  deliver_ = std::move(deliver);
  auto record = [](const Record& r) { writeFully(STDERR_FILENO, formatRecord(r) + "\n"); };
  record(Record{.kind = Record::Kind::Started});
  if (hostedStorePort != 0) record(Record{.kind = Record::Kind::Store, .port = hostedStorePort});
  stdin_ = std::make_unique<asio::posix::stream_descriptor>(io, ::dup(STDIN_FILENO));
  std::string first = std::move(pending_);
  asio::post(io, [this, first] {
    onBytes(first);
    read();
  });
}

void RemoteAgentLink::read() {
  stdin_->async_read_some(asio::buffer(buf_), [this](boost::system::error_code ec, size_t n) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // EOF (or a broken connection): the launching ddprun is gone. Act as on a hangup, once.
      DDPRUN_LOG(WARN, "launcher") << "the launching ddprun is gone (its ssh session closed): "
                                      "stopping as on SIGHUP";
      deliver_(SIGHUP);
      return;
    }
    onBytes(std::string_view(buf_, n));
    read();
  });
}

void RemoteAgentLink::onBytes(std::string_view bytes) {
  std::vector<std::string> lines;
  lines_.feed(bytes, lines);
  for (const auto& line : lines) {
    if (auto sig = parseCommand(line)) {
      deliver_(*sig);
    } else {
      DDPRUN_LOG(WARN, "launcher") << "--remote-agent: ignoring an unknown command on stdin";
    }
  }
}

void RemoteAgentLink::rootCause(const WorkerResult& worker, int exitCode) {
  writeFully(STDERR_FILENO, formatRecord(Record{.kind = Record::Kind::RootCause,
                                                .rank = worker.globalRank,
                                                .code = exitCode,
                                                .text = worker.describe()}) +
                                "\n");
}

std::string RemoteAgentLink::linePrefix(int nodeRank, int rank, int /*localRank*/) {
  return "[node " + std::to_string(nodeRank) + " rank " + std::to_string(rank) + "]: ";
}

}  // namespace ddprun::launcher::cluster
