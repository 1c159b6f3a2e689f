// The rendezvous state machine: pure transitions, encoding, rank assignment and markers.
#include <catch2/catch.hpp>

#include "rendezvous/round_state.h"

using namespace ddprun;
using namespace ddprun::rendezvous;

namespace {

NodeInfo node(const std::string& addr, int nproc = 1) {
  return NodeInfo{.id = addr + "-1-aaaaaa", .addr = addr, .nproc = nproc, .masterPort = 1234};
}

// Applies join for each node in order; every join must change the state.
RoundState joinAll(RoundState s, const std::vector<NodeInfo>& nodes, const JobLimits& lim) {
  for (const auto& n : nodes) {
    auto next = transition::join(s, n, lim);
    REQUIRE(next.has_value());
    s = *next;
  }
  return s;
}

std::vector<std::string> addrsByRank(const RoundState& s) {
  std::vector<std::string> out;
  for (const auto& m : s.members) out.push_back(m.addr);
  return out;
}

}  // namespace

TEST_CASE("a round closes when MAX nodes have joined, ranks in address order", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 3};
  RoundState s = joinAll({}, {node("127.0.0.10"), node("127.0.0.3")}, lim);
  CHECK(s.phase == Phase::Joining);  // MIN reached: last call, not closed
  s = joinAll(s, {node("127.0.0.2")}, lim);
  REQUIRE(s.phase == Phase::Closed);
  CHECK(addrsByRank(s) == std::vector<std::string>{"127.0.0.2", "127.0.0.3", "127.0.0.10"});
  CHECK(s.round == 0);
  // Joining twice is a no-op.
  CHECK_FALSE(transition::join(s, node("127.0.0.2"), lim).has_value());
}

TEST_CASE("the last-call deadline closes a round with at least MIN members", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 4};
  RoundState one = joinAll({}, {node("10.0.0.1")}, lim);
  CHECK_FALSE(transition::closeAtDeadline(one, 0, lim).has_value());  // below MIN
  RoundState two = joinAll(one, {node("10.0.0.2")}, lim);
  CHECK_FALSE(transition::closeAtDeadline(two, 1, lim).has_value());  // another round
  auto closed = transition::closeAtDeadline(two, 0, lim);
  REQUIRE(closed);
  CHECK(closed->phase == Phase::Closed);
  CHECK(closed->members.size() == 2);
}

TEST_CASE("an arrival in a running job opens a new round, ranks are kept", "[rdzv][state]") {
  JobLimits lim{.minNodes = 1, .maxNodes = 3};
  RoundState s = joinAll({}, {node("10.0.0.5"), node("10.0.0.7")}, lim);
  s = *transition::closeAtDeadline(s, 0, lim);
  REQUIRE(addrsByRank(s) == std::vector<std::string>{"10.0.0.5", "10.0.0.7"});

  auto next = transition::join(s, node("10.0.0.1"), lim);  // sorts first by address...
  REQUIRE(next);
  CHECK(next->round == 1);
  CHECK(next->phase == Phase::Joining);
  CHECK(next->reason.find("arrived") != std::string::npos);
  REQUIRE(next->expected.size() == 2);
  CHECK(next->expected[1].prevRank == 1);
  // ...but the old members keep their ranks when they come back: the newcomer gets rank 2.
  RoundState r1 = joinAll(*next, {node("10.0.0.7"), node("10.0.0.5")}, lim);
  REQUIRE(r1.phase == Phase::Closed);
  CHECK(addrsByRank(r1) == std::vector<std::string>{"10.0.0.5", "10.0.0.7", "10.0.0.1"});
  CHECK(r1.restarts == 0);  // a membership change spends no restart
}

