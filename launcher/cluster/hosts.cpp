#include "launcher/cluster/hosts.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "base/errors.h"

namespace ddprun::launcher::cluster {
namespace {

constexpr int kMaxSlots = 1 << 16;

// A destination ssh accepts: no blanks, no leading '-', no shell or control characters.
bool validHost(std::string_view h) {
  if (h.empty() || h.front() == '-') return false;
  for (char c : h) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && std::strchr(".-_@:[]%", c) == nullptr) return false;
  }
  return true;
}

std::optional<int> slotCount(std::string_view text) {
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > kMaxSlots)
    return std::nullopt;
  return n;
}

void checkUnique(const std::vector<HostSlots>& hosts, const std::string& where) {
  std::set<std::string> seen;
  for (const auto& h : hosts) {
    if (!seen.insert(h.host).second) {
      throw ConfigError(where + ": host '" + h.host +
                        "' is listed twice: list it once with all its slots");
    }
  }
}

}  // namespace

std::vector<HostSlots> parseHosts(std::string_view list) {
  const std::string where = "--hosts=" + std::string(list);
  auto bad = [&](std::string_view item, const std::string& why) {
    return ConfigError(where + ": '" + std::string(item) + "' " + why +
                       " (expected HOST[:SLOTS],... e.g. h1:2,h2:2)");
  };
  std::vector<HostSlots> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    const std::string_view item = list.substr(start, comma - start);
    if (item.empty()) throw bad(item, "is empty");
    HostSlots h;
    // The slots follow the last ':' outside brackets; a bare IPv6 address needs brackets.
    const size_t bracket = item.rfind(']');
    const size_t colon = item.rfind(':');
    std::string_view host = item;
    if (colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket)) {
      host = item.substr(0, colon);
      h.slots = slotCount(item.substr(colon + 1));
      if (!h.slots) throw bad(item, "has slots that are not a number in 1..65536");
    }
    if (bracket == std::string_view::npos && host.find(':') != std::string_view::npos)
      throw bad(item, "is an IPv6 address without brackets");
    if (!validHost(host)) throw bad(item, "is not a host name or address");
    h.host = std::string(host);
    out.push_back(std::move(h));
    start = comma + 1;
  }
  checkUnique(out, where);
  return out;
}

std::vector<HostSlots> parseHostfile(std::string_view text, const std::string& name) {
  std::vector<HostSlots> out;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = "--hostfile " + name + ":" + std::to_string(number);
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    if (!validHost(host)) {
      throw ConfigError(where + ": '" + host + "' is not a host name or address (lines are "
                                               "'HOST slots=N', '#' starts a comment)");
    }
    HostSlots h{.host = host};
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0) {
        h.slots = slotCount(std::string_view(word).substr(6));
        if (!h.slots) throw ConfigError(where + ": '" + word + "': expected slots=N, N in 1..65536");
      } else if (word.rfind("max_slots=", 0) == 0 || word.rfind("max-slots=", 0) == 0) {
        // Open MPI's upper bound: ddprun starts `slots` workers.
      } else {
        throw ConfigError(where + ": unexpected '" + word + "' (lines are 'HOST slots=N')");
      }
    }
    out.push_back(std::move(h));
  }
  if (out.empty()) throw ConfigError("--hostfile " + name + ": names no host");
  checkUnique(out, "--hostfile " + name);
  return out;
}

std::vector<HostSlots> readHostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--hostfile " + path + ": cannot read it: " + std::strerror(errno));
  std::stringstream s;
  s << in.rdbuf();
  return parseHostfile(s.str(), path);
}

std::string hostAddress(const std::string& destination) {
  std::string h = destination.substr(destination.find('@') + 1);  // npos + 1 == 0
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h;
}

}  // namespace ddprun::launcher::cluster
