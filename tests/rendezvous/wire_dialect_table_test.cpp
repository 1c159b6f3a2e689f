// The command bytes of both TCPStore dialects, checked against the values in PyTorch's own
// sources rather than against our own enums. No torch >= 2.2 client can be installed from
// Debian (python3-torch is 1.13.1), so for the current dialect this table is the check; the
// legacy dialect is also exercised against the real 1.13 client and server (interop tests).
//
// Current dialect: pytorch/pytorch, torch/csrc/distributed/c10d/TCPStoreBackend.hpp at commit
//   0278b21833d7b408738c5a0cc23f1a31d1e219bc: `enum class QueryType : uint8_t { VALIDATE, SET,
//   COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET,
//   CANCEL_WAIT }` (so 0..12 in that order), CheckResponseType { READY, NOT_READY },
//   WaitResponseType { STOP_WAITING, WAIT_CANCELED }, validationMagicNumber = 0x3C85F7CE.
//   PING (13) and QUEUE_PUSH/POP/LEN (14..16) were appended to the same enum later; they are
//   not in that commit (see docs/protocol.md).
// Legacy dialect: PyTorch v1.13.1, torch/csrc/distributed/c10d/TCPStore.cpp: `enum class
//   QueryType : uint8_t { SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY,
//   DELETE_KEY }` (0..8), the same two response enums.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <string>
#include <tuple>

#include "rendezvous/protocol.h"

using namespace ddprun::rendezvous::protocol;

namespace {

struct Row {
  const char* torchName;
  uint8_t byte;
  Op op;
};

// Copied by hand from the sources named above: byte values, not our enum's.
const Row kCurrent[] = {
    {"VALIDATE", 0, Op::Validate},     {"SET", 1, Op::Set},
    {"COMPARE_SET", 2, Op::CompareSet}, {"GET", 3, Op::Get},
    {"ADD", 4, Op::Add},               {"CHECK", 5, Op::Check},
    {"WAIT", 6, Op::Wait},             {"GETNUMKEYS", 7, Op::GetNumKeys},
    {"DELETE_KEY", 8, Op::DeleteKey},  {"APPEND", 9, Op::Append},
    {"MULTI_GET", 10, Op::MultiGet},   {"MULTI_SET", 11, Op::MultiSet},
    {"CANCEL_WAIT", 12, Op::CancelWait}, {"PING", 13, Op::Ping},
    {"QUEUE_PUSH", 14, Op::QueuePush}, {"QUEUE_POP", 15, Op::QueuePop},
    {"QUEUE_LEN", 16, Op::QueueLen},
};

const Row kLegacy[] = {
    {"SET", 0, Op::Set},           {"COMPARE_SET", 1, Op::CompareSet},
    {"GET", 2, Op::Get},           {"ADD", 3, Op::Add},
    {"CHECK", 4, Op::Check},       {"WAIT", 5, Op::Wait},
    {"GETNUMKEYS", 6, Op::GetNumKeys}, {"WATCH_KEY", 7, Op::WatchKey},
    {"DELETE_KEY", 8, Op::DeleteKey},
};

}  // namespace

TEST_CASE("wire dialects: command bytes as PyTorch's sources number them", "[protocol][dialect]") {
  for (const auto& [dialect, rows, count] :
       {std::tuple{Dialect::Current, kCurrent, std::size(kCurrent)},
        std::tuple{Dialect::Legacy, kLegacy, std::size(kLegacy)}}) {
    for (size_t i = 0; i < count; ++i) {
      const Row& r = rows[i];
      INFO(dialectName(dialect) << " " << r.torchName << " = " << int(r.byte));
      CHECK(decodeCommand(r.byte, dialect) == r.op);
      CHECK(encodeCommand(r.op, dialect) == r.byte);
    }
  }
  // Torch's response bytes.
  CHECK(static_cast<uint8_t>(CheckReply::Ready) == 0);
  CHECK(static_cast<uint8_t>(CheckReply::NotReady) == 1);
  CHECK(static_cast<uint8_t>(WaitReply::StopWaiting) == 0);
  CHECK(static_cast<uint8_t>(WaitReply::WaitCanceled) == 1);
  // Bytes that name no torch command in the legacy dialect are not taken for one.
  CHECK_FALSE(decodeCommand(9, Dialect::Legacy).has_value());
}

TEST_CASE("wire dialects: a current client's opening bytes, byte for byte", "[protocol][dialect]") {
  // VALIDATE then the magic, little-endian, as TCPStore.cpp's client sends it on connect.
  const std::string opening("\x00\xCE\xF7\x85\x3C", 5);
  CHECK(detectDialect(opening) == Dialect::Current);
  Request r;
  auto res = parseRequest(opening, Dialect::Current, Limits{}, r);
  REQUIRE(res.status == ParseStatus::Complete);
  CHECK(res.consumed == 5);
  CHECK(r.op == Op::Validate);
  CHECK(static_cast<uint32_t>(r.integer) == 0x3C85F7CE);

  // A current SET: command 1, u64 key length, key, u64 value length, value (host order).
  std::string set("\x01", 1);
  set += std::string("\x03\0\0\0\0\0\0\0", 8) + "key" + std::string("\x02\0\0\0\0\0\0\0", 8) + "v1";
  res = parseRequest(set, Dialect::Current, Limits{}, r);
  REQUIRE(res.status == ParseStatus::Complete);
  CHECK(res.consumed == set.size());
  CHECK(r.op == Op::Set);
  REQUIRE(r.keys.size() == 1);
  CHECK(r.keys[0] == "key");
  REQUIRE(r.values.size() == 1);
  CHECK(r.values[0] == "v1");

  // The same bytes from a 1.13 client are a COMPARE_SET's start (legacy numbering).
  CHECK(decodeCommand(1, Dialect::Legacy) == Op::CompareSet);
}
