#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace ddprun::log {
namespace {

Level parseLevel(const char* s) {
  if (s == nullptr) return Level::Info;
  std::string v(s);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "error") return Level::Error;
  if (v == "warn" || v == "warning") return Level::Warn;
  if (v == "debug" || v == "trace") return Level::Debug;
  return Level::Info;
}

std::atomic<int>& levelStore() {
  static std::atomic<int> l{static_cast<int>(parseLevel(std::getenv("DDPRUN_LOG_LEVEL")))};
  return l;
}

std::mutex& identityMutex() {
  static std::mutex m;
  return m;
}
std::string& identityStore() {
  static std::string s;
  return s;
}

const char* levelName(Level l) {
  switch (l) {
    case Level::Error: return "E";
    case Level::Warn: return "W";
    case Level::Info: return "I";
    case Level::Debug: return "D";
  }
  return "?";
}

}  // namespace

std::string escaped(std::string_view text, bool keepNewlines) {
  std::string out;
  out.reserve(text.size());
  static const char kHex[] = "0123456789abcdef";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
    } else if (keepNewlines && (c == '\n' || c == '\t')) {
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

Level level() { return static_cast<Level>(levelStore().load(std::memory_order_relaxed)); }
void setLevel(Level l) { levelStore().store(static_cast<int>(l)); }
void setIdentity(std::string identity) {
  std::lock_guard<std::mutex> g(identityMutex());
  identityStore() = std::move(identity);
}
bool enabled(Level l) { return static_cast<int>(l) <= levelStore().load(std::memory_order_relaxed); }

Line::Line(Level l, std::string_view component) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%H:%M:%S", &tm);
  char msbuf[8];
  std::snprintf(msbuf, sizeof msbuf, ".%03d", static_cast<int>(ms));
  os_ << "[ddprun " << levelName(l) << " " << ts << msbuf << " " << component;
  {
    std::lock_guard<std::mutex> g(identityMutex());
    if (!identityStore().empty()) os_ << " " << identityStore();
  }
  os_ << "] ";
  prefixSize_ = static_cast<size_t>(os_.tellp());
}

Line::~Line() {
  std::string s = os_.str();
  const std::string_view body = std::string_view(s).substr(prefixSize_);
  bool clean = true;
  for (char ch : body) {
    const auto c = static_cast<unsigned char>(ch);
    clean = clean && c >= 0x20 && c != 0x7f;
  }
  if (!clean) s = s.substr(0, prefixSize_) + escaped(body);
  s += '\n';
  // One write per line: atomic with respect to other writers of the same pipe (< PIPE_BUF)
  // and never interleaved inside a line for longer ones from this process.
  static std::mutex m;
  std::lock_guard<std::mutex> g(m);
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

}  // namespace ddprun::log
