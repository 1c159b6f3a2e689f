#pragma once
// Finding, from outside, the process that holds a rank of a running ddprun: what a benchmark or
// a test uses to SIGKILL rank R at an arbitrary moment, as a crash would (nothing in the worker
// knows). Read from /proc only; header-only, so the benchmark and the tests use the one rule
// without linking the launcher.
//
// The rule: a descendant of the launcher whose executable is the program and whose start
// environment (/proc/<pid>/environ: what it setenv()s later is not there) holds an entry such as
// RANK=1. A process forked without an exec shows its parent's start environment, so two kinds
// are skipped: the spares forked from a template (a child of a process with the same entry), and
// the spare template forked from local rank 0 (the launcher's own child, with rank 0's
// environment plus rendezvous/spare_fork.h's fork descriptor). Zombies are skipped (a dead rank
// is not the rank's process; see the README's note on late reaping).
#include <dirent.h>
#include <sys/types.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "rendezvous/spare_fork.h"

namespace ddprun::launcher::lookup {

struct ProcStat {
  char state = 0;  // R, S, Z, ...
  pid_t parent = -1;
};

// /proc/<pid>/stat's state and parent; parent -1 when the process is gone.
inline ProcStat procStat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  ProcStat s;
  const size_t close = stat.rfind(')');  // the name in parentheses may hold anything
  if (close == std::string::npos || close + 4 > stat.size()) return s;
  std::istringstream rest(stat.substr(close + 2));
  rest >> s.state >> s.parent;
  return s;
}

// /proc/<pid>/comm without its newline ("" when the process is gone).
inline std::string procComm(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

// Whether the process's start environment holds `entry` exactly ("RANK=1").
inline bool environHas(pid_t pid, const std::string& entry) {
  std::ifstream env("/proc/" + std::to_string(pid) + "/environ");
  for (std::string e; std::getline(env, e, '\0');) {
    if (e == entry) return true;
  }
  return false;
}

// Every process's /proc/<pid>/stat, read once (zombies included).
inline std::map<pid_t, ProcStat> processTable() {
  std::map<pid_t, ProcStat> table;
  if (DIR* d = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      const ProcStat s = procStat(pid);
      if (s.parent >= 0) table[pid] = s;
    }
    ::closedir(d);
  }
  return table;
}

// Every descendant of `root` in `table`, parents before their children.
inline std::vector<pid_t> descendants(pid_t root, const std::map<pid_t, ProcStat>& table) {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& [pid, s] : table) children[s.parent].push_back(pid);
  std::vector<pid_t> out, todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p]) {
      out.push_back(c);
      todo.push_back(c);
    }
  }
  return out;
}

// Every descendant of `root` now, parents before their children; zombies included.
inline std::vector<pid_t> descendants(pid_t root) { return descendants(root, processTable()); }

// The start-environment entry of the spare template forked from local rank 0: the fork
// descriptor (rendezvous/spare_fork.h) on descriptor 5, as the launcher passes it.
inline std::string templateForkEntry() {
  return std::string(rendezvous::spare_fork::kTemplateForkFdVariable) + "=5";
}

// The living descendant of `launcher` that runs `program` (its first 15 characters, as comm
// holds them) with `entry` in its start environment, by the rule above; -1 when none.
inline pid_t descendantWithEnv(pid_t launcher, const std::string& entry,
                               const std::string& program) {
  const std::map<pid_t, ProcStat> table = processTable();
  for (pid_t p : descendants(launcher, table)) {
    const ProcStat& s = table.at(p);
    if (s.state == 'Z') continue;
    if (procComm(p) != program.substr(0, 15) || !environHas(p, entry)) continue;
    if (environHas(s.parent, entry)) continue;
    if (s.parent == launcher && environHas(p, templateForkEntry())) continue;
    return p;
  }
  return -1;
}

// The spare template forked from local rank 0 (the launcher's child with the fork descriptor in
// its start environment), or -1.
inline pid_t rankTemplatePid(pid_t launcher, const std::string& program) {
  const std::map<pid_t, ProcStat> table = processTable();
  for (pid_t p : descendants(launcher, table)) {
    const ProcStat& s = table.at(p);
    if (s.state == 'Z' || s.parent != launcher) continue;
    if (procComm(p) == program.substr(0, 15) && environHas(p, templateForkEntry())) return p;
  }
  return -1;
}

// The worker of global rank `rank` (RANK=<rank>), or -1.
inline pid_t workerPid(pid_t launcher, int rank, const std::string& program) {
  return descendantWithEnv(launcher, "RANK=" + std::to_string(rank), program);
}

}  // namespace ddprun::launcher::lookup
