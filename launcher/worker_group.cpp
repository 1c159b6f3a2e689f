#include "launcher/worker_group.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <csignal>
#include <cstring>

#include "launcher/option_values.h"
#include "base/errors.h"
#include "base/log.h"

namespace ddprun::launcher {

namespace asio = boost::asio;
using boost::system::error_code;

bool WorkerResult::failed() const {
  return guardLost || execErrno != 0 || !WIFEXITED(waitStatus) || WEXITSTATUS(waitStatus) != 0;
}

int WorkerResult::exitCode() const {
  if (guardLost) return 128 + SIGKILL;
  if (WIFSIGNALED(waitStatus)) return 128 + WTERMSIG(waitStatus);
  if (WIFEXITED(waitStatus)) return WEXITSTATUS(waitStatus);
  return 1;
}

std::string WorkerResult::describe() const {
  if (execErrno != 0) return std::string("could not execute: ") + std::strerror(execErrno);
  if (guardLost) return "lost (its guard process died); its process group was killed";
  if (WIFSIGNALED(waitStatus)) {
    const int sig = WTERMSIG(waitStatus);
    return "signal " + std::to_string(sig) + " (" + signalName(sig) + ")" +
           (WCOREDUMP(waitStatus) ? ", core dumped" : "") +
           (killedBecause.empty() ? std::string() : " sent by ddprun: " + killedBecause);
  }
  return "exit code " + std::to_string(WEXITSTATUS(waitStatus));
}

// One worker: its guard's descriptors, as Asio objects, and its output sinks.
struct WorkerGroup::Slot {
  Slot(asio::io_context& io, GuardedProcess p, StreamSink outSink_, StreamSink errSink_)
      : guardPid(p.guardPid),
        control(std::move(p.control)),
        status(io, p.status.release()),
        out(io, p.stdoutRead.release()),
        err(io, p.stderrRead.release()),
        outSink(std::move(outSink_)),
        errSink(std::move(errSink_)) {}

  pid_t guardPid;
  UniqueFd control;
  asio::posix::stream_descriptor status, out, err;
  std::array<char, 64> statusBuf{};
  size_t statusHave = 0;
  // Read buffers, not zeroed: zeroing them faulted in 8 pages per worker whatever it prints.
  std::array<char, 16 * 1024> outBuf, errBuf;
  StreamSink outSink, errSink;
  bool started = false, ended = false, reaped = false, outDone = false, errDone = false;
  int pendingSignal = 0;  // a stop signal that came before the worker existed
  std::string cgroupDir;  // the worker's cgroup (empty: none)
};

struct WorkerGroup::Timers {
  explicit Timers(asio::io_context& io) : kill(io), drain(io) {}
  asio::steady_timer kill;   // SIGKILL after the grace period
  asio::steady_timer drain;  // stop waiting for output held open by escaped processes
};

// A console that does not keep up (a pipe nobody reads, a stopped terminal): the readers
// that write to it wait, the loop goes on, and they resume once it is writable and drained.
struct WorkerGroup::ConsoleWait {
  ConsoleWait(asio::io_context& io, Console& c) : console(c), writable(io, ::dup(c.fd())) {}
  Console& console;
  asio::posix::stream_descriptor writable;  // a dup of the console's descriptor
  std::vector<std::pair<size_t, bool>> readers;  // (slot, isStderr) paused
  bool armed = false;
};

WorkerGroup::WorkerGroup(asio::io_context& io, Callbacks callbacks)
    : io_(io), callbacks_(std::move(callbacks)), timers_(std::make_unique<Timers>(io)) {}

WorkerGroup::~WorkerGroup() { killAll(); }

void WorkerGroup::spawnSlot(WorkerLaunch& l) {
  // Sinks first: a log file that cannot be created fails before this worker runs.
  StreamSink outSink(std::move(l.stdoutTargets)), errSink(std::move(l.stderrTargets));
  GuardedProcess p = l.spawner ? l.spawner(l.spawn) : spawnGuarded(l.spawn);
  slots_.push_back(std::make_unique<Slot>(io_, std::move(p), std::move(outSink), std::move(errSink)));
  slots_.back()->cgroupDir = l.spawn.cgroup.dir;
  WorkerResult r;
  r.localRank = l.localRank;
  r.globalRank = l.globalRank;
  r.spareId = l.spareId;
  r.spare = l.spareId >= 0 || l.sparesTemplate;
  r.sparesTemplate = l.sparesTemplate;
  r.errorFile = l.errorFile;
  results_.push_back(std::move(r));
}

void WorkerGroup::start(std::vector<WorkerLaunch> launches) {
  try {
    for (auto& l : launches) spawnSlot(l);
  } catch (...) {
    killAll();
    throw;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    readStatus(i);
    readOutput(i, false);
    readOutput(i, true);
  }
}

void WorkerGroup::add(WorkerLaunch l) {
  DDPRUN_CHECK(!controlsClosed_ && stopSignal_ == 0 && runningCount() > 0,
               "a worker is added to a group that is stopping");
  spawnSlot(l);
  const size_t i = slots_.size() - 1;
  readStatus(i);
  readOutput(i, false);
  readOutput(i, true);
}

bool WorkerGroup::assign(pid_t pid, int localRank, int globalRank) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    WorkerResult& r = results_[i];
    if (!r.spare || r.pid != pid || slots_[i]->ended) continue;
    r.spare = false;
    r.localRank = localRank;
    r.globalRank = globalRank;
    return true;
  }
  return false;
}

