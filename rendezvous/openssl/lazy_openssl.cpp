// The forwarders of lazy_openssl.h: one per OpenSSL function ddprun's code calls.
#include "rendezvous/openssl/lazy_openssl.h"

#include <dlfcn.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/opensslv.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cstdio>

namespace ddprun::rendezvous::openssl {
namespace {

#define DDPRUN_STR2(x) #x
#define DDPRUN_STR(x) DDPRUN_STR2(x)
// The sonames of the OpenSSL the headers are from (3: libssl.so.3), as the linker would record.
constexpr const char* kSsl = "libssl.so." DDPRUN_STR(OPENSSL_VERSION_MAJOR);
constexpr const char* kCrypto = "libcrypto.so." DDPRUN_STR(OPENSSL_VERSION_MAJOR);

[[noreturn]] void cannotLoad(const char* library, const char* function) {
  const char* why = ::dlerror();
  std::fprintf(stderr,
               "ddprun: cannot load %s for %s (%s): the OpenSSL 3 runtime is needed for store "
               "tokens and TLS (Debian: libssl3)\n",
               library, function, why ? why : "not found");
  std::fflush(stderr);
  ::_exit(127);
}

// Loaded once per process (libssl pulls libcrypto in as its dependency); never closed.
void* handle(const char* library, const char* function) {
  static void* const crypto = ::dlopen(kCrypto, RTLD_NOW | RTLD_LOCAL);
  if (library == kCrypto) {
    if (!crypto) cannotLoad(kCrypto, function);
    return crypto;
  }
  static void* const ssl = ::dlopen(kSsl, RTLD_NOW | RTLD_LOCAL);
  if (!ssl) cannotLoad(kSsl, function);
  return ssl;
}

}  // namespace

void* lookUp(const char* library, const char* function);
void* lookUp(const char* library, const char* function) {
  void* h = handle(library, function);
  ::dlerror();
  void* fn = ::dlsym(h, function);
  if (!fn) cannotLoad(library, function);
  return fn;
}

bool cryptoLoaded() {
  return ::dlopen(kCrypto, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) != nullptr;
}

}  // namespace ddprun::rendezvous::openssl

#ifndef DDPRUN_LINKED_OPENSSL  // -DDDPRUN_LAZY_OPENSSL=OFF: OpenSSL linked, no forwarders

