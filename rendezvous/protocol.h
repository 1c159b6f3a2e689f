#pragma once
// The store's wire protocol, declared once. docs/protocol.md explains it in prose.
//
// Frame layout (both dialects, host byte order = little-endian on every platform we run on):
//
//   request  := u8 command, then its arguments
//   string   := u64 length, then `length` bytes          (keys and values alike)
//   integer  := i64;   count := u64;   nonce/magic := u32
//
//   command      arguments                         reply
//   -----------  --------------------------------  -----------------------------------
//   VALIDATE     u32 magic (0x3C85F7CE)            none (current dialect's first frame)
//   PING         u32 nonce                         u32 nonce
//   SET          key, value                        none
//   COMPARE_SET  key, expected, desired            string (the value afterwards)
//   GET          key                               string
//   ADD          key, i64 delta                    i64 (the new value)
//   CHECK        count n, n keys                   u8 READY=0 | NOT_READY=1
//   WAIT         count n, n keys                   u8 STOP_WAITING=0 (when all keys exist)
//   GETNUMKEYS   -                                 i64
//   WATCH_KEY    key (legacy only; accepted, never answered)
//   DELETE_KEY   key                               i64 (0 or 1)
//   APPEND       key, value                        none
//   MULTI_GET    count n, n keys                   n strings
//   MULTI_SET    count n, n x (key, value)         none
//   CANCEL_WAIT  -                                 u8 WAIT_CANCELED=1
//   QUEUE_PUSH   key, value                        none
//   QUEUE_POP    key                               i64 length before the pop, then string if it was > 0
//   QUEUE_LEN    key                               i64
//   -- ddprun extensions, the same byte in both dialects, outside torch's command range --
//   HELLO        -                                 string identity, u8 auth required, string nonce
//   AUTH         string nonce, string proof        u8 AUTH_OK=0, then string the server's proof
//                                                  | u8 AUTH_REFUSED=1  (rendezvous/auth.h)
//   WAIT_GET     key                               u8 STOP_WAITING, then string (one round trip get)
//   INFO         -                                 string instance id, string job (its run id, or
//                                                  empty: ddprun-store serves any job)
//   CLOCK        -                                 i64 the server's clock, system_clock microseconds
//                                                  (the timeline's clock-offset pings)
//
// Everything here is pure: no sockets, no clocks. The server feeds bytes to parseRequest();
// the client builds frames with FrameWriter and reads replies with FrameReader.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rendezvous::protocol {

// Command bytes of torch >= 2.2 ("current" dialect).
enum class CurrentCommand : uint8_t {
  Validate = 0, Set = 1, CompareSet = 2, Get = 3, Add = 4, Check = 5, Wait = 6,
  GetNumKeys = 7, DeleteKey = 8, Append = 9, MultiGet = 10, MultiSet = 11,
  CancelWait = 12, Ping = 13, QueuePush = 14, QueuePop = 15, QueueLen = 16,
};

// Command bytes of torch 1.13 ("legacy" dialect).
enum class LegacyCommand : uint8_t {
  Set = 0, CompareSet = 1, Get = 2, Add = 3, Check = 4, Wait = 5,
  GetNumKeys = 6, WatchKey = 7, DeleteKey = 8,
};

// ddprun's own commands: valid in both dialects.
enum class ExtensionCommand : uint8_t { Hello = 0x60, Auth = 0x61, WaitGet = 0x62, Info = 0x63,
                                       Clock = 0x64 };

enum class CheckReply : uint8_t { Ready = 0, NotReady = 1 };
enum class WaitReply : uint8_t { StopWaiting = 0, WaitCanceled = 1 };
enum class AuthReply : uint8_t { Ok = 0, Refused = 1 };

inline constexpr uint32_t kValidateMagic = 0x3C85F7CE;
inline constexpr std::string_view kServerIdentity = "ddprun-store/2";

enum class Dialect : uint8_t { Current, Legacy };
const char* dialectName(Dialect d);

// Dialect-independent operations; the server dispatches on these with one switch.
enum class Op : uint8_t {
  Validate, Ping, Set, CompareSet, Get, Add, Check, Wait, GetNumKeys, WatchKey, DeleteKey,
  Append, MultiGet, MultiSet, CancelWait, QueuePush, QueuePop, QueueLen, Hello, Auth, WaitGet,
  Info, Clock,
};
const char* opName(Op op);

// Maps a command byte of `dialect` to its operation; nullopt for an unknown byte.
std::optional<Op> decodeCommand(uint8_t byte, Dialect dialect);
// The byte that carries `op` in `dialect`; nullopt when the dialect lacks it.
std::optional<uint8_t> encodeCommand(Op op, Dialect dialect);

