#include "rendezvous/auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/errors.h"

namespace ddprun::rendezvous::auth {

std::string randomNonce() {
  std::string n(kNonceBytes, '\0');
  DDPRUN_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(n.data()),
                          static_cast<int>(n.size())) == 1,
               "RAND_bytes failed");
  return n;
}

std::string proof(std::string_view token, std::string_view nonce) {
  std::string msg;
  msg.reserve(kAuthContext.size() + nonce.size());
  msg.append(kAuthContext).append(nonce);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  DDPRUN_CHECK(HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
                    reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out,
                    &len) != nullptr,
               "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char*>(out), len);
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
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ' ||
                        t.back() == '\t'))
    t.pop_back();
  if (t.empty()) throw ConfigError("the store token file '" + path + "' is empty");
  return t;
}

}  // namespace ddprun::rendezvous::auth
