#include "rendezvous/etcd/grpc/proto.h"

#include "base/errors.h"

namespace ddprun::rendezvous::etcd::grpc {

// ---- Writer ----

void Writer::rawVarint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void Writer::tag(uint32_t field, WireType t) {
  rawVarint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(t));
}

void Writer::varint(uint32_t field, uint64_t v) {
  if (v == 0) return;
  tag(field, WireType::Varint);
  rawVarint(v);
}

void Writer::varintAlways(uint32_t field, uint64_t v) {
  tag(field, WireType::Varint);
  rawVarint(v);
}

void Writer::bytes(uint32_t field, std::string_view v) {
  if (v.empty()) return;
  message(field, v);
}

void Writer::message(uint32_t field, std::string_view m) {
  tag(field, WireType::Bytes);
  rawVarint(m.size());
  out_.append(m.data(), m.size());
}

// ---- Reader ----

void Reader::fail(const std::string& what) const {
  throw ProtocolError("etcd gRPC reply: " + message_ + ": " + what + " (at byte " +
                      std::to_string(pos_) + " of " + std::to_string(data_.size()) + ")");
}

uint64_t Reader::readVarint(const char* what) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos_ >= data_.size()) fail(std::string(what) + ": truncated varint");
    const auto b = static_cast<uint8_t>(data_[pos_++]);
    if (shift == 63 && b > 1) fail(std::string(what) + ": varint longer than 64 bits");
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  fail(std::string(what) + ": varint longer than 10 bytes");
}

bool Reader::next() {
  if (pos_ >= data_.size()) return false;
  const uint64_t key = readVarint("a field's tag");
  const uint64_t field = key >> 3;
  const auto type = static_cast<uint8_t>(key & 7);
  if (field == 0 || field > 0x1fffffff) fail("field number " + std::to_string(field) + " is not valid");
  if (type == 3 || type == 4) {
    fail("field " + std::to_string(field) + " is a group (wire type " + std::to_string(type) +
         "), which etcd never sends");
  }
  if (type > 5) fail("field " + std::to_string(field) + " has wire type " + std::to_string(type));
  field_ = static_cast<uint32_t>(field);
  type_ = static_cast<WireType>(type);
  return true;
}

void Reader::expect(WireType t, const char* name) const {
  if (type_ != t) {
    fail(std::string(name) + " (field " + std::to_string(field_) + ") has wire type " +
         std::to_string(static_cast<int>(type_)) + ", expected " +
         std::to_string(static_cast<int>(t)));
  }
}

uint64_t Reader::varint(const char* name) {
  expect(WireType::Varint, name);
  return readVarint(name);
}

std::string_view Reader::bytes(const char* name) {
  expect(WireType::Bytes, name);
  const uint64_t n = readVarint(name);
  if (n > data_.size() - pos_) {
    fail(std::string(name) + ": length " + std::to_string(n) + " runs past the end (" +
         std::to_string(data_.size() - pos_) + " bytes left)");
  }
  const std::string_view v = data_.substr(pos_, n);
  pos_ += n;
  return v;
}

void Reader::skip() {
  const std::string name = "unknown field " + std::to_string(field_);
  switch (type_) {
    case WireType::Varint: readVarint(name.c_str()); return;
    case WireType::Bytes: bytes(name.c_str()); return;
    case WireType::Fixed64:
    case WireType::Fixed32: {
      const size_t n = type_ == WireType::Fixed64 ? 8 : 4;
      if (data_.size() - pos_ < n) fail(name + ": truncated fixed-size value");
      pos_ += n;
      return;
    }
  }
}

// ---- Framing ----

std::string frame(std::string_view message) {
  std::string out(5, '\0');
  const auto n = static_cast<uint32_t>(message.size());
  out[1] = static_cast<char>(n >> 24);
  out[2] = static_cast<char>(n >> 16);
  out[3] = static_cast<char>(n >> 8);
  out[4] = static_cast<char>(n);
  out.append(message.data(), message.size());
  return out;
}

