// ThreadedStoreServer's thread priority (threaded_store_server.h): the thread that serves the
// store asks for a lower niceness; only that thread gets it -- the thread that made the server,
// and every process forked from it (an agent's workers' guards), keep theirs -- and the server
// still serves. Whether it may is the kernel's call (CAP_SYS_NICE or RLIMIT_NICE): with the
// capability the raise must happen, without it the thread must stay where it was. Asked for
// real time, the serving thread alone runs SCHED_RR (with the capability it must).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"

using namespace ddprun::rendezvous;

namespace {

std::set<int> threadIds() {
  std::set<int> ids;
  DIR* d = ::opendir("/proc/self/task");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ids.insert(std::stoi(e->d_name));
  }
  ::closedir(d);
  return ids;
}

// Field 19 of /proc/self/task/<tid>/stat: the thread's niceness.
int niceOf(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  for (int i = 3; i <= 19; ++i) rest >> field;  // state is field 3
  return std::stoi(field);
}

bool hasCapSysNice() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> 23) & 1;
  }
  return false;
}

}  // namespace

TEST_CASE("a threaded store's thread gets the higher priority it asks for, alone: its creator and "
          "the processes the creator forks keep their niceness, and it serves") {
  const int self = static_cast<int>(::syscall(SYS_gettid));
  const int before = niceOf(self);
  const std::set<int> old = threadIds();
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0}, {.raisePriority = 5});
  std::set<int> fresh;
  for (int tid : threadIds()) {
    if (!old.count(tid)) fresh.insert(tid);
  }
  // The server's thread, and under a sanitizer maybe its runtime's own (TSan starts a background
  // thread when the first one is created), which keeps the creator's niceness as any other.
  REQUIRE(!fresh.empty());
  if (hasCapSysNice()) CHECK(server.priorityRaised());
  const int raisedTo = std::max(before - 5, -20);
  int raised = 0;
  for (int tid : fresh) {
    const int nice = niceOf(tid);
    INFO("thread " << tid << " nice " << nice << ", the creator's " << before);
    CHECK((nice == before || (server.priorityRaised() && nice == raisedTo)));
    raised += nice != before ? 1 : 0;
  }
  CHECK(raised == (server.priorityRaised() ? 1 : 0));  // the serving thread alone
  CHECK(niceOf(self) == before);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(::getpriority(PRIO_PROCESS, 0) + 20);  // 0..39
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WEXITSTATUS(status) == before + 20);

  TcpStore client({.host = "127.0.0.1", .port = server.port(), .timeout = Millis(5000)});
  client.set("k", "v");
  CHECK(client.get("k") == "v");
  CHECK(!server.instanceId().empty());

  ThreadedStoreServer plain({.host = "127.0.0.1", .port = 0});
  CHECK(!plain.priorityRaised());
}

TEST_CASE("a threaded store's thread asked for real time runs SCHED_RR alone: its creator and the "
          "processes the creator forks keep normal scheduling, and it serves") {
  const std::set<int> old = threadIds();
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0},
                             {.raisePriority = 5, .realtime = true});
  if (hasCapSysNice()) CHECK(server.realtime());
  if (server.realtime()) CHECK(server.priorityRaised());
  int realtimeThreads = 0;
  for (int tid : threadIds()) {
    const int policy = ::sched_getscheduler(tid) & ~SCHED_RESET_ON_FORK;
    INFO("thread " << tid << " policy " << policy << (old.count(tid) ? " (before)" : " (new)"));
    if (old.count(tid)) CHECK(policy == SCHED_OTHER);
    CHECK((policy == SCHED_OTHER || policy == SCHED_RR));
    realtimeThreads += policy == SCHED_RR ? 1 : 0;
  }
  CHECK(realtimeThreads == (server.realtime() ? 1 : 0));  // the serving thread alone
  const pid_t child = ::fork();
  if (child == 0) ::_exit(::sched_getscheduler(0) == SCHED_OTHER ? 0 : 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WEXITSTATUS(status) == 0);

  TcpStore client({.host = "127.0.0.1", .port = server.port(), .timeout = Millis(5000)});
  client.set("k", "v");
  CHECK(client.get("k") == "v");

  ThreadedStoreServer plain({.host = "127.0.0.1", .port = 0});
  CHECK(!plain.realtime());
}