TEST_CASE("a re-formed round closes as soon as every expected node is back", "[rdzv][state]") {
  JobLimits lim{.minNodes = 1, .maxNodes = 8};
  RoundState s = joinAll({}, {node("a1"), node("a2"), node("a3")}, lim);
  s = *transition::closeAtDeadline(s, 0, lim);
  auto next = transition::remove(s, node("a2").id, "a2 left", lim);
  REQUIRE(next);
  CHECK(next->round == 1);
  CHECK(next->reason == "a2 left");
  RoundState r1 = joinAll(*next, {node("a3")}, lim);
  CHECK(r1.phase == Phase::Joining);
  r1 = joinAll(r1, {node("a1")}, lim);
  REQUIRE(r1.phase == Phase::Closed);
  // a3 had rank 2, which no longer exists: it takes the free rank 1. a1 keeps rank 0.
  CHECK(addrsByRank(r1) == std::vector<std::string>{"a1", "a3"});
}

TEST_CASE("evicting an expected node that never returns closes the round", "[rdzv][state]") {
  JobLimits lim{.minNodes = 1, .maxNodes = 3};
  RoundState s = joinAll({}, {node("b1"), node("b2"), node("b3")}, lim);
  REQUIRE(s.phase == Phase::Closed);
  RoundState r1 = *transition::remove(s, node("b3").id, "b3 evicted", lim);
  r1 = joinAll(r1, {node("b1")}, lim);
  CHECK(r1.phase == Phase::Joining);  // b2 is still expected
  auto after = transition::remove(r1, node("b2").id, "b2 evicted", lim);
  REQUIRE(after);
  CHECK(after->phase == Phase::Closed);
  CHECK(addrsByRank(*after) == std::vector<std::string>{"b1"});
  // Removing a node the state does not know is a no-op.
  CHECK_FALSE(transition::remove(*after, "nobody", "x", lim).has_value());
}

TEST_CASE("a full job puts arrivals on the waiting list", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 2};
  RoundState s = joinAll({}, {node("c1"), node("c2")}, lim);
  REQUIRE(s.phase == Phase::Closed);
  auto w = transition::join(s, node("c3"), lim);
  REQUIRE(w);
  CHECK(w->round == 0);
  CHECK(w->phase == Phase::Closed);
  REQUIRE(w->waiting.size() == 1);
  CHECK_FALSE(transition::join(*w, node("c3"), lim).has_value());
  // When a member leaves, the waiting node is expected in the next round.
  auto r1 = transition::remove(*w, node("c1").id, "c1 left", lim);
  REQUIRE(r1);
  CHECK(r1->expected.size() == 2);
  RoundState closed = joinAll(*r1, {node("c3"), node("c2")}, lim);
  REQUIRE(closed.phase == Phase::Closed);
  CHECK(addrsByRank(closed) == std::vector<std::string>{"c3", "c2"});  // c2 keeps rank 1
}

TEST_CASE("worker failures spend the job-wide budget once, then fail the job", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 2, .maxRestarts = 1};
  RoundState s = joinAll({}, {node("d1"), node("d2")}, lim);
  auto r1 = transition::failWorkers(s, 0, node("d2").id, 3, "exit code 3", lim);
  REQUIRE(r1);
  CHECK(r1->round == 1);
  CHECK(r1->restarts == 1);
  // The other node's workers fail too (their peer vanished): round 0 is over, nothing spent.
  CHECK_FALSE(transition::failWorkers(*r1, 0, node("d1").id, 1, "exit code 1", lim).has_value());
  RoundState again = joinAll(*r1, {node("d1"), node("d2")}, lim);
  REQUIRE(again.phase == Phase::Closed);
  CHECK(again.restarts == 1);
  auto failed = transition::failWorkers(again, 1, node("d1").id, 7, "exit code 7", lim);
  REQUIRE(failed);
  CHECK(failed->phase == Phase::Failed);
  CHECK(failed->exitCode == 7);
  CHECK(failed->reason.find("no restart is left") != std::string::npos);
  CHECK_THROWS_AS(transition::join(*failed, node("d3"), lim), JobEndedError);
}

