#include "rendezvous/auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/errors.h"

namespace ddprun::rendezvous::auth {

namespace {

// The kernel's CSPRNG (getrandom(2), blocking only until the pool is first seeded), not
// OpenSSL's RAND_bytes: that one initialises OpenSSL -- reading openssl.cnf and setting up its
// DRBG, about 2 MiB of RSS and a millisecond -- in every launcher and worker, token or not.
void fillRandom(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    DDPRUN_CHECK(got > 0, std::string("getrandom failed: ") + std::strerror(errno));
    p += got;
    n -= static_cast<size_t>(got);
  }
}

}  // namespace

std::string randomNonce() {
  std::string n(kNonceBytes, '\0');
  fillRandom(n.data(), n.size());
  return n;
}

std::string randomId() {
  unsigned char b[8];
  fillRandom(b, sizeof b);
  std::string s;
  for (unsigned char c : b) {
    s += "0123456789abcdef"[c >> 4];
    s += "0123456789abcdef"[c & 15];
  }
  return s;
}

std::string hmac(std::string_view key, std::initializer_list<std::string_view> parts) {
  std::string msg;
  for (std::string_view p : parts) {
    const uint32_t n = static_cast<uint32_t>(p.size());
    msg.append(reinterpret_cast<const char*>(&n), sizeof n).append(p);
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  DDPRUN_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                    reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out,
                    &len) != nullptr,
               "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string proof(std::string_view token, Direction dir, std::string_view serverNonce,
                  std::string_view clientNonce, std::string_view channel) {
  return hmac(token, {kAuthContext,
                      dir == Direction::ClientToServer ? "client->server" : "server->client",
                      serverNonce, clientNonce, channel});
}

std::string channelName(std::string ip, uint16_t port) {
  constexpr std::string_view kMapped = "::ffff:";
  if (ip.rfind(kMapped, 0) == 0 && ip.find('.') != std::string::npos) ip.erase(0, kMapped.size());
  return ip + ":" + std::to_string(port);
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string readTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError("cannot read the store token file '" + path + "': " + std::strerror(errno));
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    throw ConfigError("cannot read the store token file '" + path + "': " + std::strerror(errno));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw ConfigError("the store token file '" + path + "' has mode " + mode +
                      ": group or others may read it; run `chmod 600 " + path + "`");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ' ||
                        t.back() == '\t'))
    t.pop_back();
  if (t.empty()) throw ConfigError("the store token file '" + path + "' is empty");
  if (t.size() < kMinTokenBytes) {
    throw ConfigError("the store token in '" + path + "' has " + std::to_string(t.size()) +
                      " bytes: a token needs at least " + std::to_string(kMinTokenBytes) +
                      " (e.g. `head -c 32 /dev/urandom | base64 > " + path + "`)");
  }
  return t;
}

}  // namespace ddprun::rendezvous::auth
