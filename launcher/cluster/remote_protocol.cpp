#include "launcher/cluster/remote_protocol.h"

#include <cctype>
#include <charconv>

#include "base/errors.h"

namespace ddprun::launcher::cluster {
namespace {

constexpr std::string_view kHeader = "DDPRUN-ENV\n";
constexpr size_t kMaxBlock = 16u << 20;  // a bound on what the remote agent holds

bool validName(std::string_view n) {
  if (n.empty() || std::isdigit(static_cast<unsigned char>(n.front()))) return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

std::optional<int> toInt(std::string_view s) {
  int n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return n;
}

}  // namespace

bool exportedByDefault(const std::string& name) {
  return name.rfind("NCCL_", 0) == 0 || name.rfind("DDPRUN_", 0) == 0 || name == "PYTHONPATH" ||
         name == "PYTHON_EXEC" || name == "OMP_NUM_THREADS" || name == "CUDA_VISIBLE_DEVICES";
}

Environment exportedEnvironment(const Environment& local, const std::vector<std::string>& exports) {
  Environment out;
  for (const auto& [k, v] : local)
    if (exportedByDefault(k)) out[k] = v;
  for (const auto& e : exports) {
    const size_t eq = e.find('=');
    std::string name = e.substr(0, eq);
    const bool prefix = eq == std::string::npos && !name.empty() && name.back() == '*';
    if (prefix) name.pop_back();
    if (!validName(name)) {
      throw ConfigError("--export=" + e + ": expected VAR, VAR=VALUE or PREFIX* (VAR made of "
                        "letters, digits and '_')");
    }
    if (eq != std::string::npos) {
      out[name] = e.substr(eq + 1);
    } else if (prefix) {
      for (const auto& [k, v] : local)
        if (k.rfind(name, 0) == 0) out[k] = v;
    } else if (auto it = local.find(name); it != local.end()) {
      out[name] = it->second;
    } else {
      throw ConfigError("--export=" + e + ": " + name + " is not set here (use --export=" + name +
                        "=VALUE to give it a value)");
    }
  }
  return out;
}

std::string encodeEnvBlock(const Environment& env) {
  std::string out(kHeader);
  for (const auto& [k, v] : env) {
    out += k;
    out += '=';
    out += v;
    out += '\0';
  }
  out += '\0';
  return out;
}

bool EnvBlockDecoder::feed(std::string_view bytes) {
  if (done_) {
    rest_.append(bytes);
    return true;
  }
  buf_.append(bytes);
  if (buf_.size() > kMaxBlock) throw ProtocolError("environment block larger than 16 MiB");
  if (!header_) {
    if (buf_.size() < kHeader.size()) {
      if (kHeader.substr(0, buf_.size()) != buf_) throw ProtocolError("not an environment block");
      return false;
    }
    if (buf_.compare(0, kHeader.size(), kHeader) != 0) throw ProtocolError("not an environment block");
    buf_.erase(0, kHeader.size());
    header_ = true;
  }
  size_t pos = 0;
  for (;;) {
    const size_t nul = buf_.find('\0', pos);
    if (nul == std::string::npos) break;
    if (nul == pos) {  // the empty entry: the end
      rest_ = buf_.substr(nul + 1);
      buf_.clear();
      done_ = true;
      return true;
    }
    const std::string_view entry(buf_.data() + pos, nul - pos);
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos || !validName(entry.substr(0, eq)))
      throw ProtocolError("malformed environment entry");
    env_[std::string(entry.substr(0, eq))] = std::string(entry.substr(eq + 1));
    pos = nul + 1;
  }
  buf_.erase(0, pos);
  return false;
}

std::string formatRecord(const Record& r) {
  std::string s(1, kRecordMark);
  switch (r.kind) {
    case Record::Kind::Started:
      return s + "started";
    case Record::Kind::Store:
      return s + "store " + std::to_string(r.port);
    case Record::Kind::RootCause: {
      std::string text = r.text;
      for (auto& c : text)
        if (c == '\n' || c == '\r') c = ' ';
      return s + "root-cause " + std::to_string(r.rank) + " " + std::to_string(r.code) + " " + text;
    }
  }
  return s;
}

std::optional<Record> parseRecord(std::string_view line) {
  if (line.empty() || line.front() != kRecordMark) return std::nullopt;
  line.remove_prefix(1);
  auto word = [&]() {
    const size_t sp = line.find(' ');
    std::string_view w = line.substr(0, sp);
    line.remove_prefix(sp == std::string_view::npos ? line.size() : sp + 1);
    return w;
  };
  const std::string_view kind = word();
  if (kind == "started" && line.empty()) return Record{.kind = Record::Kind::Started};
  if (kind == "store") {
    auto port = toInt(word());
    if (port && *port > 0 && *port < 65536 && line.empty())
      return Record{.kind = Record::Kind::Store, .port = *port};
  }
  if (kind == "root-cause") {
    auto rank = toInt(word());
    auto code = toInt(word());
    if (rank && code) {
      return Record{.kind = Record::Kind::RootCause, .rank = *rank, .code = *code,
                    .text = std::string(line)};
    }
  }
  return std::nullopt;
}

std::optional<int> parseCommand(std::string_view line) {
  if (line.rfind("signal ", 0) != 0) return std::nullopt;
  auto n = toInt(line.substr(7));
  if (!n || *n < 1 || *n > 64) return std::nullopt;
  return n;
}

std::string shellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

std::string remoteCommandLine(const std::string& dir, const std::vector<std::string>& argv) {
  // The same directory when the host has it (a shared file system), else the login directory.
  std::string cmd = "cd " + shellQuote(dir) + " 2>/dev/null; exec";
  for (const auto& a : argv) cmd += " " + shellQuote(a);
  return cmd;
}

}  // namespace ddprun::launcher::cluster