TEST_CASE("an in-process recovery spends the budget in the same round, then fails the job",
          "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 2, .maxRestarts = 1};
  RoundState s = joinAll({}, {node("i1"), node("i2")}, lim);
  auto r1 = transition::recoverWorkers(s, 0, node("i2").id, 9, "rank 2 died", lim);
  REQUIRE(r1);
  CHECK(r1->round == 0);  // no new round: the other node does not restart
  CHECK(r1->phase == Phase::Closed);
  CHECK(r1->restarts == 1);
  CHECK(r1->members.size() == 2);
  // A round already over: nothing spent (the agents restart with the new round).
  CHECK_FALSE(transition::recoverWorkers(s, 3, node("i2").id, 9, "late", lim).has_value());
  auto failed = transition::recoverWorkers(*r1, 0, node("i1").id, 9, "rank 0 died", lim);
  REQUIRE(failed);
  CHECK(failed->phase == Phase::Failed);
  CHECK(failed->reason.find("no restart is left") != std::string::npos);
  auto once = transition::recoverWorkers(s, 0, node("i1").id, 2, "bad config", lim, true);
  REQUIRE(once);
  CHECK(once->phase == Phase::Failed);
  CHECK(once->restarts == 0);
}

TEST_CASE("an in-process recovery that failed after spending the last restart restarts the "
          "group without spending a second one", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 2, .maxRestarts = 1};
  RoundState s = joinAll({}, {node("j1"), node("j2")}, lim);
  auto recovered = transition::recoverWorkers(s, 0, node("j2").id, 9, "rank 3 died", lim);
  REQUIRE(recovered);
  REQUIRE(recovered->restarts == 1);  // the budget is spent
  // Its spare died before it took the rank: the group restarts, the failure paid for once.
  auto restart =
      transition::failRecoveredWorkers(*recovered, 0, node("j2").id, "rank 3 died", lim);
  REQUIRE(restart);
  CHECK(restart->round == 1);
  CHECK(restart->phase == Phase::Joining);
  CHECK(restart->restarts == 1);
  CHECK(restart->expected.size() == 2);
  CHECK(restart->reason ==
        "rank 3 died (after its in-process recovery, which spent restart 1 of 1: no second "
        "restart spent)");
  // failWorkers there would have ended the job: the difference this transition makes.
  auto spentTwice = transition::failWorkers(*recovered, 0, node("j2").id, 9, "rank 3 died", lim);
  REQUIRE(spentTwice);
  CHECK(spentTwice->phase == Phase::Failed);
  // A round already over, or a node that is no member: nothing written.
  CHECK_FALSE(transition::failRecoveredWorkers(*restart, 0, node("j1").id, "late", lim));
  CHECK_FALSE(transition::failRecoveredWorkers(*recovered, 0, "nobody", "x", lim));
  // The next round is a round like any other: its failure spends (and here, ends the job).
  RoundState again = joinAll(*restart, {node("j1"), node("j2")}, lim);
  REQUIRE(again.phase == Phase::Closed);
  auto failed = transition::failWorkers(again, 1, node("j1").id, 1, "exit 1", lim);
  REQUIRE(failed);
  CHECK(failed->phase == Phase::Failed);
}

