// rendezvous/etcd/grpc/ without etcd: the protobuf codec of the etcdserverpb messages (bytes
// written by hand from rpc.proto's field numbers), gRPC's message framing, what malformed
// replies do (ProtocolError naming the message and the field), and the HTTP/2 connection
// against a loopback server that does not speak HTTP/2 or closes the connection.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "rendezvous/etcd/grpc/connection.h"
#include "rendezvous/etcd/grpc/proto.h"

using namespace ddprun;
using namespace ddprun::rendezvous::etcd;
namespace g = ddprun::rendezvous::etcd::grpc;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

// A field of wire type 2.
std::string ld(int field, const std::string& v) {
  g::Writer w;
  w.message(static_cast<uint32_t>(field), v);
  return w.take();
}
std::string vi(int field, uint64_t v) {
  g::Writer w;
  w.varintAlways(static_cast<uint32_t>(field), v);
  return w.take();
}

template <typename Fn>
std::string errorOf(Fn fn) {
  try {
    fn();
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("etcd grpc: requests are the protobuf bytes of rpc.proto", "[etcd][grpc]") {
  // PutRequest: key = 1, value = 2, lease = 3.
  CHECK(g::encodePut({.key = "foo", .value = "bar"}) == bytes({0x0a, 3, 'f', 'o', 'o', 0x12, 3, 'b', 'a', 'r'}));
  CHECK(g::encodePut({.key = "k", .value = "", .lease = 300}) == bytes({0x0a, 1, 'k', 0x18, 0xac, 0x02}));
  // RangeRequest: key 1, range_end 2, limit 3, keys_only 8, count_only 9, max_create_revision 13.
  CHECK(g::encodeRange({.key = "a", .rangeEnd = "b", .countOnly = true, .limit = 0,
                        .keysOnly = true, .maxCreateRevision = 7}) ==
        bytes({0x0a, 1, 'a', 0x12, 1, 'b', 0x40, 1, 0x48, 1, 0x68, 7}));
  // A negative int64 is ten bytes (two's complement), as protobuf writes it.
  CHECK(g::encodeLeaseId(-1).size() == 11);
  // Txn: a compare of mod_revision 0 (the key is absent) keeps its zero: target MOD = 2 and
  // mod_revision (field 6) = 0 must both reach etcd.
  TxnRequest t;
  t.compare.push_back({.key = "k", .target = Compare::Target::Mod, .result = Compare::Result::Equal});
  t.success.push_back(RequestOp::putOf({.key = "k", .value = "v"}));
  t.failure.push_back(RequestOp::rangeOf({.key = "k"}));
  const std::string compare = bytes({0x10, 2, 0x1a, 1, 'k', 0x30, 0});
  const std::string put = ld(2, bytes({0x0a, 1, 'k', 0x12, 1, 'v'}));
  const std::string range = ld(1, bytes({0x0a, 1, 'k'}));
  CHECK(g::encodeTxn(t) == ld(1, compare) + ld(2, put) + ld(3, range));
  // A value compare, NOT_EQUAL (3), target VALUE (3), value = 7.
  TxnRequest v;
  v.compare.push_back({.key = "k", .target = Compare::Target::Value,
                       .result = Compare::Result::NotEqual, .value = "x"});
  CHECK(g::encodeTxn(v) == ld(1, bytes({0x08, 3, 0x10, 3, 0x1a, 1, 'k', 0x3a, 1, 'x'})));
  // WatchRequest.create_request (1): key 1, range_end 2, start_revision 3; cancel_request (2).
  CHECK(g::encodeWatchCreate({.key = "a", .rangeEnd = "b", .startRevision = 5}) ==
        ld(1, bytes({0x0a, 1, 'a', 0x12, 1, 'b', 0x18, 5})));
  CHECK(g::encodeWatchCancel(3) == ld(2, bytes({0x08, 3})));
  CHECK(g::encodeLeaseGrant(10) == bytes({0x08, 10}));
}

TEST_CASE("etcd grpc: replies decode, unknown fields skipped", "[etcd][grpc]") {
  const std::string header = ld(1, vi(1, 99) + vi(2, 7) + vi(3, 42) + vi(4, 3));
  const std::string kv = ld(1, "key") + vi(2, 10) + vi(3, 11) + vi(4, 2) + ld(5, "value") + vi(6, 5);
  // Unknown fields of every wire type: varint 20, fixed64 21, length-delimited 22, fixed32 23.
  const std::string unknown = vi(20, 1) + bytes({0xa9, 0x01, 1, 2, 3, 4, 5, 6, 7, 8}) +
                              ld(22, "zz") + bytes({0xbd, 0x01, 1, 2, 3, 4});
  const RangeReply r = g::decodeRange(header + ld(2, kv) + unknown + ld(2, kv) + vi(4, 2));
  CHECK(r.header.revision == 42);
  CHECK(r.header.memberId == 7);
  CHECK(r.count == 2);
  REQUIRE(r.kvs.size() == 2);
  CHECK(r.kvs[0].key == "key");
  CHECK(r.kvs[0].value == "value");
  CHECK(r.kvs[0].createRevision == 10);
  CHECK(r.kvs[0].modRevision == 11);
  CHECK(r.kvs[0].version == 2);
  CHECK(r.kvs[0].lease == 5);
  CHECK(g::decodeRange("").kvs.empty());  // every field absent: zeros

  // TxnResponse: succeeded 2, responses 3 (response_range 1, response_put 2, delete 3).
  const TxnReply t = g::decodeTxn(header + vi(2, 0) + ld(3, ld(1, ld(2, kv) + vi(4, 1))) +
                                  ld(3, ld(2, header)) + ld(3, ld(3, vi(2, 4))));
  CHECK_FALSE(t.succeeded);
  REQUIRE(t.responses.size() == 3);
  CHECK(t.responses[0].kind == RequestOp::Kind::Range);
  CHECK(t.responses[0].range.kvs.at(0).value == "value");
  CHECK(t.responses[1].kind == RequestOp::Kind::Put);
  CHECK(t.responses[2].deleted == 4);

  // WatchResponse: watch_id 2, created 3, canceled 4, compact_revision 5, cancel_reason 6,
  // events 11 (type 1: PUT 0 / DELETE 1, kv 2).
  const WatchMessage w = g::decodeWatch(header + vi(2, 9) + vi(3, 1) +
                                        ld(11, ld(2, kv)) + ld(11, vi(1, 1) + ld(2, kv)));
  CHECK(w.watchId == 9);
  CHECK(w.created);
  REQUIRE(w.events.size() == 2);
  CHECK(w.events[0].type == Event::Type::Put);
  CHECK(w.events[1].type == Event::Type::Delete);
  CHECK(w.events[1].kv.modRevision == 11);
  const WatchMessage c = g::decodeWatch(vi(4, 1) + vi(5, 17) + ld(6, "compacted"));
  CHECK(c.canceled);
  CHECK(c.compactRevision == 17);
  CHECK(c.cancelReason == "compacted");

  const LeaseReply l = g::decodeLeaseGrant(header + vi(2, 123) + vi(3, 10));
  CHECK(l.id == 123);
  CHECK(l.ttl == 10);
  CHECK(g::decodeLeaseKeepAlive(vi(2, 123)).ttl == 0);  // the lease is gone
  const StatusReply s = g::decodeStatus(header + ld(2, "3.4.23") + vi(4, 7));
  CHECK(s.isLeader());
  CHECK(s.version == "3.4.23");
}

TEST_CASE("etcd grpc: malformed replies name the message and the field", "[etcd][grpc]") {
  // A truncated varint: the tag says field 4 (count), varint, and the value never ends.
  CHECK_THAT(errorOf([] { g::decodeRange(bytes({0x20, 0x80})); }),
             Catch::Contains("RangeResponse: count: truncated varint"));
  // A length past the end.
  CHECK_THAT(errorOf([] { g::decodeRange(bytes({0x12, 50, 'x'})); }),
             Catch::Contains("RangeResponse: kvs: length 50 runs past the end (1 bytes left)"));
  // Inside a nested message: the path names it.
  CHECK_THAT(errorOf([] { g::decodeRange(ld(2, bytes({0x0a, 9, 'k'}))); }),
             Catch::Contains("RangeResponse.kvs: key: length 9"));
  // A field of the wrong wire type.
  CHECK_THAT(errorOf([] { g::decodeRange(ld(4, "2")); }),
             Catch::Contains("count (field 4) has wire type 2, expected 0"));
  // Groups, and wire types that do not exist.
  CHECK_THAT(errorOf([] { g::decodeTxn(bytes({0x0b})); }), Catch::Contains("is a group"));
  CHECK_THAT(errorOf([] { g::decodeTxn(bytes({0x0e})); }), Catch::Contains("wire type 6"));
  CHECK_THAT(errorOf([] { g::decodeTxn(bytes({0x00})); }), Catch::Contains("field number 0"));
  // A varint longer than 64 bits.
  CHECK_THAT(errorOf([] { g::decodeLeaseGrant(bytes({0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})); }),
             Catch::Contains("varint longer than 64 bits"));
  // Truncated fixed-size unknown fields.
  CHECK_THAT(errorOf([] { g::decodePut(bytes({0xa9, 0x01, 1, 2})); }),
             Catch::Contains("unknown field 21: truncated fixed-size value"));
  // Semantics: an empty txn response op, a bad event type, a lease grant's error, no lease.
  CHECK_THAT(errorOf([] { g::decodeTxn(ld(3, "")); }),
             Catch::Contains("TxnResponse.responses[0]: none of"));
  CHECK_THAT(errorOf([] { g::decodeWatch(ld(11, vi(1, 5) + ld(2, ""))); }),
             Catch::Contains("WatchResponse.events.type is 5"));
  CHECK_THAT(errorOf([] { g::decodeWatch(ld(11, vi(1, 1))); }),
             Catch::Contains("WatchResponse.events.kv is missing"));
  CHECK_THAT(errorOf([] { g::decodeLeaseGrant(vi(2, 1) + ld(4, "too many leases")); }),
             Catch::Contains("LeaseGrantResponse.error: too many leases"));
  CHECK_THAT(errorOf([] { g::decodeLeaseGrant(""); }), Catch::Contains("LeaseGrantResponse.ID is missing"));
}

TEST_CASE("etcd grpc: message framing, split anywhere, bounded", "[etcd][grpc]") {
  const std::string a = g::frame("hello"), b = g::frame(""), c = g::frame(std::string(70'000, 'x'));
  CHECK(a == bytes({0, 0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o'}));
  const std::string all = a + b + c;
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{4096}, all.size()}) {
    g::MessageReader r("/etcdserverpb.KV/Range", 1 << 20);
    std::vector<std::string> got;
    for (size_t i = 0; i < all.size(); i += chunk) {
      r.append(std::string_view(all).substr(i, chunk));
      while (auto m = r.next()) got.push_back(*m);
    }
    REQUIRE(got.size() == 3);
    CHECK(got[0] == "hello");
    CHECK(got[1].empty());
    CHECK(got[2].size() == 70'000);
    CHECK(r.pending() == 0);
  }
  g::MessageReader compressed("/etcdserverpb.Watch/Watch", 100);
  compressed.append(bytes({1, 0, 0, 0, 1, 'x'}));
  CHECK_THAT(errorOf([&] { compressed.next(); }),
             Catch::Contains("/etcdserverpb.Watch/Watch: a message with compression flag 1"));
  // A length above the bound is refused from its 5-byte prefix: nothing of it is held.
  g::MessageReader big("/etcdserverpb.KV/Range", 100);
  big.append(bytes({0, 0x7f, 0xff, 0xff, 0xff}));
  CHECK_THAT(errorOf([&] { big.next(); }),
             Catch::Contains("a message of 2147483647 bytes (at most 100 accepted)"));
}

namespace {

// A loopback TCP server that answers one connection with `reply`, then reads until the client
// closes (up to 5 s) and closes it; with no reply it closes at once. (Closing right after the
// reply raced the client's own sends: it could fail with "Broken pipe" before it read the reply.)
class FakeMember {
 public:
  explicit FakeMember(std::string reply) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 4);
    thread_ = std::thread([this, reply] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      (void)::recv(c, buf, sizeof buf, 0);  // the preface and the first request, or some
      if (!reply.empty()) {
        (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        timeval bound{.tv_sec = 5, .tv_usec = 0};
        ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
        while (::recv(c, buf, sizeof buf, 0) > 0) {
        }
      }
      ::shutdown(c, SHUT_RDWR);
      ::close(c);
    });
  }
  ~FakeMember() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

std::string failureOf(uint16_t port) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto conn = g::Connection::open({.host = "127.0.0.1", .port = port}, deadline);
  auto call = conn->start("/etcdserverpb.KV/Range", g::encodeRange({.key = "k"}), true, 1 << 20);
  try {
    call->finish(deadline);
  } catch (const g::Failure& f) {
    CHECK(f.maybeSent());
    CHECK_FALSE(conn->usable());
    return f.what();
  }
  return "(no failure)";
}

}  // namespace

TEST_CASE("etcd grpc: a member that does not speak HTTP/2 or hangs up fails the call", "[etcd][grpc]") {
  SECTION("an HTTP/1.1 answer") {
    FakeMember m("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    const std::string what = failureOf(m.port());
    CHECK_THAT(what, Catch::Contains("etcd member 127.0.0.1:" + std::to_string(m.port()) +
                                     ": /etcdserverpb.KV/Range: the member answered in "
                                     "HTTP/1.x, not HTTP/2 ('HTTP/1.1 400 Bad Request')"));
  }
  SECTION("a malformed HTTP/2 frame") {
    // A SETTINGS frame (type 4) of 5 bytes: settings come in 6-byte entries.
    FakeMember m(std::string("\0\0\5\4\0\0\0\0\0\1\2\3\4\5", 14));
    CHECK_THAT(failureOf(m.port()), Catch::Contains("/etcdserverpb.KV/Range: HTTP/2: "));
  }
  SECTION("the connection closed without an answer") {
    FakeMember m("");
    CHECK_THAT(failureOf(m.port()), Catch::Contains("/etcdserverpb.KV/Range: the member closed the connection"));
  }
  SECTION("nobody listens") {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    const uint16_t port = ntohs(a.sin_port);  // bound, not listening: refused
    try {
      g::Connection::open({.host = "127.0.0.1", .port = port},
                          std::chrono::steady_clock::now() + std::chrono::seconds(5));
      FAIL("connected to a port nobody listens on");
    } catch (const g::Failure& f) {
      CHECK_FALSE(f.maybeSent());
      CHECK_THAT(f.what(), Catch::Contains("etcd member 127.0.0.1:" + std::to_string(port) +
                                           ": connect failed: Connection refused"));
    }
    ::close(fd);
  }
}
