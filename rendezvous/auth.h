#pragma once
// Store authentication: mutual, channel-bound challenge-response with HMAC-SHA256, so the
// token never crosses the wire and neither side trusts the other before it has proven the token.
//
//   server -> client   HELLO reply: nonce Ns (32 random bytes)
//   client -> server   AUTH: nonce Nc (32 random bytes), proof(ClientToServer, Ns, Nc, channel)
//   server -> client   AUTH_OK + proof(ServerToClient, Ns, Nc, channel), or AUTH_REFUSED
//
// proof = HMAC-SHA256(token, kAuthContext, direction, Ns, Nc, channel), each part length-
// prefixed. Both nonces make every proof fresh (a recorded one is worthless); the direction
// keeps a proof from being reflected back as the other side's; the channel -- the store's
// socket address, as the client reached it (getpeername) and as the server accepted it
// (getsockname) -- makes a proof obtained through a relay fail at the real store, because the
// relay's address is not the store's. Hence a client must reach the store at the address it
// listens on: a NAT or port forward in between fails authentication, by design.
// Until a connection has proven the token it may only send VALIDATE, PING, HELLO and AUTH.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace ddprun::rendezvous::auth {

inline constexpr std::string_view kAuthContext = "ddprun-store-auth-v2";
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMinTokenBytes = 16;

enum class Direction : uint8_t { ClientToServer = 1, ServerToClient = 2 };

// 32 bytes from a cryptographic random source.
std::string randomNonce();
// 16 lower-case hex digits from a cryptographic random source (a store's instance id).
std::string randomId();
// HMAC-SHA256 under `key` over `parts`, each length-prefixed (u32), so that no two different
// lists give the same message: 32 raw bytes. The building block of proof() and of the workers'
// mesh handshake (worker_runtime/tcp_mesh.h).
std::string hmac(std::string_view key, std::initializer_list<std::string_view> parts);
// HMAC-SHA256 over the context, `dir`, both nonces and `channel`: 32 raw bytes.
std::string proof(std::string_view token, Direction dir, std::string_view serverNonce,
                  std::string_view clientNonce, std::string_view channel);
// The channel name of a store socket address: "IP:PORT", an IPv4-mapped IPv6 address written
// as IPv4, so that both ends name the same socket the same way.
std::string channelName(std::string ip, uint16_t port);
// Compares without an early exit, so timing reveals nothing about where they differ.
bool constantTimeEquals(std::string_view a, std::string_view b);
// Reads a token file: its contents without trailing whitespace. Throws ConfigError naming the
// file when it cannot be read, is readable by group or others (chmod 600), or holds fewer than
// kMinTokenBytes bytes.
std::string readTokenFile(const std::string& path);

}  // namespace ddprun::rendezvous::auth