TEST_CASE("once a node is finishing, arrivals wait instead of restarting", "[rdzv][state]") {
  JobLimits lim{.minNodes = 1, .maxNodes = 3};
  RoundState s = joinAll({}, {node("f1"), node("f2")}, lim);
  s = *transition::closeAtDeadline(s, 0, lim);
  CHECK_FALSE(transition::nodeDone(s, 7, node("f1").id).has_value());
  RoundState fin = *transition::nodeDone(s, 0, node("f1").id);
  CHECK(fin.finishing());
  CHECK(fin.phase == Phase::Closed);
  CHECK_FALSE(transition::nodeDone(fin, 0, node("f1").id).has_value());  // once
  auto w = transition::join(fin, node("f3"), lim);
  REQUIRE(w);
  CHECK(w->round == 0);  // no new round: f3 waits
  CHECK(w->waiting.size() == 1);
  // A failure still restarts everybody, and the new round is not finishing.
  auto r1 = transition::failWorkers(*w, 0, node("f2").id, 1, "exit 1",
                                    JobLimits{.minNodes = 1, .maxNodes = 3, .maxRestarts = 1});
  REQUIRE(r1);
  CHECK_FALSE(r1->finishing());
  CHECK(r1->expected.size() == 3);
  CHECK(decodeState(encodeState(fin), "k") == fin);
  // The last member done: Finished, and final.
  auto end = transition::nodeDone(*w, 0, node("f2").id);
  REQUIRE(end);
  CHECK(end->phase == Phase::Finished);
  CHECK(end->ended());
  CHECK_THROWS_AS(transition::join(*end, node("f4"), lim), JobEndedError);
  CHECK_FALSE(transition::remove(*end, node("f1").id, "gone", lim).has_value());
  CHECK_FALSE(transition::failWorkers(*end, 0, node("f2").id, 1, "x", lim).has_value());
}

TEST_CASE("a member lost in the exit barrier never re-forms a finishing job", "[rdzv][state]") {
  JobLimits lim{.minNodes = 1, .maxNodes = 3, .maxRestarts = 5};
  RoundState s = joinAll({}, {node("g1"), node("g2"), node("g3")}, lim);
  REQUIRE(s.phase == Phase::Closed);
  RoundState fin = *transition::nodeDone(s, 0, node("g1").id);
  // g2 is evicted while g1 waits in the exit barrier: no new round, g2 is lost.
  auto lost = transition::remove(fin, node("g2").id, "node g2 was evicted: no heartbeat", lim);
  REQUIRE(lost);
  CHECK(lost->round == 0);
  CHECK(lost->phase == Phase::Closed);
  CHECK(lost->lost == std::vector<std::string>{node("g2").id});
  CHECK_FALSE(transition::remove(*lost, node("g2").id, "again", lim).has_value());
  CHECK_FALSE(transition::remove(*lost, node("g1").id, "a done node leaves", lim).has_value());
  CHECK(decodeState(encodeState(*lost), "k") == *lost);
  // g3 finishes: every member is done or lost, the job is Finished, naming the loss.
  auto end = transition::nodeDone(*lost, 0, node("g3").id);
  REQUIRE(end);
  CHECK(end->phase == Phase::Finished);
  CHECK(end->reason.find("lost in the exit barrier") != std::string::npos);
  CHECK(end->reason.find("no heartbeat") != std::string::npos);
  // A lost node that comes back and reports done finds the job over: nothing to write.
  CHECK_FALSE(transition::nodeDone(*end, 0, node("g2").id).has_value());
  // Before the end, a lost node reporting done moves to done.
  auto back = transition::nodeDone(*lost, 0, node("g2").id);
  REQUIRE(back);
  CHECK(back->lost.empty());
  CHECK(back->done.size() == 2);
  // A failure after a loss restarts without the lost node.
  auto r1 = transition::failWorkers(*lost, 0, node("g3").id, 1, "exit 1", lim);
  REQUIRE(r1);
  CHECK(r1->expected.size() == 2);
  CHECK_FALSE(r1->knows(node("g2").id));
}

TEST_CASE("a failure that retrying cannot fix ends the job at once", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 2, .maxRestarts = 20};
  RoundState s = joinAll({}, {node("n1"), node("n2")}, lim);
  auto f = transition::failWorkers(s, 0, node("n2").id, 2, "checkpoint does not fit", lim, true);
  REQUIRE(f);
  CHECK(f->phase == Phase::Failed);
  CHECK(f->exitCode == 2);
  CHECK(f->restarts == 0);
  CHECK(f->reason.find("checkpoint does not fit") != std::string::npos);
  CHECK(f->reason.find("not retryable") != std::string::npos);
}

