#include "launcher/option_values.h"

#include <cctype>
#include <csignal>
#include <limits>
#include <cstdlib>
#include <cstring>

namespace ddprun::launcher {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos
                                                                 : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Strict decimal: digits only (an optional leading '-'), no spaces, no trailing junk.
std::optional<long long> toInteger(std::string_view v) {
  if (v.empty() || v.size() > 18) return std::nullopt;
  size_t i = (v[0] == '-') ? 1 : 0;
  if (i == v.size()) return std::nullopt;
  long long n = 0;
  for (; i < v.size(); ++i) {
    if (v[i] < '0' || v[i] > '9') return std::nullopt;
    n = n * 10 + (v[i] - '0');
  }
  if (v[0] == '-') return -n;
  return n;
}

std::string lower(std::string_view v) {
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct SignalEntry {
  const char* name;
  int number;
};
constexpr SignalEntry kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},     {"SIGQUIT", SIGQUIT}, {"SIGILL", SIGILL},
    {"SIGTRAP", SIGTRAP}, {"SIGABRT", SIGABRT},   {"SIGBUS", SIGBUS},   {"SIGFPE", SIGFPE},
    {"SIGKILL", SIGKILL}, {"SIGUSR1", SIGUSR1},   {"SIGSEGV", SIGSEGV}, {"SIGUSR2", SIGUSR2},
    {"SIGPIPE", SIGPIPE}, {"SIGALRM", SIGALRM},   {"SIGTERM", SIGTERM}, {"SIGCHLD", SIGCHLD},
    {"SIGCONT", SIGCONT}, {"SIGSTOP", SIGSTOP},   {"SIGTSTP", SIGTSTP}, {"SIGTTIN", SIGTTIN},
    {"SIGTTOU", SIGTTOU}, {"SIGURG", SIGURG},     {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ},
    {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF}, {"SIGWINCH", SIGWINCH}, {"SIGSYS", SIGSYS},
};

}  // namespace

int parseInt(std::string_view v, int min, int max) {
  auto n = toInteger(v);
  if (!n || *n < min || *n > max) {
    if (max == std::numeric_limits<int>::max()) {
      throw BadValue("expected an integer >= " + std::to_string(min));
    }
    throw BadValue("expected an integer from " + std::to_string(min) + " to " +
                   std::to_string(max));
  }
  return static_cast<int>(*n);
}

double parseSeconds(std::string_view v) {
  std::string s(v);
  char* end = nullptr;
  double d = s.empty() ? -1 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(d >= 0) || d > 1e9) {
    throw BadValue("expected a number of seconds >= 0 (e.g. 30 or 0.5)");
  }
  return d;
}

