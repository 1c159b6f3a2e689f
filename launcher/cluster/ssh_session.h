#pragma once
// One remote agent of an ssh launch, seen from the launching ddprun: the ssh client process
// (in a process group of its own, so a Ctrl-C on the terminal reaches only ddprun, which
// relays it), a pipe to its stdin (the environment block, then commands) whose write end only
// ddprun holds -- so when ddprun dies, even by SIGKILL, ssh sees EOF, the remote agent sees EOF
// and stops -- and its stdout and stderr, split into lines on the launcher's io_context.
#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/output.h"

namespace ddprun::launcher::cluster {

class SshSession {
 public:
  struct Callbacks {
    std::function<void(const std::string& line, bool fromStderr)> line;  // each line, in order
    std::function<void()> ended;  // the process exited and both streams are drained
  };
  SshSession(boost::asio::io_context& io, std::vector<std::string> argv, Callbacks callbacks);
  ~SshSession();
  SshSession(const SshSession&) = delete;
  SshSession& operator=(const SshSession&) = delete;

  // Spawns ssh. Throws Error naming the command when it cannot start.
  void start();
  // Queues bytes for ssh's stdin (written in order, without blocking the io_context).
  void send(std::string bytes);
  // Reaps the process if it exited (call on SIGCHLD).
  void reap();
  // SIGKILL to the ssh client's process group (its connection closes: the remote agent stops).
  void kill();

  bool running() const { return pid_ > 0 && !exited_; }
  bool ended() const { return exited_ && openStreams_ == 0; }
  // ssh's exit code (255: ssh's own error), or 128 + signal.
  int exitCode() const { return exitCode_; }

 private:
  struct Stream {
    std::unique_ptr<boost::asio::posix::stream_descriptor> fd;
    LineBuffer lines;
    char buf[8192];
    bool isStderr = false;
  };
  void read(Stream& s);
  void writeNext();
  void checkEnded();

  boost::asio::io_context& io_;
  std::vector<std::string> argv_;
  Callbacks callbacks_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int exitCode_ = 0;
  int openStreams_ = 0;
  bool endedCalled_ = false;
  Stream out_, err_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> stdin_;
  std::deque<std::string> queue_;
  bool writing_ = false;
};

}  // namespace ddprun::launcher::cluster
