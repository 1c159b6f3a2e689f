#include "launcher/spare_template.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "base/errors.h"
#include "base/fd_passing.h"
#include "rendezvous/spare_fork.h"

namespace ddprun::launcher {

namespace wire = rendezvous::spare_fork;
static_assert(sizeof(wire::StatusRecord) == sizeof(GuardRecord) &&
                  static_cast<int>(wire::StatusRecord::Started) == GuardRecord::Started &&
                  static_cast<int>(wire::StatusRecord::ExecFailed) == GuardRecord::ExecFailed &&
                  static_cast<int>(wire::StatusRecord::Exited) == GuardRecord::Exited,
              "the forked guard writes the launcher guard's status records");

namespace {

std::pair<UniqueFd, UniqueFd> socketPair(bool controlChannel) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw Error(std::string("launcher: socketpair failed: ") + std::strerror(errno));
  }
  if (controlChannel) ::shutdown(fds[0], SHUT_WR);  // the guard's end only reads
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

std::pair<UniqueFd, UniqueFd> pipePair() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(std::string("launcher: pipe2 failed: ") + std::strerror(errno));
  }
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Waits up to `ms` for a whole Reply. 1: read; 0: none in time; -1: EOF or error.
int readReply(int fd, wire::Reply& r, int ms) {
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, ms);
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) return 0;
  if (rc < 0) return -1;
  return readAll(fd, &r, sizeof r) ? 1 : -1;
}

}  // namespace

SpareTemplate::SpareTemplate() {
  auto [a, b] = socketPair(false);
  agent_ = std::move(a);
  child_ = std::move(b);
}

bool SpareTemplate::enableSubreaper(std::string& why) {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0) return true;
  why = std::string("prctl(PR_SET_CHILD_SUBREAPER): ") + std::strerror(errno);
  return false;
}

bool SpareTemplate::checkReady(std::string& why) {
  if (ready_) return true;
  wire::Reply r;
  int got = readReply(agent_.get(), r, 0);
  if (got > 0 && r.kind == wire::Reply::Loading && !loadingSeen_) {
    loadingSeen_ = true;
    pid_ = r.value;  // a template forked from a rank: its pid, before its warm-up
    got = readReply(agent_.get(), r, 0);
  }
  if (got == 0) {
    why = "the spare template is still loading";
    return false;
  }
  if (got < 0 || r.kind != wire::Reply::Ready) {
    gone_ = true;
    why = got < 0 ? "the spare template exited before it was ready"
                  : "the spare template said " + std::to_string(r.kind) + " instead of Ready";
    return false;
  }
  ready_ = true;
  pid_ = r.value;
  return true;
}

bool SpareTemplate::sendOutput(int fd) {
  const wire::Output head;
  const int fds[1] = {fd};
  return sendWithFds(agent_.get(), &head, sizeof head, fds, MSG_DONTWAIT) ==
         static_cast<ssize_t>(sizeof head);
}

std::optional<GuardedProcess> SpareTemplate::forkSpare(int spareId, bool idle,
                                                       const std::vector<std::string>& env,
                                                       std::string& why) {
  if (!request(spareId, idle, env, why)) return std::nullopt;
  return answer(kAnswerTimeout, why);
}

bool SpareTemplate::request(int spareId, bool idle, const std::vector<std::string>& env,
                            std::string& why) {
  if (gone_) {
    why = "the spare template is gone";
    return false;
  }
  DDPRUN_CHECK(!pending_, "one request to the spare template at a time");
  if (!checkReady(why)) return false;
  std::string blob;
  for (const auto& e : env) {
    blob += e;
    blob.push_back('\0');
  }
  if (blob.size() > wire::kMaxEnvBytes) {
    why = "the spare's environment has " + std::to_string(blob.size()) + " bytes, more than " +
          std::to_string(wire::kMaxEnvBytes) + " the template reads";
    return false;
  }
  auto [controlRead, controlWrite] = socketPair(true);
  auto [statusRead, statusWrite] = pipePair();
  auto [outRead, outWrite] = pipePair();
  auto [errRead, errWrite] = pipePair();
  wire::Request head;
  head.spareId = spareId;
  head.idle = idle ? 1 : 0;
  head.envBytes = static_cast<uint32_t>(blob.size());
  const int fds[4] = {controlRead.get(), statusWrite.get(), outWrite.get(), errWrite.get()};
  const ssize_t sent = sendWithFds(agent_.get(), &head, sizeof head, fds);
  if (sent < 0 || (static_cast<size_t>(sent) < sizeof head &&
                   !sendAll(agent_.get(), reinterpret_cast<const char*>(&head) + sent,
                            sizeof head - static_cast<size_t>(sent))) ||
      !sendAll(agent_.get(), blob.data(), blob.size())) {
    gone_ = true;
    why = std::string("the spare template's socket: ") + std::strerror(errno);
    return false;
  }
  // The ends the guard and its spare hold are closed here, as spawnGuarded() does.
  pending_ = Pending{.control = std::move(controlWrite),
                     .status = std::move(statusRead),
                     .out = std::move(outRead),
                     .err = std::move(errRead),
                     .idle = idle,
                     .asked = std::chrono::steady_clock::now()};
  return true;
}

std::chrono::milliseconds SpareTemplate::answerWaited() const {
  if (!pending_) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               pending_->asked);
}

bool SpareTemplate::answerMayStillCome() const {
  return pending_ && pending_->idle && answerWaited() < kIdleAnswerTimeout && !stopped();
}

bool SpareTemplate::stopped() const {
  if (pid_ <= 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string stat;
  std::getline(in, stat);
  // "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'T' || state == 't';
}

std::optional<GuardedProcess> SpareTemplate::answer(std::chrono::milliseconds wait,
                                                    std::string& why) {
  DDPRUN_CHECK(pending_, "an answer is read after a request");
  wire::Reply r;
  const int got = readReply(agent_.get(), r, static_cast<int>(wait.count()));
  const bool idle = pending_->idle, isStopped = got == 0 && stopped();
  Pending pending = std::move(*pending_);
  pending_.reset();
  if (got <= 0 || (r.kind != wire::Reply::Forked && r.kind != wire::Reply::Failed)) {
    // A late answer would come after a request nobody waits for: the template is done with.
    // A guard it forks anyway finds its control socket closed (below) and kills its spare.
    gone_ = true;
    const auto bound = idle && !isStopped ? kIdleAnswerTimeout : kAnswerTimeout;
    why = got == 0 ? std::string("the spare template ") + (isStopped ? "is stopped and " : "") +
                         "did not answer in " + std::to_string(bound.count()) + " ms"
          : got < 0 ? "the spare template exited"
                    : "the spare template answered " + std::to_string(r.kind);
    return std::nullopt;
  }
  if (r.kind == wire::Reply::Failed) {
    why = std::string("the spare template could not fork: ") + std::strerror(r.value);
    return std::nullopt;
  }
  // The guard's group, also from here: a guard the template made its sibling is this process's
  // child at once, and a stop's kill(-guard) must not race the guard's own setpgid(). (One that
  // an X between made is not yet, or already in its group: ESRCH or a no-op, both fine.)
  ::setpgid(r.value, r.value);
  GuardedProcess p;
  p.guardPid = r.value;
  p.control = std::move(pending.control);
  p.status = std::move(pending.status);
  p.stdoutRead = std::move(pending.out);
  p.stderrRead = std::move(pending.err);
  return p;
}

}  // namespace ddprun::launcher
