#pragma once
// The protobuf encoding of the few etcdserverpb messages the etcd client sends and reads over
// gRPC (etcd's api/etcdserverpb/rpc.proto and mvccpb/kv.proto, v3.4: field numbers only), and
// gRPC's length-prefixed message framing. Pure functions, no sockets: tests feed them bytes.
//
// Requests and replies are the same structs the JSON gateway uses (../gateway.h), so the
// client above does not care which transport carried them. Encoding writes only what is set
// (proto3: a zero, false or empty field is absent). Decoding skips fields it does not know
// (a newer etcd may add some) and throws ProtocolError naming the message and the field when
// the bytes are not protobuf (a truncated varint or length, a length past the end, a field of
// the wrong wire type, a group). What a hostile member can make us hold is bounded by the
// caller's message size limit (MessageReader); decoding never recurses on unknown input.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "rendezvous/etcd/gateway.h"

namespace ddprun::rendezvous::etcd::grpc {

// ---- Wire format ----

enum class WireType : uint8_t { Varint = 0, Fixed64 = 1, Bytes = 2, Fixed32 = 5 };

// Appends fields to a message.
class Writer {
 public:
  void varint(uint32_t field, uint64_t v);               // skipped when 0
  void varintAlways(uint32_t field, uint64_t v);         // a oneof member: written even when 0
  void int64(uint32_t field, int64_t v) { varint(field, static_cast<uint64_t>(v)); }
  void boolean(uint32_t field, bool v) { varint(field, v ? 1 : 0); }
  void bytes(uint32_t field, std::string_view v);        // skipped when empty
  void message(uint32_t field, std::string_view m);      // written even when empty
  const std::string& data() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void tag(uint32_t field, WireType t);
  void rawVarint(uint64_t v);
  std::string out_;
};

// Reads the fields of one message in order. `message` names it in errors ("RangeResponse").
class Reader {
 public:
  Reader(std::string_view data, std::string message)
      : data_(data), message_(std::move(message)) {}
  // Advances to the next field; false at the end of the message.
  bool next();
  uint32_t field() const { return field_; }
  WireType wireType() const { return type_; }
  // The current field's value as the type its name says; throws ProtocolError naming
  // `message.name` when the wire type does not match.
  uint64_t varint(const char* name);
  int64_t int64(const char* name) { return static_cast<int64_t>(varint(name)); }
  bool boolean(const char* name) { return varint(name) != 0; }
  std::string_view bytes(const char* name);
  // Skips the current field (an unknown one).
  void skip();

 private:
  [[noreturn]] void fail(const std::string& what) const;
  uint64_t readVarint(const char* what);
  void expect(WireType t, const char* name) const;

  std::string_view data_;
  size_t pos_ = 0;
  std::string message_;
  uint32_t field_ = 0;
  WireType type_ = WireType::Varint;
};

// ---- gRPC message framing ----

// One message as gRPC sends it on a stream: a 0 byte (not compressed), its length (4 bytes,
// big-endian), the message.
std::string frame(std::string_view message);

// Splits a stream's DATA bytes into messages. Throws ProtocolError (naming `what`, the call)
// for a compressed message (we never offer compression) or one longer than `maxMessage`.
class MessageReader {
 public:
  MessageReader(std::string what, size_t maxMessage)
      : what_(std::move(what)), max_(maxMessage) {}
  void append(std::string_view bytes) { buf_.append(bytes.data(), bytes.size()); }
  // The next whole message, if one has arrived.
  std::optional<std::string> next();
  // Bytes of an incomplete message held.
  size_t pending() const { return buf_.size(); }

 private:
  std::string what_;
  size_t max_;
  std::string buf_;
};

// ---- etcdserverpb requests ----

std::string encodeRange(const RangeRequest& r);
std::string encodePut(const PutRequest& p);
std::string encodeDeleteRange(const DeleteRequest& d);
std::string encodeTxn(const TxnRequest& t);
std::string encodeLeaseGrant(int64_t ttlSeconds);
std::string encodeLeaseId(int64_t id);  // LeaseKeepAliveRequest, LeaseRevokeRequest
std::string encodeWatchCreate(const WatchCreate& w);  // a WatchRequest with create_request
std::string encodeWatchCancel(int64_t watchId);       // a WatchRequest with cancel_request

// ---- etcdserverpb replies ----

RangeReply decodeRange(std::string_view m);
PutReply decodePut(std::string_view m);
DeleteReply decodeDeleteRange(std::string_view m);
TxnReply decodeTxn(std::string_view m);
LeaseReply decodeLeaseGrant(std::string_view m);
LeaseReply decodeLeaseKeepAlive(std::string_view m);
StatusReply decodeStatus(std::string_view m);
WatchMessage decodeWatch(std::string_view m);

}  // namespace ddprun::rendezvous::etcd::grpc
