// Fuzz target: the rendezvous state codec (rendezvous/round_state.h). Any text either decodes
// or is refused with StoreError; a decoded state encodes to text that decodes to the same state.
#include <cstdint>
#include <string>

#include "base/errors.h"
#include "rendezvous/round_state.h"

using namespace ddprun::rendezvous;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  RoundState s;
  try {
    s = decodeState(text, "'fuzz'");
  } catch (const ddprun::StoreError&) {
    return 0;  // refused, with a message: fine
  }
  const RoundState again = decodeState(encodeState(s), "'fuzz re-encoded'");
  if (!(again == s)) __builtin_trap();
  return 0;
}
