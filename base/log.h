#pragma once
// Logging: one macro family, level chosen at run time from DDPRUN_LOG_LEVEL
// (error, warn, info, debug; default info). Each line is written with a single
// write(2) to stderr, so lines from several threads or processes never interleave,
// and carries a prefix naming the component and, when set, the rank.
//
//   DDPRUN_LOG(INFO, "store") << "listening on " << port;
#include <sstream>
#include <string>
#include <string_view>

namespace ddprun::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3 };

// The level read once from DDPRUN_LOG_LEVEL; setLevel overrides it (tests, --verbose).
Level level();
void setLevel(Level l);
// An identity appended to every prefix, e.g. "rank 3"; empty by default.
void setIdentity(std::string identity);

bool enabled(Level l);

// `text` with every control character made visible (\n, \r, \t kept as those two-character
// escapes, others as \xNN, DEL as \x7f), so that text a worker or a peer controls -- store
// keys, error messages, file contents -- can neither forge lines nor send terminal escapes.
// With keepNewlines, '\n' and '\t' pass through (multi-line report sections that are
// indented line by line). Bytes >= 0x80 (UTF-8) pass through.
std::string escaped(std::string_view text, bool keepNewlines = false);

// Accumulates one line and emits it from its destructor. What follows the prefix is passed
// through escaped(): a log line is always exactly one line.
class Line {
 public:
  Line(Level l, std::string_view component);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;
  template <typename T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
  size_t prefixSize_ = 0;
};

// Turns a Line into void so both arms of DDPRUN_LOG's ?: have one type (& binds looser
// than <<, so the whole line is built first).
struct Voidify {
  void operator&(const Line&) {}
};

}  // namespace ddprun::log

// An expression, not an if/else, so that `if (x) DDPRUN_LOG(...) << y; else ...` binds as
// written; the line is neither built nor formatted when its level is off.
#define DDPRUN_LOG(LEVEL, COMPONENT)                                           \
  !::ddprun::log::enabled(::ddprun::log::Level::DDPRUN_LVL_##LEVEL)            \
      ? (void)0                                                                \
      : ::ddprun::log::Voidify() &                                             \
            ::ddprun::log::Line(::ddprun::log::Level::DDPRUN_LVL_##LEVEL, COMPONENT)

#define DDPRUN_LVL_ERROR Error
#define DDPRUN_LVL_WARN Warn
#define DDPRUN_LVL_INFO Info
#define DDPRUN_LVL_DEBUG Debug
