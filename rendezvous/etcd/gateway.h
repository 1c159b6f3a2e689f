#pragma once
// The etcd v3 JSON gateway's messages, declared once: typed requests and replies, the
// encoders that turn requests into the JSON bodies etcd wants, and pure parsers that turn
// reply bodies into typed structs (no sockets here; tests feed them bytes).
//
// What the gateway (grpc-gateway in front of etcd's gRPC API, served under /v3/ by etcd 3.4)
// requires, and what these functions take care of:
//   - every RPC is a POST of one JSON object to /v3/<service>/<method>;
//   - keys and values are base64 ("foo" travels as "Zm9v");
//   - int64 fields travel as JSON strings ("revision":"12"), absent fields mean 0/false/"";
//   - an error is an object with "code" (a gRPC status code) and "message"; inside a stream
//     it is {"error":{"grpc_code":..,"message":..}};
//   - streamed replies (watch, lease keepalive) are one JSON object per line, each wrapped as
//     {"result":{...}}.
// Parsers throw ProtocolError naming the message and the field when a reply is not what etcd
// sends; they never trust a field's type.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::rendezvous::etcd {

std::string base64Encode(const std::string& bytes);
// Throws ProtocolError naming `what` when `text` is not base64.
std::string base64Decode(const std::string& text, const std::string& what);
// The range end that selects every key starting with `prefix` (etcd's "prefix + 1").
std::string prefixEnd(const std::string& prefix);

// Every reply's header.
struct Header {
  int64_t revision = 0;  // the store's revision when the request was served
  uint64_t memberId = 0;
  int64_t raftTerm = 0;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t createRevision = 0;
  int64_t modRevision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// ---- Requests ----

struct RangeRequest {
  std::string key;
  std::string rangeEnd;  // empty: just `key`
  bool countOnly = false;
  int64_t limit = 0;
  bool keysOnly = false;          // kvs without their values
  int64_t maxCreateRevision = 0;  // > 0: only keys created at or before this revision (etcd
                                  // filters the kvs, not `count`: use with kvs, not countOnly)
};

struct PutRequest {
  std::string key;
  std::string value;
  int64_t lease = 0;  // 0: no lease
};

struct DeleteRequest {
  std::string key;
  std::string rangeEnd;
};

// One condition of a transaction: `target` of `key` compared with a value.
struct Compare {
  enum class Target { Value, Mod, Create, Version };
  enum class Result { Equal, NotEqual, Greater, Less };
  std::string key;
  Target target = Target::Value;
  Result result = Result::Equal;
  std::string value;    // Target::Value
  int64_t number = 0;   // Mod, Create (0: the key is absent), Version
};

struct RequestOp {
  enum class Kind { Range, Put, Delete };
  Kind kind = Kind::Range;
  RangeRequest range;
  PutRequest put;
  DeleteRequest del;
  static RequestOp rangeOf(RangeRequest r) { return {Kind::Range, std::move(r), {}, {}}; }
  static RequestOp putOf(PutRequest p) { return {Kind::Put, {}, std::move(p), {}}; }
  static RequestOp deleteOf(DeleteRequest d) { return {Kind::Delete, {}, {}, std::move(d)}; }
};

struct TxnRequest {
  std::vector<Compare> compare;
  std::vector<RequestOp> success;
  std::vector<RequestOp> failure;
};

struct WatchCreate {
  std::string key;
  std::string rangeEnd;
  int64_t startRevision = 0;  // 0: from now
  bool prevKv = false;
};

std::string encodeRange(const RangeRequest& r);
std::string encodePut(const PutRequest& p);
std::string encodeDelete(const DeleteRequest& d);
std::string encodeTxn(const TxnRequest& t);
std::string encodeWatchCreate(const WatchCreate& w);
std::string encodeLeaseGrant(int64_t ttlSeconds);
std::string encodeLeaseId(int64_t id);  // keepalive, revoke

// ---- Replies ----

// An error reply: a gRPC status code (14 = Unavailable: no leader, leader changed, request
// timed out -- worth retrying on another member) and etcd's message.
struct GatewayError {
  int code = 0;
  std::string message;
};
// The error a body carries, if any (unary or streamed form).
std::optional<GatewayError> parseError(const std::string& body);

struct RangeReply {
  Header header;
  std::vector<KeyValue> kvs;
  int64_t count = 0;
};

struct ResponseOp {
  RequestOp::Kind kind = RequestOp::Kind::Range;
  RangeReply range;     // Range
  int64_t deleted = 0;  // Delete
};

struct TxnReply {
  Header header;
  bool succeeded = false;
  std::vector<ResponseOp> responses;
};

struct PutReply {
  Header header;
};

struct DeleteReply {
  Header header;
  int64_t deleted = 0;
};

struct LeaseReply {
  Header header;
  int64_t id = 0;
  int64_t ttl = 0;  // keepalive: 0 means the lease no longer exists
};

struct StatusReply {
  Header header;
  uint64_t leader = 0;
  std::string version;
  bool isLeader() const { return leader != 0 && leader == header.memberId; }
};

struct Event {
  enum class Type { Put, Delete };
  Type type = Type::Put;
  KeyValue kv;
};

// One message of a watch stream.
struct WatchMessage {
  Header header;
  int64_t watchId = 0;  // which watch of the stream (gRPC; the gateway's stream has one)
  bool created = false;
  bool canceled = false;
  std::string cancelReason;
  int64_t compactRevision = 0;  // canceled because start_revision was compacted
  std::vector<Event> events;
};

RangeReply parseRange(const std::string& body);
TxnReply parseTxn(const std::string& body);
PutReply parsePut(const std::string& body);
DeleteReply parseDelete(const std::string& body);
LeaseReply parseLeaseGrant(const std::string& body);
LeaseReply parseLeaseKeepAlive(const std::string& body);  // the first {"result":..} line
StatusReply parseStatus(const std::string& body);
// One line of a watch stream (an error line is reported by parseError, not here).
WatchMessage parseWatchMessage(const std::string& line);

}  // namespace ddprun::rendezvous::etcd
