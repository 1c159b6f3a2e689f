#pragma once
// Internal to rendezvous/: the word-level parsing shared by the pure codecs of rendezvous keys
// (round_state_codec.cpp: the state log's versions; scalable/slot_join.cpp: the slot join's
// records and closing key). One definition of what a node id, an address and a number are, so
// that a value one codec accepts the other cannot refuse (or the reverse).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <string_view>
#include <vector>

namespace ddprun::rendezvous::text {

// Splits a line into its space-separated words (runs of spaces are one separator).
inline std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

// A whole word as a decimal number of type T (no sign for unsigned T, no trailing bytes).
template <typename T>
bool number(std::string_view w, T& v) {
  auto r = std::from_chars(w.data(), w.data() + w.size(), v);
  return r.ec == std::errc() && r.ptr == w.data() + w.size();
}

// A node id: what DynamicRendezvous makes (address-pid-hex), printable, no white space.
inline bool validId(std::string_view id) {
  if (id.empty() || id.size() > 256) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

// An advertised address: a host name, an IPv4 address or an IPv6 one (scope id allowed).
inline bool validAddress(std::string_view a) {
  if (a.empty() || a.size() > 255) return false;
  return std::all_of(a.begin(), a.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
           c == ':' || c == '%' || c == '[' || c == ']';
  });
}

}  // namespace ddprun::rendezvous::text
