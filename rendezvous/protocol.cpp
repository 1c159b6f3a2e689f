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
    case Op::Clock: return "CLOCK";
  }
  return "?";
}

std::optional<Op> decodeCommand(uint8_t byte, Dialect dialect) {
  switch (static_cast<ExtensionCommand>(byte)) {
    case ExtensionCommand::Hello: return Op::Hello;
    case ExtensionCommand::Auth: return Op::Auth;
    case ExtensionCommand::WaitGet: return Op::WaitGet;
    case ExtensionCommand::Info: return Op::Info;
    case ExtensionCommand::Clock: return Op::Clock;
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
    case Op::Clock: return ext(ExtensionCommand::Clock);
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

// The arguments of each operation, as a sequence of fields: a fixed head, and for the list
// operations (head ending in Count) that many items of `item` fields each.
enum class Field : uint8_t { U32, I64, Key, Value, Count };
struct Shape {
  Field head[3];
  uint8_t headLen;
  Field item[2];
  uint8_t itemLen;
};

const Shape& shapeOf(Op op) {
  using F = Field;
  static const Shape none{{}, 0, {}, 0}, u32{{F::U32}, 1, {}, 0}, key{{F::Key}, 1, {}, 0},
      keyValue{{F::Key, F::Value}, 2, {}, 0}, keyTwoValues{{F::Key, F::Value, F::Value}, 3, {}, 0},
      keyI64{{F::Key, F::I64}, 2, {}, 0}, twoValues{{F::Value, F::Value}, 2, {}, 0},
      keyList{{F::Count}, 1, {F::Key}, 1}, pairList{{F::Count}, 1, {F::Key, F::Value}, 2};
  switch (op) {
    case Op::Validate: case Op::Ping: return u32;
    case Op::Set: case Op::Append: case Op::QueuePush: return keyValue;
    case Op::CompareSet: return keyTwoValues;
    case Op::Get: case Op::WatchKey: case Op::DeleteKey: case Op::QueuePop: case Op::QueueLen:
    case Op::WaitGet: return key;
    case Op::Add: return keyI64;
    case Op::Check: case Op::Wait: case Op::MultiGet: return keyList;
    case Op::MultiSet: return pairList;
    case Op::GetNumKeys: case Op::CancelWait: case Op::Hello: case Op::Info:
    case Op::Clock: return none;
    case Op::Auth: return twoValues;  // client nonce, proof
  }
  return none;
}

std::string bytesText(uint64_t n) { return std::to_string(n) + " bytes"; }

}  // namespace

ParseResult RequestParser::parse(std::string_view bytes, Dialect dialect, const Limits& limits,
                                 Request& out) {
  ParseResult result;
  auto invalid = [&](std::string why) {
    started_ = false;
    result.status = ParseStatus::Invalid;
    result.error = std::move(why);
    return result;
  };
  // NeedMore until the buffer holds `end` bytes of the frame; a frame that would pass the
  // frame limit is refused as soon as a length field says so.
  auto needMore = [&](uint64_t end) {
    if (end > limits.maxFrameBytes) {
      return invalid(std::string("frame of at least ") + bytesText(end) +
                     " exceeds the limit of " + bytesText(limits.maxFrameBytes));
    }
    result.status = ParseStatus::NeedMore;
    result.needAtLeast = static_cast<size_t>(end);
    return result;
  };
  if (!started_) {
    if (bytes.empty()) return needMore(1);
    const uint8_t byte = static_cast<uint8_t>(bytes[0]);
    const std::optional<Op> op = decodeCommand(byte, dialect);
    if (!op) {
      return invalid("unknown command byte " + std::to_string(byte) + " in the " +
                     dialectName(dialect) + " dialect");
    }
    started_ = true;
    req_.op = *op;
    req_.keys.clear();
    req_.values.clear();
    req_.integer = 0;
    pos_ = 1;
    step_ = itemStep_ = 0;
    items_ = 0;
  }

  const Shape& shape = shapeOf(req_.op);
  for (;;) {
    Field f;
    if (step_ < shape.headLen) {
      f = shape.head[step_];
    } else if (items_ > 0) {
      f = shape.item[itemStep_];
    } else {
      break;  // every field decoded
    }
    const size_t have = bytes.size() - pos_;  // pos_ <= bytes.size(): the caller only grows them
    const char* at = bytes.data() + pos_;
    switch (f) {
      case Field::U32: {
        if (have < 4) return needMore(pos_ + 4);
        uint32_t v;
        std::memcpy(&v, at, 4);
        req_.integer = v;
        pos_ += 4;
        break;
      }
      case Field::I64:
        if (have < 8) return needMore(pos_ + 8);
        std::memcpy(&req_.integer, at, 8);
        pos_ += 8;
        break;
      case Field::Count: {
        if (have < 8) return needMore(pos_ + 8);
        uint64_t n;
        std::memcpy(&n, at, 8);
        if (n > limits.maxKeysPerRequest) {
          return invalid("key count " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(limits.maxKeysPerRequest));
        }
        items_ = n;
        pos_ += 8;
        break;
      }
      case Field::Key:
      case Field::Value: {
        if (have < 8) return needMore(pos_ + 8);
        uint64_t len;
        std::memcpy(&len, at, 8);
        const bool isKey = f == Field::Key;
        const uint64_t max = isKey ? limits.maxKeyBytes : limits.maxValueBytes;
        if (len > max) {
          return invalid(std::string(isKey ? "key" : "value") + " length " +
                         std::to_string(len) + " exceeds the limit of " + bytesText(max));
        }
        if (have - 8 < len) return needMore(pos_ + 8 + len);
        (isKey ? req_.keys : req_.values).emplace_back(at + 8, static_cast<size_t>(len));
        pos_ += 8 + static_cast<size_t>(len);
        break;
      }
    }
    if (step_ < shape.headLen) {
      ++step_;
    } else if (++itemStep_ == shape.itemLen) {
      itemStep_ = 0;
      --items_;
    }
  }

  started_ = false;
  if (pos_ > limits.maxFrameBytes) {
    return invalid("frame of " + bytesText(pos_) + " exceeds the limit of " +
                   bytesText(limits.maxFrameBytes));
  }
  if (req_.op == Op::Validate && static_cast<uint32_t>(req_.integer) != kValidateMagic) {
    return invalid("VALIDATE with wrong magic " + std::to_string(req_.integer));
  }
  result.status = ParseStatus::Complete;
  result.consumed = pos_;
  std::swap(out, req_);  // req_ keeps `out`'s old allocations for the next frame
  return result;
}

ParseResult parseRequest(std::string_view bytes, Dialect dialect, const Limits& limits,
                         Request& out) {
  RequestParser parser;
  return parser.parse(bytes, dialect, limits, out);
}

}  // namespace ddprun::rendezvous::protocol
