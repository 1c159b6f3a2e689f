#pragma once
// TempDir: a fresh directory for one test, removed with everything in it when it goes out of
// scope. The one temporary-directory helper of the C++ tests.
//
// Created with mkdtemp under $TMPDIR (else /tmp) as ddprun-test-XXXXXX, so two test processes,
// even of two engineers on one machine, never share one.
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace ddprun::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ddprun-test") {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw std::runtime_error("cannot create a temporary directory " + tmpl + ": " +
                               std::strerror(errno));
    }
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // dir / "name": the path of an entry of the directory.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ddprun::testing