bool WorkerGroup::endEarly(pid_t pid, int waitStatus) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (results_[i].spare || results_[i].pid != pid || slots_[i]->ended) continue;
    results_[i].waitStatus = waitStatus;
    onWorkerEnded(i);
    return true;
  }
  return false;
}

bool WorkerGroup::renumber(pid_t pid, int globalRank) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    WorkerResult& r = results_[i];
    if (r.spare || r.pid != pid || slots_[i]->ended) continue;
    r.globalRank = globalRank;
    return true;
  }
  return false;
}

void WorkerGroup::setPrefix(pid_t pid, const std::string& prefix) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (results_[i].pid != pid || slots_[i]->ended) continue;
    slots_[i]->outSink.setPrefix(prefix);
    slots_[i]->errSink.setPrefix(prefix);
  }
}

void WorkerGroup::readStatus(size_t i) {
  Slot& s = *slots_[i];
  s.status.async_read_some(
      asio::buffer(s.statusBuf.data() + s.statusHave, s.statusBuf.size() - s.statusHave),
      [self = shared_from_this(), i](error_code ec, size_t n) {
        Slot& s = *self->slots_[i];
        if (ec == asio::error::operation_aborted) return;
        if (ec) {  // EOF: the guard has exited (it is the only writer)
          self->onGuardGone(i);
          return;
        }
        s.statusHave += n;
        size_t off = 0;
        while (s.statusHave - off >= sizeof(GuardRecord)) {
          GuardRecord r;
          std::memcpy(&r, s.statusBuf.data() + off, sizeof r);
          off += sizeof r;
          self->onRecord(i, r);
        }
        std::memmove(s.statusBuf.data(), s.statusBuf.data() + off, s.statusHave - off);
        s.statusHave -= off;
        self->readStatus(i);
      });
}

void WorkerGroup::readOutput(size_t i, bool isStderr) {
  Slot& s = *slots_[i];
  auto& pipe = isStderr ? s.err : s.out;
  auto& buf = isStderr ? s.errBuf : s.outBuf;
  pipe.async_read_some(asio::buffer(buf), [self = shared_from_this(), i, isStderr](
                                              error_code ec, size_t n) {
    Slot& s = *self->slots_[i];
    auto& sink = isStderr ? s.errSink : s.outSink;
    if (ec == asio::error::operation_aborted) return;
    if (ec) {  // EOF: the worker and everything it started closed the pipe
      sink.finish();
      (isStderr ? s.errDone : s.outDone) = true;
      (isStderr ? s.err : s.out).close();
      self->checkStopped();
      return;
    }
    sink.write(std::string_view((isStderr ? s.errBuf : s.outBuf).data(), n));
    if (sink.congested()) {
      self->waitForConsole(i, isStderr);  // this pipe is not read until the console drains
    } else {
      self->readOutput(i, isStderr);
    }
  });
}

void WorkerGroup::waitForConsole(size_t i, bool isStderr) {
  Console& console = *(isStderr ? slots_[i]->errSink : slots_[i]->outSink).console();
  ConsoleWait* w = nullptr;
  for (auto& c : consoleWaits_) {
    if (&c->console == &console) w = c.get();
  }
  if (w == nullptr) {
    consoleWaits_.push_back(std::make_unique<ConsoleWait>(io_, console));
    w = consoleWaits_.back().get();
  }
  w->readers.emplace_back(i, isStderr);
  if (!w->armed) armConsoleWait(*w);
}

void WorkerGroup::armConsoleWait(ConsoleWait& w) {
  w.armed = true;
  w.writable.async_wait(asio::posix::stream_descriptor::wait_write,
                        [self = shared_from_this(), &w](error_code ec) {
                          w.armed = false;
                          if (ec) return;  // cancelled: the group is finishing
                          if (!w.console.pump()) {
                            self->armConsoleWait(w);
                            return;
                          }
                          auto readers = std::move(w.readers);
                          w.readers.clear();
                          for (auto [i, isStderr] : readers) {
                            const Slot& s = *self->slots_[i];
                            if (!(isStderr ? s.errDone : s.outDone)) self->readOutput(i, isStderr);
                          }
                        });
}

