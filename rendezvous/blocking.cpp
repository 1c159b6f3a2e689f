#include "rendezvous/blocking.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

namespace ddprun::rendezvous {

namespace {
thread_local Blocking* tCurrent = nullptr;
}

Blocking* Blocking::current() { return tCurrent; }
void Blocking::install(Blocking* b) { tCurrent = b; }

int pollFd(int fd, short events, Millis timeout) {
  if (Blocking* b = tCurrent) {
    return b->poll(fd, events, timeout.count() < 0 ? Clock::time_point::max()
                                                   : Clock::now() + timeout);
  }
  pollfd p{fd, events, 0};
  return ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(timeout.count(), -1, INT32_MAX)));
}

void forgetFd(int fd) {
  if (Blocking* b = tCurrent) b->forget(fd);
}

void closeFd(int fd) {
  forgetFd(fd);
  ::close(fd);
}

void sleepFor(Clock::duration d) {
  Blocking* b = tCurrent;
  if (!b) {
    std::this_thread::sleep_for(d);
    return;
  }
  const auto until = Clock::now() + d;
  const char channel = 0;  // private: nothing wakes it but the deadline
  while (Clock::now() < until) b->park(nullptr, &channel, until);
}

bool CondVar::waitOnce(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  if (Blocking* b = tCurrent) return b->park(&lock, this, deadline);
  if (deadline == Clock::time_point::max()) {
    cv_.wait(lock);
    return true;
  }
  return cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
}

void CondVar::notifyAll() {
  if (Blocking* b = tCurrent) b->wake(this);
  cv_.notify_all();
}

Background::Background(std::function<void()> body) {
  if (Blocking* b = tCurrent) {
    join_ = b->start(std::move(body));
  } else {
    thread_ = std::thread(std::move(body));
  }
}

Background::~Background() {
  if (joinable()) join();
}

void Background::join() {
  if (thread_.joinable()) thread_.join();
  if (join_) {
    auto j = std::move(join_);
    join_ = nullptr;
    j();
  }
}

}  // namespace ddprun::rendezvous
