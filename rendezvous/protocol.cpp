#include "rendezvous/protocol.h"

#include <cstring>

namespace ddprun::rendezvous::protocol {

const char* dialectName(Dialect d) {
  switch (d) {
    case Dialect::Current: return "current";
    case Dialect::Legacy: return "legacy (torch 1.13)";
  }
  return "?";
}

const char* opName(Op op) {
  switch (op) {
    case Op::Validate: return "VALIDATE";
    case Op::Ping: return "PING";
    case Op::Set: return "SET";
    case Op::CompareSet: return "COMPARE_SET";
    case Op::Get: return "GET";
    case Op::Add: return "ADD";
    case Op::Check: return "CHECK";
    case Op::Wait: return "WAIT";
    case Op::GetNumKeys: return "GETNUMKEYS";
    case Op::WatchKey: return "WATCH_KEY";
    case Op::DeleteKey: return "DELETE_KEY";
    case Op::Append: return "APPEND";
    case Op::MultiGet: return "MULTI_GET";
    case Op::MultiSet: return "MULTI_SET";
    case Op::CancelWait: return "CANCEL_WAIT";
    case Op::QueuePush: return "QUEUE_PUSH";
    case Op::QueuePop: return "QUEUE_POP";
    case Op::QueueLen: return "QUEUE_LEN";
    case Op::Hello: return "HELLO";
    case Op::Auth: return "AUTH";
    case Op::WaitGet: return "WAIT_GET";
    case Op::Info: return "INFO";
  }
  return "?";
}

std::optional<Op> decodeCommand(uint8_t byte, Dialect dialect) {
  switch (static_cast<ExtensionCommand>(byte)) {
    case ExtensionCommand::Hello: return Op::Hello;
    case ExtensionCommand::Auth: return Op::Auth;
    case ExtensionCommand::WaitGet: return Op::WaitGet;
    case ExtensionCommand::Info: return Op::Info;
  }
  if (dialect == Dialect::Legacy) {
    if (byte > static_cast<uint8_t>(LegacyCommand::DeleteKey)) return std::nullopt;
    switch (static_cast<LegacyCommand>(byte)) {
      case LegacyCommand::Set: return Op::Set;
      case LegacyCommand::CompareSet: return Op::CompareSet;
      case LegacyCommand::Get: return Op::Get;
      case LegacyCommand::Add: return Op::Add;
      case LegacyCommand::Check: return Op::Check;
      case LegacyCommand::Wait: return Op::Wait;
      case LegacyCommand::GetNumKeys: return Op::GetNumKeys;
      case LegacyCommand::WatchKey: return Op::WatchKey;
      case LegacyCommand::DeleteKey: return Op::DeleteKey;
    }
    return std::nullopt;
  }
  if (byte > static_cast<uint8_t>(CurrentCommand::QueueLen)) return std::nullopt;
  switch (static_cast<CurrentCommand>(byte)) {
    case CurrentCommand::Validate: return Op::Validate;
    case CurrentCommand::Set: return Op::Set;
    case CurrentCommand::CompareSet: return Op::CompareSet;
    case CurrentCommand::Get: return Op::Get;
    case CurrentCommand::Add: return Op::Add;
    case CurrentCommand::Check: return Op::Check;
    case CurrentCommand::Wait: return Op::Wait;
    case CurrentCommand::GetNumKeys: return Op::GetNumKeys;
    case CurrentCommand::DeleteKey: return Op::DeleteKey;
    case CurrentCommand::Append: return Op::Append;
    case CurrentCommand::MultiGet: return Op::MultiGet;
    case CurrentCommand::MultiSet: return Op::MultiSet;
    case CurrentCommand::CancelWait: return Op::CancelWait;
    case CurrentCommand::Ping: return Op::Ping;
    case CurrentCommand::QueuePush: return Op::QueuePush;
    case CurrentCommand::QueuePop: return Op::QueuePop;
    case CurrentCommand::QueueLen: return Op::QueueLen;
  }
  return std::nullopt;
}

std::optional<uint8_t> encodeCommand(Op op, Dialect dialect) {
  auto cur = [](CurrentCommand c) { return std::optional<uint8_t>(static_cast<uint8_t>(c)); };
  auto leg = [](LegacyCommand c) { return std::optional<uint8_t>(static_cast<uint8_t>(c)); };
  auto ext = [](ExtensionCommand c) { return std::optional<uint8_t>(static_cast<uint8_t>(c)); };
  const bool legacy = dialect == Dialect::Legacy;
  switch (op) {
    case Op::Validate: return legacy ? std::nullopt : cur(CurrentCommand::Validate);
    case Op::Ping: return legacy ? std::nullopt : cur(CurrentCommand::Ping);
    case Op::Set: return legacy ? leg(LegacyCommand::Set) : cur(CurrentCommand::Set);
    case Op::CompareSet:
      return legacy ? leg(LegacyCommand::CompareSet) : cur(CurrentCommand::CompareSet);
    case Op::Get: return legacy ? leg(LegacyCommand::Get) : cur(CurrentCommand::Get);
    case Op::Add: return legacy ? leg(LegacyCommand::Add) : cur(CurrentCommand::Add);
    case Op::Check: return legacy ? leg(LegacyCommand::Check) : cur(CurrentCommand::Check);
    case Op::Wait: return legacy ? leg(LegacyCommand::Wait) : cur(CurrentCommand::Wait);
    case Op::GetNumKeys:
      return legacy ? leg(LegacyCommand::GetNumKeys) : cur(CurrentCommand::GetNumKeys);
    case Op::WatchKey: return legacy ? leg(LegacyCommand::WatchKey) : std::nullopt;
    case Op::DeleteKey:
      return legacy ? leg(LegacyCommand::DeleteKey) : cur(CurrentCommand::DeleteKey);
    case Op::Append: return legacy ? std::nullopt : cur(CurrentCommand::Append);
    case Op::MultiGet: return legacy ? std::nullopt : cur(CurrentCommand::MultiGet);
    case Op::MultiSet: return legacy ? std::nullopt : cur(CurrentCommand::MultiSet);
    case Op::CancelWait: return legacy ? std::nullopt : cur(CurrentCommand::CancelWait);
    case Op::QueuePush: return legacy ? std::nullopt : cur(CurrentCommand::QueuePush);
    case Op::QueuePop: return legacy ? std::nullopt : cur(CurrentCommand::QueuePop);
    case Op::QueueLen: return legacy ? std::nullopt : cur(CurrentCommand::QueueLen);
    case Op::Hello: return ext(ExtensionCommand::Hello);
    case Op::Auth: return ext(ExtensionCommand::Auth);
    case Op::WaitGet: return ext(ExtensionCommand::WaitGet);
    case Op::Info: return ext(ExtensionCommand::Info);
  }
  return std::nullopt;
}

bool FrameReader::raw(void* p, size_t n) {
  if (in_.size() - pos_ < n) return false;
  std::memcpy(p, in_.data() + pos_, n);
  pos_ += n;
  return true;
}

bool FrameReader::str(std::string& s, uint64_t maxLen, bool& tooLong, uint64_t& len) {
  tooLong = false;
  const size_t start = pos_;
  if (!u64(len)) return false;
  if (len > maxLen) {
    tooLong = true;
    pos_ = start;
    return false;
  }
  if (remaining() < len) {
    pos_ = start;
    return false;
  }
  s.assign(in_.data() + pos_, static_cast<size_t>(len));
  pos_ += static_cast<size_t>(len);
  return true;
}

std::optional<Dialect> detectDialect(std::string_view firstBytes) {
  if (firstBytes.empty()) return std::nullopt;
  if (firstBytes[0] != 0) return Dialect::Legacy;  // no current frame starts otherwise
  if (firstBytes.size() < 5) return std::nullopt;  // a legacy SET has >= 9 bytes anyway
  uint32_t magic = 0;
  std::memcpy(&magic, firstBytes.data() + 1, sizeof magic);
  return magic == kValidateMagic ? Dialect::Current : Dialect::Legacy;
}

namespace {

// Parses the arguments of one frame. Returns Complete/NeedMore/Invalid; on NeedMore sets
// `needAtLeast` when a length field already tells how much is missing.
class ArgParser {
 public:
  ArgParser(std::string_view bytes, const Limits& limits, ParseResult& result)
      : in_(bytes), r_(bytes), limits_(limits), result_(result) {}

