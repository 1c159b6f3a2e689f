// The etcd gateway's messages, without sockets: base64, range ends, request bodies as etcd
// wants them, and replies (as etcd 3.4 sends them, captured from a real member) parsed into
// typed structs; malformed replies are refused naming the message and the field.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "rendezvous/etcd/gateway.h"

using namespace ddprun;
using namespace ddprun::rendezvous::etcd;
using json = nlohmann::json;

TEST_CASE("base64 both ways, every length and byte", "[etcd][gateway]") {
  CHECK(base64Encode("") == "");
  CHECK(base64Encode("f") == "Zg==");
  CHECK(base64Encode("fo") == "Zm8=");
  CHECK(base64Encode("foo") == "Zm9v");
  CHECK(base64Encode("/ddprun/rdzv") == "L2RkcHJ1bi9yZHp2");
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 37) {
    const std::string s = all.substr(0, n);
    CHECK(base64Decode(base64Encode(s), "test") == s);
  }
  CHECK(base64Decode("Zm9v", "x") == "foo");
  CHECK(base64Decode("Zg==", "x") == "f");
  for (const char* bad : {"Zm9", "Z===", "Zm9v!", "Zg==Zg==", "=Zg="}) {
    INFO(bad);
    CHECK_THROWS_AS(base64Decode(bad, "range reply field 'key'"), ProtocolError);
  }
  CHECK_THROWS_WITH(base64Decode("@@@@", "range reply field 'key'"),
                    Catch::Contains("range reply field 'key'") && Catch::Contains("base64"));
}

TEST_CASE("prefix range ends", "[etcd][gateway]") {
  CHECK(prefixEnd("/ddprun/rdzv/job/") == "/ddprun/rdzv/job0");
  CHECK(prefixEnd("a") == "b");
  CHECK(prefixEnd(std::string("a\xff", 2)) == "b");
  CHECK(prefixEnd(std::string("\xff\xff", 2)) == std::string(1, '\0'));
}

TEST_CASE("request bodies: base64 keys, int64 as strings", "[etcd][gateway]") {
  CHECK(json::parse(encodePut({.key = "foo", .value = "bar", .lease = 42})) ==
        json::parse(R"({"key":"Zm9v","value":"YmFy","lease":"42"})"));
  CHECK(json::parse(encodePut({.key = "foo", .value = ""})) ==
        json::parse(R"({"key":"Zm9v","value":""})"));
  CHECK(json::parse(encodeRange({.key = "a/", .rangeEnd = "a0", .countOnly = true})) ==
        json::parse(R"({"key":"YS8=","range_end":"YTA=","count_only":true})"));
  CHECK(json::parse(encodeDelete({.key = "foo"})) == json::parse(R"({"key":"Zm9v"})"));
  CHECK(json::parse(encodeLeaseGrant(5)) == json::parse(R"({"TTL":"5"})"));
  CHECK(json::parse(encodeLeaseId(7587868)) == json::parse(R"({"ID":"7587868"})"));
  CHECK(json::parse(encodeWatchCreate({.key = "k", .rangeEnd = "l", .startRevision = 12})) ==
        json::parse(R"({"create_request":{"key":"aw==","range_end":"bA==","start_revision":"12"}})"));

  TxnRequest t;
  t.compare.push_back({.key = "k", .target = Compare::Target::Create, .number = 0});
  t.compare.push_back({.key = "k", .target = Compare::Target::Value, .value = "v"});
  t.compare.push_back({.key = "k", .target = Compare::Target::Mod,
                       .result = Compare::Result::Less, .number = 9});
  t.success.push_back(RequestOp::putOf({.key = "k", .value = "new"}));
  t.failure.push_back(RequestOp::rangeOf({.key = "k"}));
  t.failure.push_back(RequestOp::deleteOf({.key = "k"}));
  CHECK(json::parse(encodeTxn(t)) == json::parse(R"({
    "compare":[{"key":"aw==","target":"CREATE","result":"EQUAL","create_revision":"0"},
               {"key":"aw==","target":"VALUE","result":"EQUAL","value":"dg=="},
               {"key":"aw==","target":"MOD","result":"LESS","mod_revision":"9"}],
    "success":[{"request_put":{"key":"aw==","value":"bmV3"}}],
    "failure":[{"request_range":{"key":"aw=="}},{"request_delete_range":{"key":"aw=="}}]})"));
}