TEST_CASE("finish ends the job only from the round it names", "[rdzv][state]") {
  JobLimits lim{.minNodes = 1, .maxNodes = 1};
  RoundState s = joinAll({}, {node("e1")}, lim);
  CHECK_FALSE(transition::finish(s, 5).has_value());
  auto f = transition::finish(s, 0);
  REQUIRE(f);
  CHECK(f->phase == Phase::Finished);
  CHECK_THROWS_AS(transition::join(*f, node("e2"), lim), JobEndedError);
}

TEST_CASE("fixed node ranks (static backend) are honoured and checked", "[rdzv][state]") {
  JobLimits lim{.minNodes = 3, .maxNodes = 3};
  auto fixed = [](const std::string& a, int r) {
    NodeInfo n = node(a);
    n.fixedRank = r;
    return n;
  };
  RoundState s = joinAll({}, {fixed("z", 0), fixed("a", 2)}, lim);
  CHECK_THROWS_WITH(transition::join(s, fixed("m", 2), lim),
                    Catch::Contains("--node-rank=2 is already taken"));
  CHECK_THROWS_WITH(transition::join(s, fixed("m", 3), lim), Catch::Contains("out of range"));
  s = joinAll(s, {fixed("m", 1)}, lim);
  REQUIRE(s.phase == Phase::Closed);
  CHECK(addrsByRank(s) == std::vector<std::string>{"z", "m", "a"});
}

TEST_CASE("states survive encoding, bad blobs are rejected with the key named", "[rdzv][state]") {
  JobLimits lim{.minNodes = 1, .maxNodes = 4};
  RoundState s = joinAll({}, {node("h1", 4), node("h2", 2)}, lim);
  s = *transition::closeAtDeadline(s, 0, lim);
  s = *transition::join(s, node("h3", 8), lim);  // round 1, with expected nodes
  s.reason = "line one\nline two";
  RoundState back = decodeState(encodeState(s), "'state/3'");
  s.reason = "line one line two";  // reasons are kept on one line
  CHECK(back == s);
  CHECK_THROWS_WITH(decodeState("hello", "'state/3'"), Catch::Contains("'state/3'"));
  CHECK_THROWS_AS(decodeState(encodeState(s) + "bogus 1\n", "k"), StoreError);
  CHECK_THROWS_AS(decodeState(encodeState(s) + "member x y 0 1 -1 -1\n", "k"), StoreError);
}

TEST_CASE("marker keys follow the phase", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 3};
  RoundState s = joinAll({}, {node("m1")}, lim);
  CHECK(markersFor(s, lim).empty());
  s = joinAll(s, {node("m2")}, lim);
  CHECK(markersFor(s, lim) == std::vector<std::string>{lastCallKey(0)});
  s = joinAll(s, {node("m3")}, lim);
  CHECK(markersFor(s, lim) == std::vector<std::string>{lastCallKey(0), closedKey(0)});
  auto r1 = *transition::remove(s, node("m3").id, "gone", lim);
  CHECK(markersFor(r1, lim) == std::vector<std::string>{overKey(0)});
  auto fin = *transition::finish(s, 0);
  auto m = markersFor(fin, lim);
  CHECK(std::find(m.begin(), m.end(), overKey(0)) != m.end());
}

TEST_CASE("natural order compares numbers inside addresses", "[rdzv][state]") {
  CHECK(naturalLess("127.0.0.9", "127.0.0.10"));
  CHECK_FALSE(naturalLess("127.0.0.10", "127.0.0.9"));
  CHECK(naturalLess("node2", "node10"));
  CHECK(naturalLess("a", "b"));
  CHECK(naturalLess("node", "node1"));
  CHECK_FALSE(naturalLess("x", "x"));
}

