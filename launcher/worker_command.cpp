#include "launcher/worker_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddprun::launcher {
namespace {

bool endsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(),
                                                suffix) == 0;
}

bool isIdentStart(char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)); }
bool isIdentChar(char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)); }

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string findExecutable(const std::string& name, const Environment& env) {
  if (name.find('/') != std::string::npos) return isExecutableFile(name) ? name : "";
  auto it = env.find("PATH");
  const std::string path = it != env.end() ? it->second : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    // An empty PATH entry means the current directory, as for execvp.
    const std::string dir = end > start ? path.substr(start, end - start) : std::string(1, '.');
    std::string candidate = dir + "/" + name;
    if (isExecutableFile(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

WorkerCommand buildWorkerCommand(const LaunchOptions& o, const Environment& env) {
  WorkerCommand cmd;
  cmd.python = !o.noPython && (o.module || o.runPath || endsWith(o.program, ".py"));
  std::string wanted = o.program;
  if (cmd.python) {
    auto it = env.find("PYTHON_EXEC");
    wanted = (it != env.end() && !it->second.empty()) ? it->second : "python3";
  }
  cmd.executable = findExecutable(wanted, env);
  if (cmd.executable.empty()) {
    const bool hasSlash = wanted.find('/') != std::string::npos;
    std::string what = cmd.python ? "the Python interpreter '" : "PROGRAM '";
    what.append(wanted).append("'");
    if (hasSlash && ::access(wanted.c_str(), F_OK) == 0) {
      throw ProgramError(what.append(" is not an executable file"), 126);
    }
    what.append(" was not found");
    if (!hasSlash) what.append(" on PATH");
    if (cmd.python) what.append(" (set PYTHON_EXEC to choose the interpreter)");
    throw ProgramError(what, 127);
  }

  cmd.argv.push_back(cmd.python ? wanted : o.program);
  if (cmd.python) {
    cmd.argv.push_back("-u");
    if (o.module) cmd.argv.push_back("-m");
    cmd.argv.push_back(o.program);
  }
  if (o.passLocalRank) cmd.argv.push_back("--local_rank=${local_rank}");
  cmd.argv.insert(cmd.argv.end(), o.programArgs.begin(), o.programArgs.end());
  return cmd;
}

std::vector<std::string> argvForRank(const WorkerCommand& command, int localRank) {
  std::vector<std::string> argv;
  argv.reserve(command.argv.size());
  for (size_t i = 0; i < command.argv.size(); ++i) {
    argv.push_back(i == 0 ? command.argv[i] : substituteLocalRank(command.argv[i], localRank));
  }
  return argv;
}

std::string substituteLocalRank(std::string_view arg, int localRank) {
  const std::string rank = std::to_string(localRank);
  std::string out;
  out.reserve(arg.size());
  size_t i = 0;
  while (i < arg.size()) {
    if (arg[i] != '$' || i + 1 >= arg.size()) {
      out += arg[i++];
      continue;
    }
    const char next = arg[i + 1];
    if (next == '$') {  // "$$" is an escaped "$"
      out += '$';
      i += 2;
    } else if (next == '{') {
      size_t close = arg.find('}', i + 2);
      std::string_view name =
          close == std::string_view::npos ? std::string_view() : arg.substr(i + 2, close - i - 2);
      bool valid = !name.empty() && isIdentStart(name[0]);
      for (char c : name) valid = valid && isIdentChar(c);
      if (valid && name == "local_rank") {
        out += rank;
        i = close + 1;
      } else if (valid) {
        out.append(arg.substr(i, close - i + 1));
        i = close + 1;
      } else {
        out += '$';
        i += 1;
      }
    } else if (isIdentStart(next)) {
      size_t end = i + 1;
      while (end < arg.size() && isIdentChar(arg[end])) ++end;
      std::string_view name = arg.substr(i + 1, end - i - 1);
      if (name == "local_rank") {
        out += rank;
      } else {
        out.append(arg.substr(i, end - i));
      }
      i = end;
    } else {
      out += '$';
      i += 1;
    }
  }
  return out;
}

}  // namespace ddprun::launcher