std::optional<std::string> MessageReader::next() {
  if (buf_.size() < 5) return std::nullopt;
  const auto* p = reinterpret_cast<const uint8_t*>(buf_.data());
  if (p[0] != 0) {
    throw ProtocolError(what_ + ": a message with compression flag " + std::to_string(p[0]) +
                        " (no compression was offered)");
  }
  const size_t n = (size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) | p[4];
  if (n > max_) {
    throw ProtocolError(what_ + ": a message of " + std::to_string(n) + " bytes (at most " +
                        std::to_string(max_) + " accepted)");
  }
  if (buf_.size() < 5 + n) return std::nullopt;
  std::string m = buf_.substr(5, n);
  buf_.erase(0, 5 + n);
  return m;
}

// ---- Requests ----

namespace {

std::string rangeBody(const RangeRequest& r) {
  Writer w;
  w.bytes(1, r.key);
  w.bytes(2, r.rangeEnd);
  w.int64(3, r.limit);
  w.boolean(8, r.keysOnly);
  w.boolean(9, r.countOnly);
  w.int64(13, r.maxCreateRevision);
  return w.take();
}

std::string putBody(const PutRequest& p) {
  Writer w;
  w.bytes(1, p.key);
  w.bytes(2, p.value);
  w.int64(3, p.lease);
  return w.take();
}

std::string deleteBody(const DeleteRequest& d) {
  Writer w;
  w.bytes(1, d.key);
  w.bytes(2, d.rangeEnd);
  return w.take();
}

std::string requestOp(const RequestOp& op) {
  Writer w;
  switch (op.kind) {
    case RequestOp::Kind::Range: w.message(1, rangeBody(op.range)); break;
    case RequestOp::Kind::Put: w.message(2, putBody(op.put)); break;
    case RequestOp::Kind::Delete: w.message(3, deleteBody(op.del)); break;
  }
  return w.take();
}

std::string compare(const Compare& c) {
  // etcd's CompareResult: EQUAL 0, GREATER 1, LESS 2, NOT_EQUAL 3; CompareTarget: VERSION 0,
  // CREATE 1, MOD 2, VALUE 3. The target_union is a oneof: a zero number is written anyway
  // (mod_revision 0 = "the key is absent" must reach etcd), as proto3 does for a set oneof.
  Writer w;
  uint64_t result = 0;
  switch (c.result) {
    case Compare::Result::Equal: result = 0; break;
    case Compare::Result::Greater: result = 1; break;
    case Compare::Result::Less: result = 2; break;
    case Compare::Result::NotEqual: result = 3; break;
  }
  uint64_t target = 0;
  uint32_t unionField = 0;
  switch (c.target) {
    case Compare::Target::Version: target = 0; unionField = 4; break;
    case Compare::Target::Create: target = 1; unionField = 5; break;
    case Compare::Target::Mod: target = 2; unionField = 6; break;
    case Compare::Target::Value: target = 3; unionField = 7; break;
  }
  w.varint(1, result);
  w.varint(2, target);
  w.bytes(3, c.key);
  if (c.target == Compare::Target::Value) {
    w.message(unionField, c.value);
  } else {
    w.varintAlways(unionField, static_cast<uint64_t>(c.number));
  }
  return w.take();
}

}  // namespace

std::string encodeRange(const RangeRequest& r) { return rangeBody(r); }
std::string encodePut(const PutRequest& p) { return putBody(p); }
std::string encodeDeleteRange(const DeleteRequest& d) { return deleteBody(d); }

std::string encodeTxn(const TxnRequest& t) {
  Writer w;
  for (const Compare& c : t.compare) w.message(1, compare(c));
  for (const RequestOp& op : t.success) w.message(2, requestOp(op));
  for (const RequestOp& op : t.failure) w.message(3, requestOp(op));
  return w.take();
}

