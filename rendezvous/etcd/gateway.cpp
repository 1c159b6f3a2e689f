#include "rendezvous/etcd/gateway.h"

#include <nlohmann/json.hpp>

#include "base/errors.h"

namespace ddprun::rendezvous::etcd {

using json = nlohmann::json;

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;  // standard and URL-safe alphabets
  if (c == '/' || c == '_') return 63;
  return -1;
}

[[noreturn]] void bad(const std::string& what, const std::string& why) {
  throw ProtocolError("etcd gateway: " + what + ": " + why);
}

json parseJson(const std::string& body, const std::string& what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    bad(what, "reply is not JSON: '" + body.substr(0, 120) + (body.size() > 120 ? "...'" : "'"));
  }
  if (!j.is_object()) bad(what, "reply is not a JSON object");
  return j;
}

// An int64 field: a JSON string of digits (as the gateway sends them), or a number.
int64_t int64Field(const json& j, const char* field, const std::string& what) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    try {
      size_t used = 0;
      const long long v = std::stoll(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
  }
  bad(what, std::string("field '") + field + "' is not an integer: " + it->dump());
}

uint64_t uint64Field(const json& j, const char* field, const std::string& what) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    try {
      size_t used = 0;
      const unsigned long long v = std::stoull(s, &used);
      if (used == s.size() && !s.empty() && s[0] != '-') return v;
    } catch (const std::exception&) {
    }
  }
  bad(what, std::string("field '") + field + "' is not an unsigned integer: " + it->dump());
}

bool boolField(const json& j, const char* field, const std::string& what) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) bad(what, std::string("field '") + field + "' is not a boolean");
  return it->get<bool>();
}

std::string stringField(const json& j, const char* field, const std::string& what) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) bad(what, std::string("field '") + field + "' is not a string");
  return it->get<std::string>();
}

std::string bytesField(const json& j, const char* field, const std::string& what) {
  return base64Decode(stringField(j, field, what), what + " field '" + field + "'");
}

const json& objectField(const json& j, const char* field, const std::string& what) {
  static const json kEmpty = json::object();
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return kEmpty;
  if (!it->is_object()) bad(what, std::string("field '") + field + "' is not an object");
  return *it;
}

const json& arrayField(const json& j, const char* field, const std::string& what) {
  static const json kEmpty = json::array();
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return kEmpty;
  if (!it->is_array()) bad(what, std::string("field '") + field + "' is not an array");
  return *it;
}

Header header(const json& j, const std::string& what) {
  const json& h = objectField(j, "header", what);
  return {int64Field(h, "revision", what), uint64Field(h, "member_id", what),
          int64Field(h, "raft_term", what)};
}

KeyValue keyValue(const json& j, const std::string& what) {
  if (!j.is_object()) bad(what, "a key-value is not an object");
  return {bytesField(j, "key", what),          bytesField(j, "value", what),
          int64Field(j, "create_revision", what), int64Field(j, "mod_revision", what),
          int64Field(j, "version", what),          int64Field(j, "lease", what)};
}

RangeReply rangeReply(const json& j, const std::string& what) {
  RangeReply r;
  r.header = header(j, what);
  for (const json& kv : arrayField(j, "kvs", what)) r.kvs.push_back(keyValue(kv, what));
  r.count = int64Field(j, "count", what);
  return r;
}

// The body of a streamed reply's first message: {"result":{...}}.
json streamResult(const std::string& body, const std::string& what) {
  const std::string line = body.substr(0, body.find('\n'));
  json j = parseJson(line, what);
  auto it = j.find("result");
  if (it == j.end() || !it->is_object()) bad(what, "no 'result' object in the stream message");
  return *it;
}

