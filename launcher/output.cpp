#include "launcher/output.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/errors.h"

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

StreamSink::StreamSink(StreamTargets targets) : targets_(std::move(targets)) {
  if (!targets_.filePath.empty()) {
    file_ = UniqueFd(::open(targets_.filePath.c_str(),
                            O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
    if (!file_) {
      throw Error("launcher: cannot create log file " + targets_.filePath + ": " +
                  std::strerror(errno));
    }
  }
}

void StreamSink::write(std::string_view bytes) {
  if (file_) writeFully(file_.get(), bytes);
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
    writeFully(targets_.consoleFd, batch);
  }
  for (auto& l : lines) {
    if (targets_.tailLines == 0) break;
    tail_.push_back(std::move(l));
    if (tail_.size() > targets_.tailLines) tail_.pop_front();
  }
}

}  // namespace ddprun::launcher