std::string encodeLeaseGrant(int64_t ttlSeconds) {
  Writer w;
  w.int64(1, ttlSeconds);
  return w.take();
}

std::string encodeLeaseId(int64_t id) {
  Writer w;
  w.int64(1, id);
  return w.take();
}

std::string encodeWatchCreate(const WatchCreate& c) {
  Writer create;
  create.bytes(1, c.key);
  create.bytes(2, c.rangeEnd);
  create.int64(3, c.startRevision);
  create.boolean(6, c.prevKv);
  Writer w;
  w.message(1, create.data());
  return w.take();
}

std::string encodeWatchCancel(int64_t watchId) {
  Writer cancel;
  cancel.int64(1, watchId);
  Writer w;
  w.message(2, cancel.data());
  return w.take();
}

// ---- Replies ----

namespace {

Header header(std::string_view m, const std::string& where) {
  Header h;
  Reader r(m, where + ".header");
  while (r.next()) {
    switch (r.field()) {
      case 2: h.memberId = r.varint("member_id"); break;
      case 3: h.revision = r.int64("revision"); break;
      case 4: h.raftTerm = r.int64("raft_term"); break;
      default: r.skip();
    }
  }
  return h;
}

KeyValue keyValue(std::string_view m, const std::string& where) {
  KeyValue kv;
  Reader r(m, where);
  while (r.next()) {
    switch (r.field()) {
      case 1: kv.key = r.bytes("key"); break;
      case 2: kv.createRevision = r.int64("create_revision"); break;
      case 3: kv.modRevision = r.int64("mod_revision"); break;
      case 4: kv.version = r.int64("version"); break;
      case 5: kv.value = r.bytes("value"); break;
      case 6: kv.lease = r.int64("lease"); break;
      default: r.skip();
    }
  }
  return kv;
}

RangeReply range(std::string_view m, const std::string& where) {
  RangeReply out;
  Reader r(m, where);
  while (r.next()) {
    switch (r.field()) {
      case 1: out.header = header(r.bytes("header"), where); break;
      case 2: out.kvs.push_back(keyValue(r.bytes("kvs"), where + ".kvs")); break;
      case 4: out.count = r.int64("count"); break;
      default: r.skip();
    }
  }
  return out;
}

}  // namespace

RangeReply decodeRange(std::string_view m) { return range(m, "RangeResponse"); }

PutReply decodePut(std::string_view m) {
  PutReply out;
  Reader r(m, "PutResponse");
  while (r.next()) {
    if (r.field() == 1) out.header = header(r.bytes("header"), "PutResponse");
    else r.skip();
  }
  return out;
}

DeleteReply decodeDeleteRange(std::string_view m) {
  DeleteReply out;
  Reader r(m, "DeleteRangeResponse");
  while (r.next()) {
    switch (r.field()) {
      case 1: out.header = header(r.bytes("header"), "DeleteRangeResponse"); break;
      case 2: out.deleted = r.int64("deleted"); break;
      default: r.skip();
    }
  }
  return out;
}

TxnReply decodeTxn(std::string_view m) {
  TxnReply out;
  Reader r(m, "TxnResponse");
  while (r.next()) {
    switch (r.field()) {
      case 1: out.header = header(r.bytes("header"), "TxnResponse"); break;
      case 2: out.succeeded = r.boolean("succeeded"); break;
      case 3: {
        Reader op(r.bytes("responses"), "TxnResponse.responses");
        ResponseOp res;
        bool any = false;
        while (op.next()) {
          switch (op.field()) {
            case 1:
              res.kind = RequestOp::Kind::Range;
              res.range = range(op.bytes("response_range"), "TxnResponse.response_range");
              any = true;
              break;
            case 2:
              res.kind = RequestOp::Kind::Put;
              op.bytes("response_put");
              any = true;
              break;
            case 3:
              res.kind = RequestOp::Kind::Delete;
              res.deleted = decodeDeleteRange(op.bytes("response_delete_range")).deleted;
              any = true;
              break;
            default: op.skip();  // response_txn (we send no nested txn), or newer
          }
        }
        if (!any) {
          throw ProtocolError("etcd gRPC reply: TxnResponse.responses[" +
                              std::to_string(out.responses.size()) +
                              "]: none of response_range, response_put, response_delete_range");
        }
        out.responses.push_back(std::move(res));
        break;
      }
      default: r.skip();
    }
  }
  return out;
}