json rangeJson(const RangeRequest& r) {
  json j = {{"key", base64Encode(r.key)}};
  if (!r.rangeEnd.empty()) j["range_end"] = base64Encode(r.rangeEnd);
  if (r.countOnly) j["count_only"] = true;
  if (r.limit > 0) j["limit"] = std::to_string(r.limit);
  if (r.keysOnly) j["keys_only"] = true;
  if (r.maxCreateRevision > 0) j["max_create_revision"] = std::to_string(r.maxCreateRevision);
  return j;
}

json putJson(const PutRequest& p) {
  json j = {{"key", base64Encode(p.key)}, {"value", base64Encode(p.value)}};
  if (p.lease != 0) j["lease"] = std::to_string(p.lease);
  return j;
}

json deleteJson(const DeleteRequest& d) {
  json j = {{"key", base64Encode(d.key)}};
  if (!d.rangeEnd.empty()) j["range_end"] = base64Encode(d.rangeEnd);
  return j;
}

json opJson(const RequestOp& op) {
  switch (op.kind) {
    case RequestOp::Kind::Range: return {{"request_range", rangeJson(op.range)}};
    case RequestOp::Kind::Put: return {{"request_put", putJson(op.put)}};
    case RequestOp::Kind::Delete: return {{"request_delete_range", deleteJson(op.del)}};
  }
  return {};
}

json compareJson(const Compare& c) {
  json j = {{"key", base64Encode(c.key)}};
  switch (c.result) {
    case Compare::Result::Equal: j["result"] = "EQUAL"; break;
    case Compare::Result::NotEqual: j["result"] = "NOT_EQUAL"; break;
    case Compare::Result::Greater: j["result"] = "GREATER"; break;
    case Compare::Result::Less: j["result"] = "LESS"; break;
  }
  switch (c.target) {
    case Compare::Target::Value:
      j["target"] = "VALUE";
      j["value"] = base64Encode(c.value);
      break;
    case Compare::Target::Mod:
      j["target"] = "MOD";
      j["mod_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::Create:
      j["target"] = "CREATE";
      j["create_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::Version:
      j["target"] = "VERSION";
      j["version"] = std::to_string(c.number);
      break;
  }
  return j;
}

}  // namespace

std::string base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t n = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t n = uint8_t(bytes[i]) << 16;
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t n = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string base64Decode(const std::string& text, const std::string& what) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '=') {
      ++padding;
      continue;
    }
    const int v = sextet(c);
    if (v < 0 || padding > 0) bad(what, "not base64 at character " + std::to_string(i));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (padding > 2 || text.size() % 4 != 0)
    bad(what, "not base64 (bad length or padding)");
  return out;
}

std::string prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key: etcd's "\0" range end
}

std::string encodeRange(const RangeRequest& r) { return rangeJson(r).dump(); }
std::string encodePut(const PutRequest& p) { return putJson(p).dump(); }
std::string encodeDelete(const DeleteRequest& d) { return deleteJson(d).dump(); }

std::string encodeTxn(const TxnRequest& t) {
  json j = json::object();
  json& cmp = j["compare"] = json::array();
  for (const auto& c : t.compare) cmp.push_back(compareJson(c));
  json& ok = j["success"] = json::array();
  for (const auto& op : t.success) ok.push_back(opJson(op));
  json& ko = j["failure"] = json::array();
  for (const auto& op : t.failure) ko.push_back(opJson(op));
  return j.dump();
}

std::string encodeWatchCreate(const WatchCreate& w) {
  json c = {{"key", base64Encode(w.key)}};
  if (!w.rangeEnd.empty()) c["range_end"] = base64Encode(w.rangeEnd);
  if (w.startRevision > 0) c["start_revision"] = std::to_string(w.startRevision);
  if (w.prevKv) c["prev_kv"] = true;
  return json{{"create_request", c}}.dump();
}

std::string encodeLeaseGrant(int64_t ttlSeconds) {
  return json{{"TTL", std::to_string(ttlSeconds)}}.dump();
}

std::string encodeLeaseId(int64_t id) { return json{{"ID", std::to_string(id)}}.dump(); }