// The limits of one frame; a frame beyond them closes its connection. The server's other limits
// (memory, connections, deadlines) are in rendezvous/store_limits.h.
struct Limits {
  uint64_t maxKeyBytes = 64 * 1024;
  uint64_t maxValueBytes = 64 * 1024 * 1024;
  uint64_t maxKeysPerRequest = 128 * 1024;
  // The whole frame, command byte included: bounds what one frame makes the server buffer
  // (a MULTI_SET of many values, a COMPARE_SET of two big ones). Room for one maximal value.
  uint64_t maxFrameBytes = 65 * 1024 * 1024;
};

// One decoded request. Which fields are used depends on op:
//   keys   : the key(s) (SET/GET/... one; CHECK/WAIT/MULTI_* n)
//   values : SET/APPEND/QUEUE_PUSH value; COMPARE_SET {expected, desired}; MULTI_SET n values;
//            AUTH {client nonce, proof}
//   integer: ADD delta, VALIDATE magic, PING nonce
struct Request {
  Op op = Op::Ping;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t integer = 0;
};

enum class ParseStatus : uint8_t { Complete, NeedMore, Invalid };

struct ParseResult {
  ParseStatus status = ParseStatus::NeedMore;
  size_t consumed = 0;    // bytes of the frame, when Complete
  size_t needAtLeast = 0; // when NeedMore: the buffer must reach this size before a retry helps
  std::string error;      // when Invalid: why, naming the field and value
};

// Decodes the frames of one connection, one at a time. Pure: no sockets, no clocks.
// Call parse() with the buffered bytes of the frame being decoded (they start at the frame's
// first byte), again with more of them each time it answers NeedMore: it resumes at the first
// field it has not decoded yet, so a frame costs O(its bytes) however it arrives (a frame of
// 100k keys that arrives in 10k pieces is not re-read from its start 10k times). After
// Complete or Invalid the next call starts a new frame. `bytes` may extend past the frame.
class RequestParser {
 public:
  ParseResult parse(std::string_view bytes, Dialect dialect, const Limits& limits, Request& out);
  // Forgets a partly decoded frame.
  void reset() { started_ = false; }
  // Whether a frame has been started and not completed.
  bool inFrame() const { return started_; }

 private:
  bool started_ = false;
  size_t pos_ = 0;        // bytes of the frame decoded so far
  uint8_t step_ = 0;      // next field of the operation's fixed head
  uint8_t itemStep_ = 0;  // next field of the current list item
  uint64_t items_ = 0;    // list items still to decode (CHECK, WAIT, MULTI_GET, MULTI_SET)
  Request req_;           // the frame being decoded; swapped into `out` when Complete
};

// Decodes the first frame of `bytes` from scratch. Pure; `out` is overwritten when Complete.
ParseResult parseRequest(std::string_view bytes, Dialect dialect, const Limits& limits,
                         Request& out);

// Decides a connection's dialect from its first bytes: nullopt while undecidable.
// Current clients open with VALIDATE + magic (00 CE F7 85 3C); anything else is legacy.
std::optional<Dialect> detectDialect(std::string_view firstBytes);

// Appends protocol values to a byte string.
class FrameWriter {
 public:
  explicit FrameWriter(std::string& out) : out_(out) {}
  FrameWriter& u8(uint8_t v) { out_.push_back(static_cast<char>(v)); return *this; }
  FrameWriter& u32(uint32_t v) { return raw(&v, sizeof v); }
  FrameWriter& i64(int64_t v) { return raw(&v, sizeof v); }
  FrameWriter& u64(uint64_t v) { return raw(&v, sizeof v); }
  FrameWriter& str(std::string_view s) { u64(s.size()); out_.append(s); return *this; }

 private:
  FrameWriter& raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string& out_;
};

// Reads protocol values from a byte buffer; each read returns false when the buffer is short.
class FrameReader {
 public:
  explicit FrameReader(std::string_view in) : in_(in) {}
  bool u8(uint8_t& v) { return raw(&v, sizeof v); }
  bool u32(uint32_t& v) { return raw(&v, sizeof v); }
  bool i64(int64_t& v) { return raw(&v, sizeof v); }
  bool u64(uint64_t& v) { return raw(&v, sizeof v); }
  // Reads a string header and body; `maxLen` guards against absurd lengths. `tooLong` tells
  // a refused length apart from a short buffer.
  bool str(std::string& s, uint64_t maxLen, bool& tooLong, uint64_t& len);
  size_t offset() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  bool raw(void* p, size_t n);
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace ddprun::rendezvous::protocol