void WorkerGroup::onRecord(size_t i, const GuardRecord& r) {
  WorkerResult& res = results_[i];
  switch (r.kind) {
    case GuardRecord::Started:
      res.pid = r.value;
      slots_[i]->started = true;
      DDPRUN_LOG(DEBUG, "launcher") << "rank " << res.globalRank << " started, pid " << r.value;
      if (slots_[i]->pendingSignal != 0) ::kill(-slots_[i]->guardPid, slots_[i]->pendingSignal);
      if (callbacks_.started) callbacks_.started(res);
      break;
    case GuardRecord::ExecFailed:
      res.execErrno = r.value;
      break;
    case GuardRecord::CgroupFailed:
      DDPRUN_LOG(WARN, "launcher") << "rank " << res.globalRank << " could not join its cgroup "
                                   << slots_[i]->cgroupDir << ": " << std::strerror(r.value)
                                   << "; its guard alone stops what it starts";
      break;
    case GuardRecord::Exited:
      if (!slots_[i]->ended) res.waitStatus = r.value;  // else ended early (endEarly): as then
      onWorkerEnded(i);
      break;
    default:
      DDPRUN_LOG(WARN, "launcher") << "guard of rank " << res.globalRank
                                   << " sent an unknown record " << r.kind;
  }
}

void WorkerGroup::onWorkerEnded(size_t i) {
  Slot& s = *slots_[i];
  if (s.ended) return;
  s.ended = true;
  WorkerResult& res = results_[i];
  res.ended = true;
  res.endTime = std::chrono::system_clock::now();
  res.stopSignal = stopSignal_;
  // A waiting spare stopped because the group closed (every worker ended): ddprun's doing.
  if (res.spare && controlsClosed_ && res.stopSignal == 0) res.stopSignal = SIGKILL;
  if (callbacks_.exited) callbacks_.exited(res);
  if (runningCount() == 0) closeControls();
  checkStopped();
}

void WorkerGroup::onGuardGone(size_t i) {
  Slot& s = *slots_[i];
  // Safe even if the group is gone: the guard is not reaped yet, so its pid (the pgid)
  // cannot have been reused. Needed when the guard died without killing the group.
  ::kill(-s.guardPid, SIGKILL);
  int st = 0;
  while (::waitpid(s.guardPid, &st, 0) < 0 && errno == EINTR) {
  }
  // A guard killed from outside could not sweep: what its worker started and is still in the
  // job's cgroup dies when the agent sweeps it, once the whole group has stopped.
  s.reaped = true;
  s.status.close();
  s.control.reset();
  if (!s.ended) {
    WorkerResult& res = results_[i];
    if (res.execErrno != 0) {
      res.waitStatus = 127 << 8;
    } else if (stopSignal_ == SIGKILL) {
      // ddprun itself SIGKILLed the group (after --shutdown-timeout, or a second signal):
      // the guard went with its worker, which is what was asked for, not a failure.
      res.waitStatus = SIGKILL;  // as waitpid reports a death by SIGKILL
      DDPRUN_LOG(DEBUG, "launcher") << "rank " << res.globalRank << " stopped by ddprun with SIGKILL";
    } else {
      res.guardLost = true;
      DDPRUN_LOG(ERROR, "launcher") << "the guard of rank " << res.globalRank << " (pid "
                                    << s.guardPid << ") died; its workers were killed";
    }
    onWorkerEnded(i);
  }
  checkStopped();
}

void WorkerGroup::stop(int sig, std::chrono::milliseconds grace) {
  stopSignal_ = sig;
  for (auto& s : slots_) {
    if (s->ended || s->reaped) continue;
    // A guard still setting up would drop the signal (it ignores it, and the worker does not
    // exist yet): it is sent when the Started record arrives. SIGKILL needs no such care.
    if (sig == SIGKILL) {
      releaseGuard(s->control);  // the guard kills the worker and every descendant, then reports
    } else if (s->started) {
      ::kill(-s->guardPid, sig);
      // A stopped (SIGSTOP, frozen) worker would keep the signal pending until continued and
      // hold the job for the whole grace period: continue it so it gets the signal now.
      ::kill(-s->guardPid, SIGCONT);
    } else {
      s->pendingSignal = sig;
    }
  }
  if (sig == SIGKILL || runningCount() == 0) return;
  timers_->kill.expires_after(grace);
  timers_->kill.async_wait([self = shared_from_this(), grace](error_code ec) {
    if (ec || self->runningCount() == 0) return;
    DDPRUN_LOG(WARN, "launcher") << self->runningCount() << " worker(s) still running "
                                 << grace.count() / 1000.0 << " s after the stop signal: "
                                 << "sending SIGKILL";
    self->stopSignal_ = SIGKILL;
    for (auto& s : self->slots_) {
      if (!s->ended && !s->reaped) releaseGuard(s->control);  // the guard's sweep (see stop())
    }
  });
}