std::optional<GatewayError> parseError(const std::string& body) {
  json j = json::parse(body.substr(0, body.find('\n')), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto it = j.find("error");
  if (it == j.end() || it->is_null()) return std::nullopt;
  GatewayError e;
  const json& src = it->is_object() ? *it : j;  // streamed: {"error":{...}}; unary: flat
  auto code = src.find(it->is_object() ? "grpc_code" : "code");
  if (code != src.end() && code->is_number_integer()) e.code = code->get<int>();
  auto msg = src.find("message");
  if (msg != src.end() && msg->is_string()) e.message = msg->get<std::string>();
  else if (it->is_string()) e.message = it->get<std::string>();
  if (e.message.empty()) e.message = it->dump();
  return e;
}

RangeReply parseRange(const std::string& body) {
  return rangeReply(parseJson(body, "range reply"), "range reply");
}

TxnReply parseTxn(const std::string& body) {
  const std::string what = "txn reply";
  json j = parseJson(body, what);
  TxnReply t;
  t.header = header(j, what);
  t.succeeded = boolField(j, "succeeded", what);
  for (const json& r : arrayField(j, "responses", what)) {
    if (!r.is_object()) bad(what, "a response is not an object");
    ResponseOp op;
    if (r.contains("response_range")) {
      op.kind = RequestOp::Kind::Range;
      op.range = rangeReply(objectField(r, "response_range", what), what);
    } else if (r.contains("response_put")) {
      op.kind = RequestOp::Kind::Put;
    } else if (r.contains("response_delete_range")) {
      op.kind = RequestOp::Kind::Delete;
      op.deleted = int64Field(objectField(r, "response_delete_range", what), "deleted", what);
    } else {
      bad(what, "unknown response " + r.dump());
    }
    t.responses.push_back(std::move(op));
  }
  return t;
}

PutReply parsePut(const std::string& body) {
  return {header(parseJson(body, "put reply"), "put reply")};
}

DeleteReply parseDelete(const std::string& body) {
  const std::string what = "deleterange reply";
  json j = parseJson(body, what);
  return {header(j, what), int64Field(j, "deleted", what)};
}

LeaseReply parseLeaseGrant(const std::string& body) {
  const std::string what = "lease grant reply";
  json j = parseJson(body, what);
  const std::string error = stringField(j, "error", what);
  if (!error.empty()) bad(what, error);
  return {header(j, what), int64Field(j, "ID", what), int64Field(j, "TTL", what)};
}

LeaseReply parseLeaseKeepAlive(const std::string& body) {
  const std::string what = "lease keepalive reply";
  json r = streamResult(body, what);
  return {header(r, what), int64Field(r, "ID", what), int64Field(r, "TTL", what)};
}

StatusReply parseStatus(const std::string& body) {
  const std::string what = "status reply";
  json j = parseJson(body, what);
  return {header(j, what), uint64Field(j, "leader", what), stringField(j, "version", what)};
}

WatchMessage parseWatchMessage(const std::string& line) {
  const std::string what = "watch message";
  json r = streamResult(line, what);
  WatchMessage m;
  m.header = header(r, what);
  m.created = boolField(r, "created", what);
  m.canceled = boolField(r, "canceled", what);
  m.cancelReason = stringField(r, "cancel_reason", what);
  m.compactRevision = int64Field(r, "compact_revision", what);
  for (const json& e : arrayField(r, "events", what)) {
    if (!e.is_object()) bad(what, "an event is not an object");
    Event ev;
    const std::string type = stringField(e, "type", what);
    if (type == "DELETE") ev.type = Event::Type::Delete;
    else if (type.empty() || type == "PUT") ev.type = Event::Type::Put;
    else bad(what, "unknown event type '" + type + "'");
    ev.kv = keyValue(objectField(e, "kv", what), what);
    m.events.push_back(std::move(ev));
  }
  return m;
}

}  // namespace ddprun::rendezvous::etcd