// Replies as etcd 3.4.23's gateway sent them (ids shortened).
TEST_CASE("replies: range, txn, put, lease, status", "[etcd][gateway]") {
  RangeReply r = parseRange(R"({"header":{"cluster_id":"1","member_id":"13668","revision":"2",
    "raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3",
    "version":"2","value":"YmFy","lease":"99"}],"count":"1"})");
  CHECK(r.header.revision == 2);
  CHECK(r.header.memberId == 13668u);
  REQUIRE(r.kvs.size() == 1);
  CHECK(r.kvs[0].key == "foo");
  CHECK(r.kvs[0].value == "bar");
  CHECK(r.kvs[0].createRevision == 2);
  CHECK(r.kvs[0].modRevision == 3);
  CHECK(r.kvs[0].lease == 99);
  CHECK(r.count == 1);
  // An absent key: no kvs, no count.
  RangeReply none = parseRange(R"({"header":{"revision":"5"}})");
  CHECK(none.kvs.empty());
  CHECK(none.count == 0);
  // An empty value is left out by the gateway.
  CHECK(parseRange(R"({"kvs":[{"key":"Zm9v","mod_revision":"3"}]})").kvs[0].value.empty());

  TxnReply lost = parseTxn(R"({"header":{"revision":"2"},"responses":[{"response_range":
    {"header":{"revision":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2",
    "version":"1","value":"YmFy"}],"count":"1"}}]})");
  CHECK_FALSE(lost.succeeded);
  REQUIRE(lost.responses.size() == 1);
  CHECK(lost.responses[0].range.kvs.at(0).value == "bar");
  TxnReply won = parseTxn(R"({"header":{"revision":"3"},"succeeded":true,
    "responses":[{"response_put":{"header":{"revision":"3"}}},
                 {"response_delete_range":{"header":{},"deleted":"2"}}]})");
  CHECK(won.succeeded);
  CHECK(won.responses.at(0).kind == RequestOp::Kind::Put);
  CHECK(won.responses.at(1).deleted == 2);

  CHECK(parsePut(R"({"header":{"revision":"7"}})").header.revision == 7);
  CHECK(parseDelete(R"({"header":{"revision":"8"},"deleted":"1"})").deleted == 1);
  LeaseReply g = parseLeaseGrant(R"({"header":{"revision":"2"},"ID":"4111120208382312969","TTL":"2"})");
  CHECK(g.id == 4111120208382312969);
  CHECK(g.ttl == 2);
  LeaseReply ka = parseLeaseKeepAlive(
      "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"41\",\"TTL\":\"3\"}}\n");
  CHECK(ka.id == 41);
  CHECK(ka.ttl == 3);
  // A lease that has expired: keepalive answers without a TTL.
  CHECK(parseLeaseKeepAlive(R"({"result":{"header":{"revision":"2"},"ID":"1"}})").ttl == 0);
  StatusReply s = parseStatus(R"({"header":{"member_id":"10228260893687292357"},
    "version":"3.4.23","leader":"10228260893687292357"})");
  CHECK(s.isLeader());
  CHECK(s.version == "3.4.23");
  CHECK_FALSE(parseStatus(R"({"header":{"member_id":"1"},"leader":"2"})").isLeader());
}

TEST_CASE("watch messages: created, events, delete by lease expiry, cancel", "[etcd][gateway]") {
  WatchMessage c = parseWatchMessage(R"({"result":{"header":{"revision":"5"},"created":true}})");
  CHECK(c.created);
  CHECK(c.header.revision == 5);
  CHECK(c.events.empty());
  // A stream message is one line.
  WatchMessage e = parseWatchMessage(
      R"({"result":{"header":{"revision":"5"},"events":[)"
      R"({"kv":{"key":"YS8x","create_revision":"3","mod_revision":"3","version":"1",)"
      R"("value":"eA==","lease":"411"}},)"
      R"({"type":"DELETE","kv":{"key":"YS8x","mod_revision":"5"},"prev_kv":{"key":"YS8x"}}]}})");
  REQUIRE(e.events.size() == 2);
  CHECK(e.events[0].type == Event::Type::Put);
  CHECK(e.events[0].kv.key == "a/1");
  CHECK(e.events[0].kv.value == "x");
  CHECK(e.events[1].type == Event::Type::Delete);
  CHECK(e.events[1].kv.modRevision == 5);
  WatchMessage x = parseWatchMessage(
      R"({"result":{"header":{"revision":"9"},"canceled":true,"compact_revision":"7",)"
      R"("cancel_reason":"mvcc: required revision has been compacted"}})");
  CHECK(x.canceled);
  CHECK(x.compactRevision == 7);
}

TEST_CASE("errors: unary and streamed forms", "[etcd][gateway]") {
  auto u = parseError(R"({"error":"etcdserver: requested lease not found",)"
                      R"("message":"etcdserver: requested lease not found","code":5})");
  REQUIRE(u);
  CHECK(u->code == 5);
  CHECK(u->message == "etcdserver: requested lease not found");
  auto s = parseError(R"({"error":{"grpc_code":14,"http_code":503,)"
                      R"("message":"etcdserver: no leader","http_status":"Service Unavailable"}})");
  REQUIRE(s);
  CHECK(s->code == 14);
  CHECK(s->message == "etcdserver: no leader");
  CHECK_FALSE(parseError(R"({"header":{"revision":"2"}})"));
  CHECK_FALSE(parseError("not json"));
}

TEST_CASE("malformed replies are refused naming the message and field", "[etcd][gateway]") {
  CHECK_THROWS_WITH(parseRange("<html>502</html>"),
                    Catch::Contains("range reply") && Catch::Contains("not JSON"));
  CHECK_THROWS_WITH(parseRange(R"({"header":{"revision":"x2"}})"),
                    Catch::Contains("'revision'") && Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(parseRange(R"({"kvs":{"key":"Zm9v"}})"), Catch::Contains("'kvs'"));
  CHECK_THROWS_WITH(parseRange(R"({"kvs":[{"key":"%%%%"}]})"), Catch::Contains("'key'"));
  CHECK_THROWS_WITH(parseTxn(R"({"succeeded":"yes"})"), Catch::Contains("'succeeded'"));
  CHECK_THROWS_WITH(parseTxn(R"({"responses":[{"response_frobnicate":{}}]})"),
                    Catch::Contains("unknown response"));
  CHECK_THROWS_WITH(parseWatchMessage(R"({"header":{}})"), Catch::Contains("'result'"));
  CHECK_THROWS_WITH(parseWatchMessage(R"({"result":{"events":[{"type":"BOOM","kv":{}}]}})"),
                    Catch::Contains("BOOM"));
  CHECK_THROWS_AS(parseRange("[1,2]"), ProtocolError);
}
