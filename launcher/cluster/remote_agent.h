#pragma once
// The remote side of an ssh launch: `ddprun --remote-agent FLAGS PROGRAM ARGS` started by
// another ddprun over ssh (ssh_launch.h). It is the ordinary agent plus this link:
//   - before parsing its flags it reads the environment block from stdin (the exported
//     variables travel there, never on the command line: readEnvBlock);
//   - afterwards stdin carries commands ("signal N": act as if signal N arrived); EOF means
//     the launching ddprun or its connection is gone: the agent acts as on SIGHUP (forward it,
//     SIGKILL after --shutdown-timeout, leave the rendezvous), so nothing outlives the launch;
//   - it tells the launcher, by records on stderr (remote_protocol.h), that it started, which
//     port its hosted store got, and when one of its workers is the job's root cause;
//   - every worker line is prefixed "[node N rank R]: ".
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>
#include <string>
#include <utility>

#include "launcher/agent.h"
#include "launcher/output.h"

namespace ddprun::launcher::cluster {

inline constexpr const char* kRemoteAgentFlag = "--remote-agent";

// Reads the environment block from `fd` (blocking, at most 30 s). Returns it and the bytes
// read after it. Throws ProtocolError (malformed, or EOF first) or TimeoutError.
std::pair<Environment, std::string> readEnvBlock(int fd);

class RemoteAgentLink final : public AgentLink {
 public:
  // `pending`: bytes of stdin already read after the environment block.
  explicit RemoteAgentLink(std::string pending) : pending_(std::move(pending)) {}
  void attach(boost::asio::io_context& io, std::function<void(int)> deliver,
              uint16_t hostedStorePort) override;
  void rootCause(const WorkerResult& worker, int exitCode) override;
  std::string linePrefix(int nodeRank, int rank, int localRank) override;

 private:
  void read();
  void onBytes(std::string_view bytes);

  std::string pending_;
  std::function<void(int)> deliver_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> stdin_;
  LineBuffer lines_{4096};
  char buf_[4096];
};

}  // namespace ddprun::launcher::cluster
