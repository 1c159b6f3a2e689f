// The frame parser as a pure function: no sockets.
#include <catch2/catch.hpp>

#include "rendezvous/protocol.h"

using namespace ddprun::rendezvous::protocol;

namespace {

std::string cmd(Op op, Dialect d) { return std::string(1, static_cast<char>(*encodeCommand(op, d))); }

ParseResult parse(const std::string& bytes, Dialect d, Request& out, Limits limits = {}) {
  return parseRequest(bytes, d, limits, out);
}

}  // namespace

TEST_CASE("dialect detection from the first bytes", "[protocol]") {
  std::string validate("\x00\xCE\xF7\x85\x3C", 5);
  CHECK(detectDialect(validate) == Dialect::Current);
  CHECK(detectDialect(validate.substr(0, 3)) == std::nullopt);  // undecidable yet
  CHECK(detectDialect("") == std::nullopt);
  CHECK(detectDialect(std::string("\x06", 1)) == Dialect::Legacy);  // legacy GETNUMKEYS
  // A legacy SET: byte 0 then a u64 key length, never the magic in practice.
  std::string legacySet;
  FrameWriter(legacySet).u8(0).str("key").str("v");
  CHECK(detectDialect(legacySet) == Dialect::Legacy);
}

TEST_CASE("every operation round-trips through FrameWriter and parseRequest", "[protocol]") {
  for (Dialect d : {Dialect::Current, Dialect::Legacy}) {
    SECTION(std::string("dialect ") + dialectName(d)) {
      Request r;
      std::string f = cmd(Op::Set, d);
      FrameWriter(f).str("k").str(std::string("a\0b", 3));
      auto res = parse(f, d, r);
      REQUIRE(res.status == ParseStatus::Complete);
      CHECK(res.consumed == f.size());
      CHECK(r.op == Op::Set);
      CHECK(r.keys == std::vector<std::string>{"k"});
      CHECK(r.values == std::vector<std::string>{std::string("a\0b", 3)});

      f = cmd(Op::Add, d);
      FrameWriter(f).str("counter").i64(-7);
      REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
      CHECK(r.op == Op::Add);
      CHECK(r.integer == -7);

      f = cmd(Op::CompareSet, d);
      FrameWriter(f).str("k").str("old").str("new");
      REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
      CHECK(r.values == std::vector<std::string>{"old", "new"});

      f = cmd(Op::Wait, d);
      FrameWriter(f).u64(3).str("a").str("b").str("c");
      REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
      CHECK(r.op == Op::Wait);
      CHECK(r.keys == std::vector<std::string>{"a", "b", "c"});

      f = cmd(Op::GetNumKeys, d);
      REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
      CHECK(r.op == Op::GetNumKeys);

      f = cmd(Op::WaitGet, d);  // ddprun extension: the same byte in both dialects
      FrameWriter(f).str("k");
      REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
      CHECK(r.op == Op::WaitGet);
    }
  }
}

TEST_CASE("current-only operations", "[protocol]") {
  const Dialect d = Dialect::Current;
  Request r;
  std::string f = cmd(Op::MultiSet, d);
  FrameWriter(f).u64(2).str("a").str("1").str("b").str("2");
  REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
  CHECK(r.keys == std::vector<std::string>{"a", "b"});
  CHECK(r.values == std::vector<std::string>{"1", "2"});

  f = cmd(Op::Ping, d);
  FrameWriter(f).u32(1234);
  REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
  CHECK(r.integer == 1234);

  f = cmd(Op::QueuePop, d);
  FrameWriter(f).str("q");
  REQUIRE(parse(f, d, r).status == ParseStatus::Complete);
  CHECK(r.op == Op::QueuePop);

  // The legacy dialect has no APPEND: byte 9 is unknown there.
  CHECK(!encodeCommand(Op::Append, Dialect::Legacy));
  CHECK(parse(std::string(1, '\x09'), Dialect::Legacy, r).status == ParseStatus::Invalid);
  // Both numberings map the same bytes to different operations.
  CHECK(decodeCommand(0, Dialect::Legacy) == Op::Set);
  CHECK(decodeCommand(0, Dialect::Current) == Op::Validate);
  CHECK(decodeCommand(7, Dialect::Legacy) == Op::WatchKey);
  CHECK(decodeCommand(7, Dialect::Current) == Op::GetNumKeys);
}

TEST_CASE("a truncated frame needs more at every cut point", "[protocol]") {
  std::string f = cmd(Op::CompareSet, Dialect::Current);
  FrameWriter(f).str("some-key").str("expected").str("desired-value");
  Request r;
  for (size_t cut = 0; cut < f.size(); ++cut) {
    auto res = parse(f.substr(0, cut), Dialect::Current, r);
    INFO("cut at " << cut);
    REQUIRE(res.status == ParseStatus::NeedMore);
    CHECK(res.needAtLeast > cut);
    CHECK(res.needAtLeast <= f.size());
  }
  // Two frames back to back: the first is parsed alone.
  std::string two = f + f;
  auto res = parse(two, Dialect::Current, r);
  REQUIRE(res.status == ParseStatus::Complete);
  CHECK(res.consumed == f.size());
}

TEST_CASE("invalid frames say why", "[protocol]") {
  Request r;
  Limits small{.maxKeyBytes = 16, .maxValueBytes = 32, .maxKeysPerRequest = 4};

  auto res = parse(std::string(1, '\x33'), Dialect::Current, r);
  CHECK(res.status == ParseStatus::Invalid);
  CHECK_THAT(res.error, Catch::Contains("unknown command byte 51"));

  std::string f = cmd(Op::Set, Dialect::Current);
  FrameWriter(f).str(std::string(17, 'k')).str("v");
  res = parse(f, Dialect::Current, r, small);
  CHECK(res.status == ParseStatus::Invalid);
  CHECK_THAT(res.error, Catch::Contains("key length 17 exceeds the limit of 16"));

  // An oversized value is refused from its length field alone, before its bytes arrive.
  f = cmd(Op::Set, Dialect::Current);
  FrameWriter(f).str("k").u64(1ull << 40);
  res = parse(f, Dialect::Current, r, small);
  CHECK(res.status == ParseStatus::Invalid);
  CHECK_THAT(res.error, Catch::Contains("value length 1099511627776 exceeds"));

  f = cmd(Op::Wait, Dialect::Current);
  FrameWriter(f).u64(5);
  res = parse(f, Dialect::Current, r, small);
  CHECK(res.status == ParseStatus::Invalid);
  CHECK_THAT(res.error, Catch::Contains("key count 5 exceeds the limit of 4"));

  f = cmd(Op::Validate, Dialect::Current);
  FrameWriter(f).u32(0xDEADBEEF);
  res = parse(f, Dialect::Current, r);
  CHECK(res.status == ParseStatus::Invalid);
  CHECK_THAT(res.error, Catch::Contains("VALIDATE with wrong magic"));
}

TEST_CASE("a long value announces how many bytes it needs", "[protocol]") {
  std::string f = cmd(Op::Set, Dialect::Current);
  FrameWriter(f).str("k").u64(1000);
  Request r;
  auto res = parse(f, Dialect::Current, r);
  REQUIRE(res.status == ParseStatus::NeedMore);
  CHECK(res.needAtLeast == f.size() + 1000);
}
