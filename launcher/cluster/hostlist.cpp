#include "launcher/cluster/hostlist.h"

#include <cctype>
#include <cstdint>

#include "base/errors.h"

namespace ddprun::launcher::cluster {
namespace {

[[noreturn]] void bad(std::string_view list, const std::string& why) {
  throw ConfigError("hostlist '" + std::string(list) + "': " + why +
                    " (allowed: NAME, PREFIX[1-4,07]SUFFIX, items separated by commas)");
}

bool allDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The numbers of one bracket's content ("01-04,07") as text, padded as Slurm pads them.
std::vector<std::string> expandBracket(std::string_view list, std::string_view inside) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= inside.size()) {
    size_t comma = inside.find(',', start);
    if (comma == std::string_view::npos) comma = inside.size();
    const std::string_view part = inside.substr(start, comma - start);
    const size_t dash = part.find('-');
    const std::string_view lo = part.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : part.substr(dash + 1);
    if (!allDigits(lo) || !allDigits(hi) || lo.size() > 9 || hi.size() > 9) {
      bad(list, "'[" + std::string(inside) + "]' has '" + std::string(part) +
                    "', expected N or N-M with decimal numbers");
    }
    const uint64_t a = std::stoull(std::string(lo));
    const uint64_t b = std::stoull(std::string(hi));
    if (b < a) {
      bad(list, "the range '" + std::string(part) + "' ends below its start");
    }
    if (b - a + 1 + out.size() > kMaxHostlistNames) {
      bad(list, "more than " + std::to_string(kMaxHostlistNames) + " names");
    }
    const size_t width = lo.size() > 1 && lo[0] == '0' ? lo.size() : 0;
    for (uint64_t v = a; v <= b; ++v) {
      std::string n = std::to_string(v);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      out.push_back(std::move(n));
    }
    start = comma + 1;
  }
  return out;
}

// One item: text and brackets, expanded as a cartesian product, left bracket outermost.
void expandItem(std::string_view list, std::string_view item, std::vector<std::string>& out) {
  std::vector<std::string> names{""};
  size_t i = 0;
  while (i < item.size()) {
    const size_t open = item.find_first_of("[]", i);
    if (open == std::string_view::npos || item[open] == ']') {
      if (open != std::string_view::npos) bad(list, "a ']' without its '['");
      for (auto& n : names) n.append(item.substr(i));
      break;
    }
    const size_t close = item.find_first_of("[]", open + 1);
    if (close == std::string_view::npos || item[close] == '[') {
      bad(list, close == std::string_view::npos ? "a '[' without its ']'"
                                                : "brackets inside brackets");
    }
    const std::string_view text = item.substr(i, open - i);
    const std::vector<std::string> numbers =
        expandBracket(list, item.substr(open + 1, close - open - 1));
    if (names.size() * numbers.size() + out.size() > kMaxHostlistNames) {
      bad(list, "more than " + std::to_string(kMaxHostlistNames) + " names");
    }
    std::vector<std::string> next;
    next.reserve(names.size() * numbers.size());
    for (const auto& n : names)
      for (const auto& num : numbers) next.push_back(n + std::string(text) + num);
    names = std::move(next);
    i = close + 1;
  }
  for (auto& n : names) out.push_back(std::move(n));
}

}  // namespace

std::vector<std::string> expandHostlist(std::string_view list) {
  if (list.empty()) bad(list, "empty");
  for (char c : list) {
    if (std::isspace(static_cast<unsigned char>(c)) || !std::isprint(static_cast<unsigned char>(c)))
      bad(list, "a blank or control character");
  }
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c != ',' || (depth > 0 && i < list.size())) continue;  // the end closes the last item
    if (i == start) bad(list, "an empty item");
    expandItem(list, list.substr(start, i - start), out);
    start = i + 1;
  }
  return out;
}

}  // namespace ddprun::launcher::cluster
