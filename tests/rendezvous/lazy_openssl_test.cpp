// OpenSSL loaded on first use (rendezvous/openssl/lazy_openssl.h): a process that uses neither
// a store token nor TLS never loads libcrypto; the first HMAC loads it, through the forwarders,
// and computes what OpenSSL computes (RFC 4231's first HMAC-SHA256 test case).
//
// The checks run in a fresh process (this binary again, running the hidden test below), as
// another test of this binary may already have loaded libcrypto.
#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <unistd.h>

#include <string>

#include "rendezvous/auth.h"
#include "rendezvous/openssl/lazy_openssl.h"
#include "tests/support/process.h"

namespace {

std::string hex(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += "0123456789abcdef"[p[i] >> 4];
    s += "0123456789abcdef"[p[i] & 15];
  }
  return s;
}

}  // namespace

TEST_CASE("lazy openssl: child", "[.lazy_openssl_child]") {
  using ddprun::rendezvous::openssl::cryptoLoaded;
#ifdef DDPRUN_LAZY_OPENSSL
  REQUIRE_FALSE(cryptoLoaded());  // nothing at the start of the process loaded it
#endif
  // RFC 4231, test case 1: key 0x0b x 20, data "Hi There".
  const std::string key(20, '\x0b');
  const std::string data = "Hi There";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  REQUIRE(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
               reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len) != nullptr);
  CHECK(hex(md, len) == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(cryptoLoaded());
  // The store's proofs go through the same forwarders.
  CHECK(ddprun::rendezvous::auth::hmac(key, {data}).size() == 32);
}

TEST_CASE("lazy openssl: libcrypto is loaded by the first HMAC, not at the start, and HMAC-SHA256 "
          "through the forwarders matches RFC 4231") {
  // This binary again, running only the child's case, in a process of its own.
  ddprun::testing::Process child({.argv = {"/proc/self/exe", "[lazy_openssl_child]"}});
  CHECK(child.wait() == 0);  // Catch's exit code: the child's failed assertions
}