  bool skipCommandByte() {
    uint8_t b;
    return r_.u8(b);
  }
  bool key(std::string& out) { return field(out, limits_.maxKeyBytes, "key"); }
  bool value(std::string& out) { return field(out, limits_.maxValueBytes, "value"); }
  bool i64(int64_t& v) { return need(r_.i64(v), 8); }
  bool u32(uint32_t& v) { return need(r_.u32(v), 4); }
  bool count(uint64_t& n) {
    if (!need(r_.u64(n), 8)) return false;
    if (n > limits_.maxKeysPerRequest) {
      invalid("key count " + std::to_string(n) + " exceeds the limit of " +
              std::to_string(limits_.maxKeysPerRequest));
      return false;
    }
    return true;
  }
  size_t offset() const { return r_.offset(); }
  bool failed() const { return result_.status == ParseStatus::Invalid; }

 private:
  bool need(bool ok, size_t n) {
    if (!ok) result_.needAtLeast = r_.offset() + n;
    return ok;
  }
  bool field(std::string& out, uint64_t max, const char* what) {
    bool tooLong = false;
    uint64_t len = 0;
    const size_t start = r_.offset();
    if (r_.str(out, max, tooLong, len)) return true;
    if (tooLong) {
      invalid(std::string(what) + " length " + std::to_string(len) + " exceeds the limit of " +
              std::to_string(max) + " bytes");
    } else if (in_.size() - start >= 8) {
      result_.needAtLeast = start + 8 + static_cast<size_t>(len);
    } else {
      result_.needAtLeast = start + 8;
    }
    return false;
  }
  void invalid(std::string why) {
    result_.status = ParseStatus::Invalid;
    result_.error = std::move(why);
  }

