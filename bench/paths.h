#pragma once
// Where ddprun-bench finds what it runs and writes what it measures, in the build tree and
// when installed (the Debian package puts it in /usr/bin, its scripts in /usr/share/ddprun):
//   programDir()  - ddprun-bench's own directory: ddprun and the trainers are beside it
//   scriptPath(f) - bench/<f> of the source tree it was built from, else <programDir>/../share/ddprun/<f>
//   resultsPath(f)- bench/results/<f> of that source tree, else ./<f>
#include <unistd.h>

#include <climits>
#include <string>
#include <sys/stat.h>

namespace ddprun::bench {

inline std::string programDir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return DDPRUN_BIN_DIR;
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

inline bool sourceTreeExists() {
  struct stat st {};
  return ::stat((std::string(DDPRUN_SOURCE_DIR) + "/bench").c_str(), &st) == 0;
}

inline std::string scriptPath(const std::string& file) {
  return sourceTreeExists() ? std::string(DDPRUN_SOURCE_DIR) + "/bench/" + file
                            : programDir() + "/../share/ddprun/" + file;
}

inline std::string resultsPath(const std::string& file) {
  return sourceTreeExists() ? std::string(DDPRUN_SOURCE_DIR) + "/bench/results/" + file : file;
}

}  // namespace ddprun::bench
