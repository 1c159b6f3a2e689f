// ddprun-store: a standalone TCPStore-compatible key-value server.
//
//   ddprun-store --port 29400 [--host 0.0.0.0] [--auth-token-file FILE] [--max-connections N]
//                [--max-waiters N] [--max-keys N] [--max-stored-bytes SIZE] [--max-value-bytes SIZE]
//                [--max-frame-bytes SIZE] [--max-unsent-reply-bytes SIZE]
//                [--handshake-timeout S] [--frame-timeout S] [--idle-timeout S]
//
// The limits are rendezvous/store_limits.h's (docs/protocol.md "Limits").
// With --port 0 a free port is chosen. The first line on stdout is always
// "ddprun-store listening on HOST:PORT", so scripts can read the port. SIGINT or SIGTERM
// stops it cleanly.
#include <utility>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/auth.h"
#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/store_server.h"

int main(int argc, char** argv) {
  using namespace ddprun;
  CLI::App app{"ddprun-store: a TCPStore-compatible key-value store for ddprun and PyTorch"};
  int port = 0;
  std::string host = "0.0.0.0";
  std::string tokenFile;
  app.add_option("--port", port, "TCP port to listen on (0 picks a free port)")
      ->required()
      ->check(CLI::Range(0, 65535));
  app.add_option("--host", host, "address to bind (default 0.0.0.0; '::' for IPv6 too)");
  app.add_option("--auth-token-file", tokenFile,
                 "require clients to prove this token (HMAC-SHA256 challenge-response)");
  // Every limit of ServerLimits, as --max-connections etc.; applied after parsing so that a bad
  // value gets setStoreLimit's message naming the flag.
  const rendezvous::ServerLimits defaults;
  const std::vector<std::pair<std::string, std::string>> limitHelp{
      {"max_connections", "open connections (default " + std::to_string(defaults.maxConnections) + ")"},
      {"max_waiters", "connections holding a WAIT (default " + std::to_string(defaults.maxWaiters) + ")"},
      {"max_keys", "stored keys and queues (default " + std::to_string(defaults.maxKeys) + ")"},
      {"max_stored_bytes", "bytes of stored keys and values (default 2G)"},
      {"max_value_bytes", "one value, and one MULTI_GET reply (default 64M)"},
      {"max_frame_bytes", "one request frame (default 65M)"},
      {"max_unsent_reply_bytes", "unread replies of one connection before it is no longer read (default 4M)"},
      {"handshake_timeout", "seconds to authenticate, with a token (default 5)"},
      {"frame_timeout", "seconds for a started frame to arrive whole, 0: none (default 30)"},
      {"idle_timeout", "seconds without a request (never during a WAIT), 0: none (default 0)"},
  };
  std::vector<std::pair<std::string, std::string>> limitValues(limitHelp.size());
  for (size_t i = 0; i < limitHelp.size(); ++i) {
    std::string flag = "--" + limitHelp[i].first;
    for (char& c : flag)
      if (c == '_') c = '-';
    limitValues[i].first = flag;
    app.add_option(flag, limitValues[i].second, limitHelp[i].second);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit with 2, like every ddprun tool.
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    rendezvous::StoreServerOptions options{.host = host, .port = static_cast<uint16_t>(port)};
    for (size_t i = 0; i < limitHelp.size(); ++i) {
      if (!limitValues[i].second.empty()) {
        rendezvous::setStoreLimit(options.limits, limitHelp[i].first, limitValues[i].second,
                                  limitValues[i].first);
      }
    }
    if (!tokenFile.empty()) options.authToken = rendezvous::auth::readTokenFile(tokenFile);
    const uint64_t fdLimit = rendezvous::raiseFileLimit();

    boost::asio::io_context io(1);
    rendezvous::StoreServer server(io, options);
    std::cout << "ddprun-store listening on " << host << ":" << server.port() << std::endl;
    DDPRUN_LOG(INFO, "store") << "serving on " << host << ":" << server.port()
                              << (options.authToken ? " with authentication" : "")
                              << "; up to " << options.limits.maxConnections << " connections, "
                              << fdLimit << " open descriptors";

    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      DDPRUN_LOG(INFO, "store") << "signal " << sig << ": stopping";
      server.stop();
      io.stop();
    });
    io.run();
    return 0;
  } catch (const ConfigError& e) {
    std::cerr << "ddprun-store: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun-store: " << e.what() << "\n";
    return 1;
  }
}