  std::string_view in_;
  FrameReader r_;
  const Limits& limits_;
  ParseResult& result_;
};

}  // namespace

ParseResult parseRequest(std::string_view bytes, Dialect dialect, const Limits& limits,
                         Request& out) {
  ParseResult result;
  if (bytes.empty()) {
    result.needAtLeast = 1;
    return result;
  }
  const uint8_t byte = static_cast<uint8_t>(bytes[0]);
  const std::optional<Op> op = decodeCommand(byte, dialect);
  if (!op) {
    result.status = ParseStatus::Invalid;
    result.error = "unknown command byte " + std::to_string(byte) + " in the " +
                   dialectName(dialect) + " dialect";
    return result;
  }

  ArgParser p(bytes, limits, result);
  p.skipCommandByte();
  Request req;
  req.op = *op;
  bool ok = true;
  auto oneKey = [&] { req.keys.resize(1); return p.key(req.keys[0]); };
  auto keyList = [&] {
    uint64_t n = 0;
    if (!p.count(n)) return false;
    req.keys.resize(static_cast<size_t>(n));
    for (auto& k : req.keys)
      if (!p.key(k)) return false;
    return true;
  };

  switch (*op) {
    case Op::Validate:
    case Op::Ping: {
      uint32_t v = 0;
      ok = p.u32(v);
      req.integer = v;
      break;
    }
    case Op::Set:
    case Op::Append:
    case Op::QueuePush:
      req.values.resize(1);
      ok = oneKey() && p.value(req.values[0]);
      break;
    case Op::CompareSet:
      req.values.resize(2);
      ok = oneKey() && p.value(req.values[0]) && p.value(req.values[1]);
      break;
    case Op::Get:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen:
    case Op::WaitGet:
      ok = oneKey();
      break;
    case Op::Add:
      ok = oneKey() && p.i64(req.integer);
      break;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet:
      ok = keyList();
      break;
    case Op::MultiSet: {
      uint64_t n = 0;
      ok = p.count(n);
      if (ok) {
        req.keys.resize(static_cast<size_t>(n));
        req.values.resize(static_cast<size_t>(n));
        for (size_t i = 0; ok && i < n; ++i) ok = p.key(req.keys[i]) && p.value(req.values[i]);
      }
      break;
    }
    case Op::GetNumKeys:
    case Op::CancelWait:
    case Op::Hello:
    case Op::Info:
      break;
    case Op::Auth:
      req.values.resize(2);
      ok = p.value(req.values[0]) && p.value(req.values[1]);
      break;
  }

  if (p.failed()) return result;
  if (!ok) {
    result.status = ParseStatus::NeedMore;
    if (result.needAtLeast <= bytes.size()) result.needAtLeast = bytes.size() + 1;
    return result;
  }
  if (req.op == Op::Validate && static_cast<uint32_t>(req.integer) != kValidateMagic) {
    result.status = ParseStatus::Invalid;
    result.error = "VALIDATE with wrong magic " + std::to_string(req.integer);
    return result;
  }
  result.status = ParseStatus::Complete;
  result.consumed = p.offset();
  out = std::move(req);
  return result;
}

}  // namespace ddprun::rendezvous::protocol