// A forwarder: the function `name` of `library`, with OpenSSL's own parameter list (a mismatch
// with its header's declaration does not compile), looked up once (a thread-safe static).
#define DDPRUN_FORWARD(library, ret, name, params, args)                                       \
  extern "C" __attribute__((visibility("hidden"))) ret name params {                          \
    using Fn = ret(*) params;                                                                  \
    static const Fn fn = reinterpret_cast<Fn>(                                                 \
        ddprun::rendezvous::openssl::lookUp(ddprun::rendezvous::openssl::library, #name));    \
    return fn args;                                                                            \
  }

// libcrypto: the store token's HMAC (auth.cpp); BIO, errors and X.509 for Asio's TLS streams.
DDPRUN_FORWARD(kCrypto, unsigned char*, HMAC,
               (const EVP_MD* evp_md, const void* key, int key_len, const unsigned char* data,
                size_t data_len, unsigned char* md, unsigned int* md_len),
               (evp_md, key, key_len, data, data_len, md, md_len))
DDPRUN_FORWARD(kCrypto, const EVP_MD*, EVP_sha256, (void), ())
DDPRUN_FORWARD(kCrypto, long, BIO_ctrl, (BIO* bp, int cmd, long larg, void* parg),
               (bp, cmd, larg, parg))
DDPRUN_FORWARD(kCrypto, size_t, BIO_ctrl_pending, (BIO* b), (b))
DDPRUN_FORWARD(kCrypto, int, BIO_free, (BIO* a), (a))
DDPRUN_FORWARD(kCrypto, int, BIO_new_bio_pair,
               (BIO** bio1, size_t writebuf1, BIO** bio2, size_t writebuf2),
               (bio1, writebuf1, bio2, writebuf2))
DDPRUN_FORWARD(kCrypto, int, BIO_read, (BIO* b, void* data, int dlen), (b, data, dlen))
DDPRUN_FORWARD(kCrypto, int, BIO_write, (BIO* b, const void* data, int dlen), (b, data, dlen))
DDPRUN_FORWARD(kCrypto, void, CRYPTO_free, (void* ptr, const char* file, int line),
               (ptr, file, line))
DDPRUN_FORWARD(kCrypto, void, ERR_clear_error, (void), ())
DDPRUN_FORWARD(kCrypto, unsigned long, ERR_get_error, (void), ())
DDPRUN_FORWARD(kCrypto, const char*, ERR_reason_error_string, (unsigned long e), (e))
DDPRUN_FORWARD(kCrypto, X509*, X509_STORE_CTX_get_current_cert, (const X509_STORE_CTX* ctx),
               (ctx))
DDPRUN_FORWARD(kCrypto, int, X509_STORE_CTX_get_error_depth, (const X509_STORE_CTX* ctx),
               (ctx))
DDPRUN_FORWARD(kCrypto, void*, X509_STORE_CTX_get_ex_data, (const X509_STORE_CTX* ctx, int idx),
               (ctx, idx))
DDPRUN_FORWARD(kCrypto, int, X509_check_host,
               (X509* x, const char* chk, size_t chklen, unsigned int flags, char** peername),
               (x, chk, chklen, flags, peername))
DDPRUN_FORWARD(kCrypto, int, X509_check_ip_asc, (X509* x, const char* ipasc, unsigned int flags),
               (x, ipasc, flags))

// libssl: etcd over TLS (rendezvous/etcd/http_connection.cpp, through Asio's ssl::stream).
DDPRUN_FORWARD(kSsl, long, SSL_CTX_ctrl, (SSL_CTX* ctx, int cmd, long larg, void* parg),
               (ctx, cmd, larg, parg))
DDPRUN_FORWARD(kSsl, void, SSL_CTX_free, (SSL_CTX* ctx), (ctx))
DDPRUN_FORWARD(kSsl, void*, SSL_CTX_get_default_passwd_cb_userdata, (SSL_CTX* ctx), (ctx))
DDPRUN_FORWARD(kSsl, void*, SSL_CTX_get_ex_data, (const SSL_CTX* ssl, int idx), (ssl, idx))
DDPRUN_FORWARD(kSsl, SSL_verify_cb, SSL_CTX_get_verify_callback, (const SSL_CTX* ctx), (ctx))
DDPRUN_FORWARD(kSsl, int, SSL_CTX_load_verify_locations,
               (SSL_CTX* ctx, const char* CAfile, const char* CApath), (ctx, CAfile, CApath))
DDPRUN_FORWARD(kSsl, SSL_CTX*, SSL_CTX_new, (const SSL_METHOD* meth), (meth))
DDPRUN_FORWARD(kSsl, void, SSL_CTX_set_default_passwd_cb_userdata, (SSL_CTX* ctx, void* u),
               (ctx, u))
DDPRUN_FORWARD(kSsl, int, SSL_CTX_set_default_verify_paths, (SSL_CTX* ctx), (ctx))
DDPRUN_FORWARD(kSsl, int, SSL_CTX_set_ex_data, (SSL_CTX* ssl, int idx, void* data),
               (ssl, idx, data))
DDPRUN_FORWARD(kSsl, uint64_t, SSL_CTX_set_options, (SSL_CTX* ctx, uint64_t op), (ctx, op))
DDPRUN_FORWARD(kSsl, void, SSL_CTX_set_verify, (SSL_CTX* ctx, int mode, SSL_verify_cb callback),
               (ctx, mode, callback))
DDPRUN_FORWARD(kSsl, int, SSL_CTX_use_PrivateKey_file, (SSL_CTX* ctx, const char* file, int type),
               (ctx, file, type))
DDPRUN_FORWARD(kSsl, int, SSL_CTX_use_certificate_chain_file, (SSL_CTX* ctx, const char* file),
               (ctx, file))
DDPRUN_FORWARD(kSsl, int, SSL_accept, (SSL* ssl), (ssl))
DDPRUN_FORWARD(kSsl, int, SSL_connect, (SSL* ssl), (ssl))
DDPRUN_FORWARD(kSsl, long, SSL_ctrl, (SSL* ssl, int cmd, long larg, void* parg),
               (ssl, cmd, larg, parg))
DDPRUN_FORWARD(kSsl, void, SSL_free, (SSL* ssl), (ssl))
DDPRUN_FORWARD(kSsl, int, SSL_get_error, (const SSL* s, int ret_code), (s, ret_code))
DDPRUN_FORWARD(kSsl, void*, SSL_get_ex_data, (const SSL* ssl, int idx), (ssl, idx))
DDPRUN_FORWARD(kSsl, int, SSL_get_ex_data_X509_STORE_CTX_idx, (void), ())
DDPRUN_FORWARD(kSsl, int, SSL_get_shutdown, (const SSL* ssl), (ssl))
DDPRUN_FORWARD(kSsl, int, SSL_get_verify_mode, (const SSL* s), (s))
DDPRUN_FORWARD(kSsl, SSL*, SSL_new, (SSL_CTX* ctx), (ctx))
DDPRUN_FORWARD(kSsl, int, SSL_read, (SSL* ssl, void* buf, int num), (ssl, buf, num))
DDPRUN_FORWARD(kSsl, void, SSL_set_bio, (SSL* s, BIO* rbio, BIO* wbio), (s, rbio, wbio))
DDPRUN_FORWARD(kSsl, int, SSL_set_ex_data, (SSL* ssl, int idx, void* data), (ssl, idx, data))
DDPRUN_FORWARD(kSsl, void, SSL_set_verify, (SSL* s, int mode, SSL_verify_cb callback),
               (s, mode, callback))
DDPRUN_FORWARD(kSsl, int, SSL_write, (SSL* ssl, const void* buf, int num), (ssl, buf, num))
DDPRUN_FORWARD(kSsl, const SSL_METHOD*, TLS_client_method, (void), ())
DDPRUN_FORWARD(kSsl, const SSL_METHOD*, TLS_method, (void), ())
DDPRUN_FORWARD(kSsl, const SSL_METHOD*, TLS_server_method, (void), ())

#endif  // DDPRUN_LINKED_OPENSSL