LeaseReply decodeLeaseGrant(std::string_view m) {
  LeaseReply out;
  std::string error;
  Reader r(m, "LeaseGrantResponse");
  while (r.next()) {
    switch (r.field()) {
      case 1: out.header = header(r.bytes("header"), "LeaseGrantResponse"); break;
      case 2: out.id = r.int64("ID"); break;
      case 3: out.ttl = r.int64("TTL"); break;
      case 4: error = r.bytes("error"); break;
      default: r.skip();
    }
  }
  if (!error.empty()) throw ProtocolError("etcd gRPC reply: LeaseGrantResponse.error: " + error);
  if (out.id == 0) throw ProtocolError("etcd gRPC reply: LeaseGrantResponse.ID is missing");
  return out;
}

LeaseReply decodeLeaseKeepAlive(std::string_view m) {
  LeaseReply out;
  Reader r(m, "LeaseKeepAliveResponse");
  while (r.next()) {
    switch (r.field()) {
      case 1: out.header = header(r.bytes("header"), "LeaseKeepAliveResponse"); break;
      case 2: out.id = r.int64("ID"); break;
      case 3: out.ttl = r.int64("TTL"); break;
      default: r.skip();
    }
  }
  return out;
}

StatusReply decodeStatus(std::string_view m) {
  StatusReply out;
  Reader r(m, "StatusResponse");
  while (r.next()) {
    switch (r.field()) {
      case 1: out.header = header(r.bytes("header"), "StatusResponse"); break;
      case 2: out.version = r.bytes("version"); break;
      case 4: out.leader = r.varint("leader"); break;
      default: r.skip();
    }
  }
  return out;
}

WatchMessage decodeWatch(std::string_view m) {
  WatchMessage out;
  Reader r(m, "WatchResponse");
  while (r.next()) {
    switch (r.field()) {
      case 1: out.header = header(r.bytes("header"), "WatchResponse"); break;
      case 2: out.watchId = r.int64("watch_id"); break;
      case 3: out.created = r.boolean("created"); break;
      case 4: out.canceled = r.boolean("canceled"); break;
      case 5: out.compactRevision = r.int64("compact_revision"); break;
      case 6: out.cancelReason = r.bytes("cancel_reason"); break;
      case 11: {
        Event e;
        Reader ev(r.bytes("events"), "WatchResponse.events");
        bool haveKv = false;
        while (ev.next()) {
          switch (ev.field()) {
            case 1: {
              const uint64_t t = ev.varint("type");
              if (t > 1) {
                throw ProtocolError("etcd gRPC reply: WatchResponse.events.type is " +
                                    std::to_string(t) + " (PUT 0 or DELETE 1 expected)");
              }
              e.type = t == 0 ? Event::Type::Put : Event::Type::Delete;
              break;
            }
            case 2:
              e.kv = keyValue(ev.bytes("kv"), "WatchResponse.events.kv");
              haveKv = true;
              break;
            default: ev.skip();  // prev_kv (not asked for)
          }
        }
        if (!haveKv) throw ProtocolError("etcd gRPC reply: WatchResponse.events.kv is missing");
        out.events.push_back(std::move(e));
        break;
      }
      default: r.skip();
    }
  }
  return out;
}

}  // namespace ddprun::rendezvous::etcd::grpc
