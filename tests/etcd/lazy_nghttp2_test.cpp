// libnghttp2 loaded on first use (rendezvous/etcd/grpc/lazy_nghttp2.h): a process that opens no
// etcd gRPC connection never loads it; the first call loads it, through the forwarders, and a
// client session made through them writes HTTP/2's connection preface and our SETTINGS frame.
//
// The checks run in a fresh process (this binary again, running the hidden test below), as
// another test of this binary may already have loaded the library.
#include <catch2/catch.hpp>

#include <nghttp2/nghttp2.h>
#include <unistd.h>

#include <string>

#include "rendezvous/etcd/grpc/lazy_nghttp2.h"
#include "tests/support/process.h"

TEST_CASE("etcd: lazy nghttp2 child", "[.lazy_nghttp2_child]") {
  using ddprun::rendezvous::etcd::grpc::nghttp2Loaded;
#ifndef DDPRUN_NGHTTP2_LINKED
  REQUIRE_FALSE(nghttp2Loaded());  // nothing at the start of the process loaded it
#endif
  nghttp2_session_callbacks* callbacks = nullptr;
  REQUIRE(nghttp2_session_callbacks_new(&callbacks) == 0);
  CHECK(nghttp2Loaded());
  nghttp2_session* session = nullptr;
  REQUIRE(nghttp2_session_client_new(&session, callbacks, nullptr) == 0);
  nghttp2_session_callbacks_del(callbacks);
  const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
  REQUIRE(nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings, 1) == 0);
  std::string out;
  const uint8_t* data = nullptr;
  for (ssize_t n; (n = nghttp2_session_mem_send(session, &data)) > 0;)
    out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  nghttp2_session_del(session);
  // The preface, then a SETTINGS frame (type 4) with our one setting (6 bytes).
  const std::string preface = NGHTTP2_CLIENT_MAGIC;
  REQUIRE(out.size() >= preface.size() + 9 + 6);
  CHECK(out.compare(0, preface.size(), preface) == 0);
  CHECK(static_cast<uint8_t>(out[preface.size() + 3]) == NGHTTP2_SETTINGS);
  CHECK(std::string(nghttp2_strerror(NGHTTP2_ERR_INVALID_ARGUMENT)) == "Invalid argument");
}

TEST_CASE("etcd: libnghttp2 is loaded by the first call through its forwarders, not at the "
          "start, and a client session made through them writes the connection preface") {
  // This binary again, running only the child's case, in a process of its own.
  ddprun::testing::Process child({.argv = {"/proc/self/exe", "[lazy_nghttp2_child]"}});
  CHECK(child.wait() == 0);  // Catch's exit code: the child's failed assertions
}
