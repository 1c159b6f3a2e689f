#include "launcher/output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "base/errors.h"
#include "base/log.h"

namespace ddprun::launcher {

StreamRoute routeStream(uint8_t bit, uint8_t redirects, uint8_t tee, bool filteredOut) {
  StreamRoute r;
  r.file = ((redirects | tee) & bit) != 0 || filteredOut;
  r.console = !filteredOut && (!(redirects & bit) || (tee & bit));
  return r;
}

std::string linePrefix(const std::string* prefixTemplate, const std::string& role, int rank,
                       int localRank, int worldSize) {
  if (prefixTemplate == nullptr) {
    return worldSize > 1 ? "[rank " + std::to_string(rank) + "]: " : std::string();
  }
  std::string prefix = *prefixTemplate;
  const std::pair<std::string, std::string> macros[] = {
      {"${role_name}", role}, {"${rank}", std::to_string(rank)},
      {"${local_rank}", std::to_string(localRank)}};
  for (const auto& [key, value] : macros) {
    for (size_t p = prefix.find(key); p != std::string::npos; p = prefix.find(key, p + value.size())) {
      prefix.replace(p, key.size(), value);
    }
  }
  return prefix;
}

void LineBuffer::feed(std::string_view bytes, std::vector<std::string>& lines) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const size_t take = nl == std::string_view::npos ? bytes.size() : nl;
    const size_t room = maxLine_ - partial_.size();
    if (take >= room) {
      // No newline within maxLine: emit a full piece and go on.
      partial_.append(bytes.substr(0, room));
      lines.push_back(std::move(partial_));
      partial_.clear();
      bytes.remove_prefix(room);
      if (take == room && nl != std::string_view::npos) bytes.remove_prefix(1);
      continue;
    }
    partial_.append(bytes.substr(0, take));
    if (nl == std::string_view::npos) return;
    lines.push_back(std::move(partial_));
    partial_.clear();
    bytes.remove_prefix(nl + 1);
  }
}

void LineBuffer::finish(std::vector<std::string>& lines) {
  if (!partial_.empty()) lines.push_back(std::move(partial_));
  partial_.clear();
}

void writeFully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      struct pollfd p {fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return;
    }
  }
}

namespace {
std::map<int, Console*>& consoles() {
  // Built on first use and never destroyed: the exit path may still flush them.
  static auto* all = new std::map<int, Console*>();
  return *all;
}
}  // namespace

Console& Console::of(int fd) {
  Console*& c = consoles()[fd];
  if (c == nullptr) c = new Console(fd);
  return *c;
}

Console::Console(int fd) : fd_(fd) {
  // Only ddprun's own stdout and stderr are reopened (other descriptors: unit tests).
  const bool console = fd == STDOUT_FILENO || fd == STDERR_FILENO;
  struct stat st {};
  if (console && ::fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    const int own = ::open(self.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (own >= 0) {
      fd_ = own;
      nonBlocking_ = true;
    }
  }
}

void Console::write(std::string_view bytes) {
  if (broken_) {
    lost_ += bytes.size();
    return;
  }
  if (!nonBlocking_) {
    writeFully(fd_, bytes);
    return;
  }
  pending_.append(bytes);
  pump();
}

bool Console::pump() {
  while (sent_ < pending_.size() && !broken_) {
    const ssize_t n = ::write(fd_, pending_.data() + sent_, pending_.size() - sent_);
    if (n > 0) {
      sent_ += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      break;
    } else {
      broken_ = true;  // EPIPE (nobody reads any more) or worse: drop, count, go on
      lost_ += pending_.size() - sent_;
      sent_ = pending_.size();
    }
  }
  if (sent_ == pending_.size()) {
    pending_.clear();
    sent_ = 0;
  } else if (sent_ > kLowWater) {
    pending_.erase(0, sent_);
    sent_ = 0;
  }
  return pending_.size() - sent_ <= kLowWater;
}

void Console::flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (nonBlocking_ && !broken_) {
    pump();
    if (pending_.size() == sent_) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    struct pollfd p {fd_, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
  lost_ += pending_.size() - sent_;
  pending_.clear();
  sent_ = 0;
}

std::vector<std::string> Console::flushAll(std::chrono::milliseconds timeout) {
  std::vector<std::string> lost;
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    if (consoles().count(fd) == 0) continue;  // never used: nothing to flush
    Console& c = of(fd);
    c.flush(timeout);
    if (c.lostBytes() > 0) {
      lost.push_back(std::to_string(c.lostBytes()) + " bytes of worker output for ddprun's " +
                     (fd == STDOUT_FILENO ? "stdout" : "stderr") +
                     " were lost (it did not take them, or was closed)");
    }
  }
  return lost;
}

StreamSink::StreamSink(StreamTargets targets) : targets_(std::move(targets)) {
  if (targets_.consoleFd >= 0) console_ = &Console::of(targets_.consoleFd);
  if (!targets_.filePath.empty()) {
    file_ = UniqueFd(::open(targets_.filePath.c_str(),
                            O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
    if (!file_) {
      throw Error("launcher: cannot create log file " + targets_.filePath + ": " +
                  std::strerror(errno));
    }
  }
}

void StreamSink::writeFile(std::string_view bytes) {
  if (fileError_ != 0) {
    fileLost_ += bytes.size();
    return;
  }
  while (!bytes.empty()) {
    const ssize_t n = ::write(file_.get(), bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      fileError_ = n < 0 ? errno : ENOSPC;
      fileLost_ += bytes.size();
      DDPRUN_LOG(WARN, "launcher") << "cannot write log file " << targets_.filePath << ": "
                                   << std::strerror(fileError_)
                                   << "; what goes to it is lost from here on (counted at the end)";
      return;
    }
  }
}

void StreamSink::write(std::string_view bytes) {
  if (file_) writeFile(bytes);
  if (targets_.consoleFd < 0 && targets_.tailLines == 0) return;
  scratch_.clear();
  lines_.feed(bytes, scratch_);
  emit(scratch_);
}

void StreamSink::finish() {
  scratch_.clear();
  lines_.finish(scratch_);
  emit(scratch_);
}

void StreamSink::emit(std::vector<std::string>& lines) {
  if (lines.empty()) return;
  if (targets_.consoleFd >= 0) {
    // One write for the batch: it holds whole lines only, so nothing interleaves mid-line.
    std::string batch;
    for (const auto& l : lines) {
      batch += targets_.prefix;
      batch += l;
      batch += '\n';
    }
    console_->write(batch);
  }
  for (auto& l : lines) {
    if (targets_.tailLines == 0) break;
    tail_.push_back(std::move(l));
    if (tail_.size() > targets_.tailLines) tail_.pop_front();
  }
}

}  // namespace ddprun::launcher