TEST_CASE("a node lost in process: the closed round goes on, node rank 0 decides",
          "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 3, .maxRestarts = 1, .keepRoundOnNodeLoss = true};
  RoundState s = joinAll({}, {node("127.0.0.2"), node("127.0.0.3"), node("127.0.0.4")}, lim);
  REQUIRE(s.phase == Phase::Closed);
  const std::string one = s.members[1].id, zero = s.members[0].id;
  auto lost = transition::remove(s, one, "node evicted", lim);
  REQUIRE(lost);
  CHECK(lost->round == 0);  // no new round: the others keep running
  CHECK(lost->phase == Phase::Closed);
  CHECK(lost->restarts == 0);  // spent by node rank 0's agent, or not at all
  CHECK(lost->lost == std::vector<std::string>{one});
  CHECK(lost->members.size() == 3);
  CHECK_FALSE(lost->finishing());
  CHECK_FALSE(transition::remove(*lost, one, "again", lim).has_value());  // once
  // The state survives its encoding, and the validation lets it through.
  const RoundState back = decodeState(encodeState(*lost), "'state/9'");
  CHECK(back == *lost);
  validateState(back, lim, "'state/9'");
  // In process: node rank 0 spends the restart, the round goes on.
  auto kept = transition::recoverWorkers(*lost, 0, zero, 1, "node rank 1 was lost", lim);
  REQUIRE(kept);
  CHECK(kept->round == 0);
  CHECK(kept->restarts == 1);
  // The exit barrier does not wait for the lost node.
  auto done = transition::nodeDone(*kept, 0, zero);
  REQUIRE(done);
  CHECK(done->phase == Phase::Closed);
  done = transition::nodeDone(*done, 0, s.members[2].id);
  REQUIRE(done);
  CHECK(done->phase == Phase::Finished);
  // Not in process: round 1 without the lost node, no restart spent.
  auto again = transition::reformWithoutLost(*lost, 0, "node rank 1 was lost; restarting");
  REQUIRE(again);
  CHECK(again->round == 1);
  CHECK(again->restarts == 0);
  REQUIRE(again->expected.size() == 2);
  CHECK(again->expected[0].id == zero);
  CHECK(again->expected[1].id == s.members[2].id);
  CHECK_FALSE(transition::reformWithoutLost(s, 0, "nothing lost").has_value());
  CHECK_FALSE(transition::reformWithoutLost(*lost, 5, "another round").has_value());
  // A failure after the loss restarts without it too.
  auto failed = transition::failWorkers(*lost, 0, zero, 1, "exit 1", lim);
  REQUIRE(failed);
  CHECK(failed->expected.size() == 2);
  // Node rank 0's loss re-forms as before (the workers' store is gone with it), and so does
  // any loss without keepRoundOnNodeLoss.
  auto zeroLost = transition::remove(s, zero, "node 0 evicted", lim);
  REQUIRE(zeroLost);
  CHECK(zeroLost->round == 1);
  JobLimits plain = lim;
  plain.keepRoundOnNodeLoss = false;
  auto restart = transition::remove(s, one, "node evicted", plain);
  REQUIRE(restart);
  CHECK(restart->round == 1);
}

TEST_CASE("a state naming a lost node twice is refused", "[rdzv][state]") {
  JobLimits lim{.minNodes = 2, .maxNodes = 3, .maxRestarts = 1, .keepRoundOnNodeLoss = true};
  RoundState s = joinAll({}, {node("127.0.0.2"), node("127.0.0.3"), node("127.0.0.4")}, lim);
  s.lost = {s.members[1].id, s.members[1].id};
  CHECK_THROWS_WITH(validateState(decodeState(encodeState(s), "'state/4'"), lim, "'state/4'"),
                    Catch::Contains("a lost node appears twice"));
  s.lost = {"a-1", "b-1", "c-1", "d-1"};
  CHECK_THROWS_WITH(validateState(s, lim, "'state/4'"), Catch::Contains("more than MAX=3"));
}