bool parseBool(std::string_view v) {
  const std::string s = lower(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw BadValue("expected 1/0, true/false, yes/no or on/off");
}

std::pair<int, int> parseNodeRange(std::string_view v) {
  constexpr const char* kAllowed = "expected N or MIN:MAX with 1 <= MIN <= MAX (e.g. 2 or 1:4)";
  auto parts = split(v, ':');
  if (parts.size() > 2) throw BadValue(kAllowed);
  auto lo = toInteger(parts[0]);
  auto hi = parts.size() == 2 ? toInteger(parts[1]) : lo;
  if (!lo || !hi || *lo < 1 || *lo > *hi || *hi > 1'000'000) throw BadValue(kAllowed);
  return {static_cast<int>(*lo), static_cast<int>(*hi)};
}

StreamSelection parseStreamSelection(std::string_view v) {
  constexpr const char* kAllowed =
      "expected 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank as "
      "LOCAL_RANK:0-3,... (e.g. 0:3,1:2)";
  StreamSelection sel;
  auto one = [&](std::string_view s) -> uint8_t {
    auto n = toInteger(trim(s));
    if (!n || *n < 0 || *n > 3) throw BadValue(kAllowed);
    return static_cast<uint8_t>(*n);
  };
  if (v.find(':') == std::string_view::npos) {
    sel.all = one(v);
    return sel;
  }
  for (auto item : split(v, ',')) {
    auto kv = split(item, ':');
    if (kv.size() != 2) throw BadValue(kAllowed);
    auto rank = toInteger(trim(kv[0]));
    if (!rank || *rank < 0 || *rank > 1'000'000) throw BadValue(kAllowed);
    sel.perRank[static_cast<int>(*rank)] = one(kv[1]);
  }
  return sel;
}

uint8_t StreamSelection::forRank(int localRank) const {
  if (perRank.empty()) return all;
  auto it = perRank.find(localRank);
  return it == perRank.end() ? uint8_t{kStdNone} : it->second;
}

std::set<int> parseRankList(std::string_view v) {
  std::set<int> ranks;
  if (trim(v).empty()) return ranks;
  for (auto item : split(v, ',')) {
    auto n = toInteger(trim(item));
    if (!n || *n < 0 || *n > 1'000'000) {
      throw BadValue("expected local ranks separated by commas (e.g. 0 or 0,2,3)");
    }
    ranks.insert(static_cast<int>(*n));
  }
  return ranks;
}

std::vector<std::pair<std::string, std::string>> parseKeyValues(std::string_view v) {
  std::vector<std::pair<std::string, std::string>> out;
  if (trim(v).empty()) return out;
  for (auto item : split(v, ',')) {
    auto eq = item.find('=');
    std::string key(trim(item.substr(0, eq)));
    if (eq == std::string_view::npos || key.empty()) {
      throw BadValue("expected key=value pairs separated by commas (e.g. join_timeout=600,"
                     "read_timeout=60)");
    }
    for (const auto& [k, _] : out) {
      if (k == key) throw BadValue("each key at most once; '" + key + "' repeats");
    }
    out.emplace_back(std::move(key), std::string(trim(item.substr(eq + 1))));
  }
  return out;
}

std::vector<int> parseSignalList(std::string_view v) {
  std::vector<int> out;
  for (auto item : split(v, ',')) {
    std::string name = lower(trim(item));
    for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
    int found = 0;
    for (const auto& s : kSignals) {
      if (name == s.name) found = s.number;
    }
    if (auto n = toInteger(trim(item)); n && *n > 0 && *n < NSIG) found = static_cast<int>(*n);
    if (found == 0 || found == SIGKILL || found == SIGSTOP || found == SIGCHLD) {
      throw BadValue("expected signal names or numbers separated by commas (e.g. "
                     "SIGTERM,SIGINT,SIGHUP,SIGQUIT); SIGKILL, SIGSTOP and SIGCHLD cannot be "
                     "handled");
    }
    out.push_back(found);
  }
  return out;
}

Endpoint parseEndpoint(std::string_view v) {
  constexpr const char* kAllowed = "expected HOST[:PORT] (IPv6 as [ADDR]:PORT, PORT 0-65535)";
  Endpoint ep;
  std::string_view portText;
  if (!v.empty() && v.front() == '[') {
    auto close = v.find(']');
    if (close == std::string_view::npos || close == 1) throw BadValue(kAllowed);
    ep.host = std::string(v.substr(1, close - 1));
    auto rest = v.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw BadValue(kAllowed);
      portText = rest.substr(1);
      if (portText.empty()) throw BadValue(kAllowed);
    }
  } else {
    auto colon = v.rfind(':');
    if (colon != std::string_view::npos && v.find(':') != colon) {
      ep.host = std::string(v);  // a bare IPv6 address without a port
    } else {
      ep.host = std::string(v.substr(0, colon));
      if (colon != std::string_view::npos) {
        portText = v.substr(colon + 1);
        if (portText.empty()) throw BadValue(kAllowed);
      }
    }
  }
  if (ep.host.empty()) throw BadValue(kAllowed);
  if (!portText.empty()) {
    auto n = toInteger(portText);
    if (!n || *n < 0 || *n > 65535) throw BadValue(kAllowed);
    ep.port = static_cast<uint16_t>(*n);
  }
  return ep;
}

std::vector<Endpoint> parseEndpointList(std::string_view v) {
  std::vector<Endpoint> out;
  for (auto item : split(v, ',')) {
    try {
      out.push_back(parseEndpoint(item));
    } catch (const BadValue&) {
      throw BadValue("expected HOST:PORT[,HOST:PORT...] (IPv6 as [ADDR]:PORT); '" +
                     std::string(item) + "' is not an endpoint");
    }
  }
  return out;
}

int parseNproc(std::string_view v, const DeviceCounts& devices) {
  const std::string s = lower(v);
  if (s == "cpu") return devices.cpus();
  if (s == "gpu") {
    const int n = devices.gpus();
    if (n <= 0) throw BadValue("no CUDA device is visible here; use a number, 'cpu' or 'auto'");
    return n;
  }
  if (s == "auto") {
    const int n = devices.gpus();
    return n > 0 ? n : devices.cpus();
  }
  auto n = toInteger(v);
  if (!n || *n < 1 || *n > 65536) {
    throw BadValue("expected a number of workers >= 1, 'cpu', 'gpu' or 'auto'");
  }
  return static_cast<int>(*n);
}

std::string signalName(int sig) {
  for (const auto& s : kSignals) {
    if (s.number == sig) return s.name;
  }
  return "signal " + std::to_string(sig);
}

}  // namespace ddprun::launcher
