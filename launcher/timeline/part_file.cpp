#include "launcher/timeline/part_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace ddprun::launcher::timeline {

using nlohmann::json;

int jsonDepth(std::string_view text, int stopAbove) {
  int depth = 0, deepest = 0;
  bool inString = false, escaped = false;
  for (const char c : text) {
    if (inString) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        inString = false;
      }
      continue;
    }
    if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > stopAbove) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

namespace {

// The first `max` bytes of a regular file, or nullopt. O_NONBLOCK: opening a FIFO never waits.
std::optional<std::string> readBounded(const std::string& path, uint64_t max, bool& cut) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return std::nullopt;
  }
  std::string data;
  data.resize(static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), max)));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the file shrank meanwhile: keep what was read
    got += static_cast<size_t>(n);
  }
  // Still more (the file was longer, or grew after fstat): say it was cut.
  char probe;
  cut = static_cast<uint64_t>(st.st_size) > max || (got == data.size() && ::read(fd, &probe, 1) > 0);
  ::close(fd);
  data.resize(got);
  return data;
}

json parseLine(std::string_view line, int maxDepth) {
  if (jsonDepth(line, maxDepth) > maxDepth) return json();  // discarded: not an event
  return json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
}


std::optional<PartClock> clockLine(const json& e) {
  if (!e.is_object() || !e.contains("clock") || !e["clock"].is_object()) return std::nullopt;
  const json& c = e["clock"];
  if (!c.contains("offset_us") || !boundedInt(c["offset_us"]) || !c.contains("bound_us") ||
      !boundedInt(c["bound_us"], 0)) {
    return std::nullopt;
  }
  const json ref = c.value("reference", json());
  return PartClock{.offsetUs = c["offset_us"].get<int64_t>(),
                   .boundUs = c["bound_us"].get<int64_t>(),
                   .reference = ref.is_string() ? ref.get<std::string>() : ""};
}

}  // namespace

bool boundedInt(const json& j, int64_t lo, int64_t hi) {
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(std::max<int64_t>(hi, 0));
  if (!j.is_number_integer()) return false;
  const int64_t v = j.get<int64_t>();
  return v >= lo && v <= hi;
}

bool isEvent(const json& e) {
  return e.is_object() && e.contains("ph") && e["ph"].is_string() && e.contains("ts") &&
         boundedInt(e["ts"]) && (!e.contains("tid") || boundedInt(e["tid"])) &&
         (!e.contains("dur") || boundedInt(e["dur"], 0));
}

std::optional<PartFile> readPartFile(const std::string& path, const PartLimits& limits) {
  PartFile part;
  const auto data = readBounded(path, limits.maxBytes, part.cut);
  if (!data) return std::nullopt;
  part.bytesRead = data->size();
  size_t at = data->find('\n');
  const std::string_view text(*data);
  const json header = parseLine(text.substr(0, at), limits.maxDepth);
  if (!header.is_object() || !header.contains("track") || !header["track"].is_string() ||
      (header.contains("start_us") && !header["start_us"].is_number_integer())) {
    return std::nullopt;
  }
  part.track = header["track"].get<std::string>();
  part.startUs = header.value("start_us", int64_t{0});
  while (at != std::string::npos && at + 1 < data->size()) {
    const size_t begin = at + 1;
    at = data->find('\n', begin);
    const size_t end = at == std::string::npos ? data->size() : at;
    json e = parseLine(text.substr(begin, end - begin), limits.maxDepth);
    if (auto c = clockLine(e)) {
      part.clock = std::move(c);
      continue;
    }
    if (!isEvent(e)) {
      ++part.skippedLines;
      continue;
    }
    part.events.push_back(std::move(e));
  }
  return part;
}

}  // namespace ddprun::launcher::timeline
