#pragma once
// Slurm's hostlist syntax, expanded by a pure function.
//
//   "n[1-3]"               -> n1 n2 n3
//   "gpu[01-04,07],login1" -> gpu01 gpu02 gpu03 gpu04 gpu07 login1   (leading zeros kept)
//   "r[1-2]-n[1-2]"        -> r1-n1 r1-n2 r2-n1 r2-n2                 (several brackets)
//
// As in Slurm, a range's width is the width of its lower bound when that has leading zeros
// ("[08-10]" -> 08 09 10; "[8-10]" -> 8 9 10). Commas outside brackets separate items.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher::cluster {

// At most this many names: a typo such as "n[1-99999999]" is refused, not allocated.
inline constexpr size_t kMaxHostlistNames = 100'000;

// Expands `list` in order, duplicates kept. Throws ConfigError naming `list`, the offending
// part and what is allowed (empty items, unbalanced or nested brackets, a range whose end is
// below its start, a bound that is not a number, too many names).
std::vector<std::string> expandHostlist(std::string_view list);

}  // namespace ddprun::launcher::cluster
