#include "launcher/hot_spares.h"

#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ddprun::launcher {

std::vector<std::string> spareEnvironment(const std::vector<std::string>& workerEnv, int id) {
  std::vector<std::string> out;
  out.reserve(workerEnv.size() + 1);
  for (const auto& entry : workerEnv) {
    bool dropped = entry.rfind("DDPRUN_SPARE=", 0) == 0;
    for (const auto& name : spareDroppedVariables()) dropped = dropped || entry.rfind(name + "=", 0) == 0;
    if (!dropped) out.push_back(entry);
  }
  out.push_back("DDPRUN_SPARE=" + std::to_string(id));
  return out;
}

namespace {

// Moves every thread of `pid` whose policy is `from` to `to` (nice 0); see leaveIdlePriority.
int moveThreads(pid_t pid, int from, int to, std::string& error) {
  int moved = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (moved == 0) error = dir + ": " + std::strerror(errno);
      return moved;
    }
    while (dirent* e = ::readdir(d)) {
      const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
      if (tid <= 0) continue;
      const int policy = ::sched_getscheduler(tid);
      if (policy != from) continue;
      sched_param none{};
      if (::sched_setscheduler(tid, to, &none) == 0) {
        ++moved;
      } else if (errno != ESRCH && error.empty()) {
        error = "sched_setscheduler(" + std::to_string(tid) + ", " +
                (to == SCHED_IDLE ? "SCHED_IDLE" : "SCHED_OTHER") + "): " + std::strerror(errno);
      }
    }
    ::closedir(d);
  }
  return moved;
}

}  // namespace

int leaveIdlePriority(pid_t pid, std::string& error) {
  return moveThreads(pid, SCHED_IDLE, SCHED_OTHER, error);
}

int enterIdlePriority(pid_t pid, std::string& error) {
  return moveThreads(pid, SCHED_OTHER, SCHED_IDLE, error);
}

int schedulingPolicy(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  // Fields after the command: state is field 3; policy is field 41.
  for (int i = 3; i <= 41; ++i) {
    if (!(rest >> field)) return -1;
  }
  return std::atoi(field.c_str());
}

}  // namespace ddprun::launcher