void WorkerGroup::kill(int localRank, const std::string& why) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    if (results_[i].localRank != localRank || s.ended || s.reaped) continue;
    results_[i].killedBecause = why;
    ::kill(s.guardPid, SIGCONT);  // not reaped: its pid is still its own
    releaseGuard(s.control);      // the guard kills the worker and every descendant, reports
                                  // (the release byte: a stop, not the launcher's death, so
                                  // the job's cgroup and the other workers are left alone)
  }
}

void WorkerGroup::closeControls() {
  if (controlsClosed_) return;
  controlsClosed_ = true;
  timers_->kill.cancel();
  for (auto& s : slots_) releaseGuard(s->control);  // each guard now kills its process group
}

void WorkerGroup::checkStopped() {
  if (stoppedFired_) return;
  for (auto& s : slots_) {
    if (!s->reaped) return;
  }
  bool drained = true;
  for (auto& s : slots_) drained = drained && s->outDone && s->errDone;
  if (!drained) {
    // Every process group is dead, yet a pipe is still open: a process escaped its group
    // (setsid) and holds it. Give it a moment, then stop listening.
    if (!drainArmed_) {
      drainArmed_ = true;
      timers_->drain.expires_after(std::chrono::milliseconds(200));
      timers_->drain.async_wait([self = shared_from_this()](error_code ec) {
        if (ec) return;
        self->finishOutputs();
        self->checkStopped();
      });
    }
    return;
  }
  stoppedFired_ = true;
  timers_->drain.cancel();
  for (auto& s : slots_) {
    for (const StreamSink* sink : {&s->outSink, &s->errSink}) {
      if (sink->fileLostBytes() == 0) continue;
      DDPRUN_LOG(WARN, "launcher") << sink->fileLostBytes() << " bytes of worker output were lost: "
                                   << "log file " << sink->filePath() << ": "
                                   << std::strerror(sink->fileError());
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) results_[i].stderrTail = slots_[i]->errSink.tail();
  if (callbacks_.stopped) {
    asio::post(io_, [self = shared_from_this()] { self->callbacks_.stopped(); });
  }
}

void WorkerGroup::finishOutputs() {
  for (auto& w : consoleWaits_) {
    boost::system::error_code ec;
    w->writable.cancel(ec);
    w->readers.clear();
  }
  for (auto& s : slots_) {
    if (!s->outDone) {
      s->outSink.finish();
      s->out.close();
      s->outDone = true;
    }
    if (!s->errDone) {
      s->errSink.finish();
      s->err.close();
      s->errDone = true;
    }
  }
}

void WorkerGroup::killAll() {
  // Closing the control pipes makes every guard sweep its descendants and exit. A guard
  // that has not exited after kGuardSweepBound (stuck, or stopped) is SIGKILLed with its
  // group.
  constexpr auto kGuardSweepBound = std::chrono::seconds(5);
  for (auto& s : slots_) {
    if (!s->reaped) releaseGuard(s->control);
  }
  const auto deadline = std::chrono::steady_clock::now() + kGuardSweepBound;
  for (auto& s : slots_) {
    if (s->reaped) continue;
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(s->guardPid, &st, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      ::usleep(1000);
    }
    if (r == 0) {
      ::kill(-s->guardPid, SIGKILL);
      while (::waitpid(s->guardPid, &st, 0) < 0 && errno == EINTR) {
      }
    }
    s->reaped = true;
    boost::system::error_code ec;
    s->status.close(ec);
  }
  timers_->kill.cancel();
  timers_->drain.cancel();
  for (auto& w : consoleWaits_) {
    boost::system::error_code ec;
    w->writable.cancel(ec);
  }
}

size_t WorkerGroup::runningCount() const {
  size_t n = 0;
  for (size_t i = 0; i < slots_.size(); ++i) n += slots_[i]->ended || results_[i].spare ? 0 : 1;
  return n;
}

std::vector<WorkerResult> WorkerGroup::waitingSpares() const {
  std::vector<WorkerResult> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (results_[i].spare && !results_[i].sparesTemplate && !slots_[i]->ended) {
      out.push_back(results_[i]);
    }
  }
  return out;
}

std::vector<pid_t> WorkerGroup::workerPids() const {
  std::vector<pid_t> pids;
  for (auto& r : results_) {
    if (r.pid > 0 && !r.spare) pids.push_back(r.pid);
  }
  return pids;
}

}  // namespace ddprun::launcher
