#include "launcher/cluster/ssh_session.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>

#include "base/errors.h"

extern char** environ;

namespace ddprun::launcher::cluster {

namespace asio = boost::asio;

SshSession::SshSession(asio::io_context& io, std::vector<std::string> argv, Callbacks callbacks)
    : io_(io), argv_(std::move(argv)), callbacks_(std::move(callbacks)) {
  err_.isStderr = true;
}

SshSession::~SshSession() {
  if (running()) kill();
  if (pid_ > 0 && !exited_) ::waitpid(pid_, nullptr, 0);
}

void SshSession::start() {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);  // SIGPIPE ignored by ddprun: not for ssh
  std::vector<char*> args;
  for (auto& a : argv_) args.push_back(a.data());
  args.push_back(nullptr);
  const int rc = ::posix_spawnp(&pid_, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    pid_ = -1;
    throw Error("cannot run " + argv_[0] + ": " + std::strerror(rc));
  }
  stdin_ = std::make_unique<asio::posix::stream_descriptor>(io_, in[1]);
  out_.fd = std::make_unique<asio::posix::stream_descriptor>(io_, out[0]);
  err_.fd = std::make_unique<asio::posix::stream_descriptor>(io_, err[0]);
  openStreams_ = 2;
  read(out_);
  read(err_);
  writeNext();
}

void SshSession::read(Stream& s) {
  s.fd->async_read_some(asio::buffer(s.buf), [this, &s](boost::system::error_code ec, size_t n) {
    std::vector<std::string> lines;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      s.lines.finish(lines);
    } else {
      s.lines.feed(std::string_view(s.buf, n), lines);
    }
    for (const auto& l : lines) callbacks_.line(l, s.isStderr);
    if (ec) {
      s.fd->close();
      --openStreams_;
      checkEnded();
      return;
    }
    read(s);
  });
}

void SshSession::send(std::string bytes) {
  if (!stdin_ || !stdin_->is_open()) return;
  queue_.push_back(std::move(bytes));
  writeNext();
}

void SshSession::writeNext() {
  if (writing_ || queue_.empty() || !stdin_ || !stdin_->is_open()) return;
  writing_ = true;
  asio::async_write(*stdin_, asio::buffer(queue_.front()),
                    [this](boost::system::error_code ec, size_t) {
                      writing_ = false;
                      queue_.pop_front();
                      if (ec) {  // ssh is gone: nothing more reaches the remote agent
                        queue_.clear();
                        return;
                      }
                      writeNext();
                    });
}

void SshSession::reap() {
  if (pid_ <= 0 || exited_) return;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return;
  exited_ = true;
  exitCode_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  boost::system::error_code ignored;
  if (stdin_) stdin_->close(ignored);
  checkEnded();
}

void SshSession::kill() {
  if (running()) ::kill(-pid_, SIGKILL);
}

void SshSession::checkEnded() {
  if (!ended() || endedCalled_) return;
  endedCalled_ = true;
  asio::post(io_, [this] { callbacks_.ended(); });
}

}  // namespace ddprun::launcher::cluster
