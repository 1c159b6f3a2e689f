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

// Accumulates one line and emits it from its destructor.
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
