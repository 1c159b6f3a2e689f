// Fuzz target: the store's frame parser (rendezvous/protocol.h) in both dialects.
// Input: one byte choosing the dialect (bit 0), then the byte stream of one connection. Every
// frame is parsed in turn until the parser needs more or refuses; a Complete frame must consume
// bytes. Each frame is also fed to a RequestParser in growing pieces (the size chosen by bits
// 1-3 of the first byte), as a connection does: it must reach the same result as one call.
#include <algorithm>
#include <cstdint>
#include <string_view>

#include "rendezvous/protocol.h"

using namespace ddprun::rendezvous::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Dialect dialect = (data[0] & 1) ? Dialect::Legacy : Dialect::Current;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Limits limits{.maxKeyBytes = 4096, .maxValueBytes = 1 << 20, .maxKeysPerRequest = 1024};
  const size_t step = 1 + ((data[0] >> 1) & 7);
  Request req, pieces;
  RequestParser parser;
  while (!in.empty()) {
    const ParseResult r = parseRequest(in, dialect, limits, req);
    // The same bytes in pieces: the prefix grows until the parser stops asking for more.
    ParseResult p;
    for (size_t have = std::min(step, in.size());; have = std::min(have + step, in.size())) {
      p = parser.parse(in.substr(0, have), dialect, limits, pieces);
      if (p.status != ParseStatus::NeedMore || have == in.size()) break;
    }
    if (p.status != r.status) __builtin_trap();
    if (r.status == ParseStatus::NeedMore) parser.reset();
    if (r.status != ParseStatus::Complete) break;
    if (r.consumed == 0 || r.consumed > in.size()) __builtin_trap();
    if (p.consumed != r.consumed || pieces.op != req.op || pieces.keys != req.keys ||
        pieces.values != req.values || pieces.integer != req.integer) {
      __builtin_trap();
    }
    in.remove_prefix(r.consumed);
  }
  return 0;
}
