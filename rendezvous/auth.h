#pragma once
// Store authentication: challenge-response with HMAC-SHA256, so the token never crosses
// the wire. The server sends a fresh random nonce in its HELLO reply; the client answers
// with AUTH proof = HMAC-SHA256(token, kAuthContext || nonce). Until a connection has
// proven the token it may only send VALIDATE, PING, HELLO and AUTH.
#include <string>
#include <string_view>

namespace ddprun::rendezvous::auth {

inline constexpr std::string_view kAuthContext = "ddprun-store-auth-v1:";
inline constexpr size_t kNonceBytes = 32;

// 32 bytes from a cryptographic random source.
std::string randomNonce();
// HMAC-SHA256(token, kAuthContext || nonce), 32 raw bytes.
std::string proof(std::string_view token, std::string_view nonce);
// Compares without an early exit, so timing reveals nothing about where they differ.
bool constantTimeEquals(std::string_view a, std::string_view b);
// Reads a token file: its contents without trailing whitespace. Throws ConfigError naming the
// file when it cannot be read or is empty.
std::string readTokenFile(const std::string& path);

}  // namespace ddprun::rendezvous::auth
