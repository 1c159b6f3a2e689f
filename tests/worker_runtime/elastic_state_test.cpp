// ElasticState (worker_runtime/elastic/): commit and restore are bit-exact, SGD's momentum that
// a rolled-back step created is dropped, and broadcast heals a fresh rank (no momentum yet) from
// a trained one over real communicators (ranks as threads on one MemoryStore, Gloo and shm).
// The generation record of rendezvous/recovery_keys.h is parsed by a pure function: bad text
// never passes.
#include "tests/support/catch_torch.h"

#include "base/errors.h"
#include "rendezvous/grow_record.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/recovery_keys.h"
#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/elastic/elastic_state.h"
#include "worker_runtime/gloo_communicator.h"
#include "worker_runtime/shm/shm_communicator.h"

using namespace ddprun::runtime;
using ddprun::runtime::test::runRanks;

namespace {

struct Trainee {
  explicit Trainee(int64_t width = 8, const char* stepName = "step") {
    torch::manual_seed(3);
    model = std::make_shared<torch::nn::LinearImpl>(4, width);
    optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    state.addModule(model);
    state.addOptimizer(*optimizer);
    state.addCounter(stepName, &step);
    state.addCounter("loss", &loss);
    state.enable();
  }
  void train(int seed) {
    torch::manual_seed(seed);
    optimizer->zero_grad();
    auto l = model->forward(torch::randn({5, 4})).pow(2).mean();
    l.backward();
    optimizer->step();
    loss = l.item<double>();
    ++step;
  }
  std::vector<torch::Tensor> snapshot() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    // Momentum in parameter order: the optimizer's state map is keyed by the parameters'
    // addresses, so its iteration order differs from one model to another.
    for (const auto& p : model->parameters()) {
      auto it = optimizer->state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == optimizer->state().end()) continue;
      out.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().clone());
    }
    return out;
  }
  std::shared_ptr<torch::nn::LinearImpl> model;
  std::unique_ptr<torch::optim::SGD> optimizer;
  ElasticState state;
  int64_t step = 0;
  double loss = 0;
};

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("elastic state: a rolled-back run computes exactly what an uninterrupted one does",
          "[runtime][elastic]") {
  Trainee straight, rolled;
  for (int s = 1; s <= 3; ++s) straight.train(s);

  rolled.state.commit();  // before any step: no momentum yet
  rolled.train(1);
  rolled.train(99);       // a step that "fails" after it ran
  REQUIRE(rolled.optimizer->state().size() == 2);
  rolled.state.restore();
  CHECK(rolled.step == 0);
  CHECK(rolled.optimizer->state().empty());  // the rolled-back steps' momentum is gone
  for (int s = 1; s <= 2; ++s) rolled.train(s);
  rolled.state.commit();
  rolled.train(7);
  rolled.state.restore();
  CHECK(rolled.step == 2);
  rolled.train(3);
  CHECK(same(rolled.snapshot(), straight.snapshot()));
  CHECK(rolled.loss == straight.loss);
  CHECK(rolled.state.commits() == 2);
}

TEST_CASE("elastic state: commits do nothing until enabled, restore needs a commit",
          "[runtime][elastic]") {
  auto model = std::make_shared<torch::nn::LinearImpl>(2, 2);
  ElasticState state;
  state.addModule(model);
  state.commit();
  CHECK_FALSE(state.committed());
  CHECK_THROWS_AS(state.restore(), ddprun::ConfigError);
  torch::optim::Adam adam(model->parameters());
  CHECK_THROWS_WITH(state.addOptimizer(adam), Catch::Contains("only torch::optim::SGD"));
}

TEST_CASE("elastic state: broadcast heals a fresh rank from a trained one", "[runtime][elastic]") {
  for (const bool shmTransport : {false, true}) {
    INFO("transport " << (shmTransport ? "shm" : "gloo"));
    auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
    std::vector<std::vector<torch::Tensor>> after(2);
    std::vector<int64_t> steps(2);
    std::vector<double> losses(2);
    runRanks(2, [&](int r) {
      auto comm = shmTransport
                      ? shm::makeShmCommunicator(store, {.rank = r, .size = 2,
                                                         .timeout = std::chrono::seconds(20),
                                                         .namePrefix = "ddprun-test-elastic"})
                      : makeGlooCommunicator(store, {.rank = r, .size = 2,
                                                     .timeout = std::chrono::seconds(20),
                                                     .hostname = "127.0.0.1"});
      Trainee t;
      if (r == 1) {  // the survivor: trained, momentum and all
        for (int s = 1; s <= 4; ++s) t.train(s);
      }
      t.state.broadcast(*comm, /*root=*/1);
      after[r] = t.snapshot();
      steps[r] = t.step;
      losses[r] = t.loss;
    });
    CHECK(steps[0] == 4);
    CHECK(losses[0] == losses[1]);
    CHECK(after[0].size() == 4);  // weight, bias and their momentum
    CHECK(same(after[0], after[1]));
  }
}

TEST_CASE("elastic state: after a heal every rank's last commit is the root's state, a fresh "
          "rank's too", "[runtime][elastic]") {
  auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  const int n = 3;
  std::vector<std::vector<torch::Tensor>> atHeal(n), restored(n);
  std::vector<int64_t> steps(n);
  // char, not bool: std::vector<bool> packs the ranks' flags into one word, which two rank
  // threads writing at once can corrupt (a data race: seen once as a lost flag).
  std::vector<char> committedAfter(n);
  runRanks(n, [&](int r) {
    auto comm = shm::makeShmCommunicator(store, {.rank = r, .size = n,
                                                 .timeout = std::chrono::seconds(20),
                                                 .namePrefix = "ddprun-test-elastic"});
    Trainee t;
    // Rank 1 (the root) and rank 2 committed at other steps; rank 0 is a fresh replacement.
    if (r > 0) {
      for (int s = 1; s <= (r == 1 ? 4 : 2); ++s) {
        t.train(s + 10 * r);
        t.state.commit();
      }
      t.train(99);  // past the commit: what the heal must not keep
    }
    if (r == 1) t.state.restore();  // as heal(): the root goes back to its commit first
    t.state.broadcast(*comm, /*root=*/1);
    atHeal[r] = t.snapshot();
    committedAfter[r] = t.state.committed();
    t.train(7);  // a step after the heal, then rolled back
    t.state.restore();
    restored[r] = t.snapshot();
    steps[r] = t.step;
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(same(atHeal[r], atHeal[1]));
    CHECK(same(restored[r], atHeal[1]));  // the commit every rank goes back to is the root's
    CHECK(steps[r] == 4);
    CHECK(committedAfter[r]);
  }
}

TEST_CASE("elastic state: ranks with different state fail naming it", "[runtime][elastic]") {
  auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  std::vector<std::string> errors(2);
  runRanks(2, [&](int r) {
    auto comm = makeGlooCommunicator(
        store, {.rank = r, .size = 2, .timeout = std::chrono::seconds(20), .hostname = "127.0.0.1"});
    Trainee t(r == 0 ? 8 : 9);
    try {
      t.state.broadcast(*comm, 0);
    } catch (const ddprun::ConfigError& e) {
      errors[r] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("another rank's state differs from rank 0's"));
  CHECK_THAT(errors[1], Catch::Contains("tensor 0: 32 elements there, 36 here"));
}

namespace {

// Forwards to a real communicator and counts the collectives this rank calls: a heal's cost is
// its number of collectives (each waits for the slowest rank).
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  torch::Device device() const override { return inner_->device(); }
  Millis timeout() const override { return inner_->timeout(); }
  std::shared_ptr<Work> allreduceAsync(torch::Tensor t, ReduceOp op) override {
    ++collectives;
    return inner_->allreduceAsync(std::move(t), op);
  }
  std::shared_ptr<Work> broadcastAsync(torch::Tensor t, int root) override {
    ++collectives;
    return inner_->broadcastAsync(std::move(t), root);
  }
  torch::Tensor allgather(const torch::Tensor& input) override {
    ++collectives;
    return inner_->allgather(input);
  }
  void barrier() override {
    ++collectives;
    inner_->barrier();
  }
  int collectives = 0;

 private:
  std::shared_ptr<Communicator> inner_;
};

std::shared_ptr<Communicator> shmRank(const std::shared_ptr<ddprun::rendezvous::MemoryStore>& store,
                                      int r, int n) {
  return shm::makeShmCommunicator(store, {.rank = r, .size = n,
                                          .timeout = std::chrono::seconds(20),
                                          .namePrefix = "ddprun-test-elastic"});
}

}  // namespace

TEST_CASE("elastic state: heal rolls the lowest holder back and makes its commit every rank's, "
          "a fresh rank's too, in three collectives", "[runtime][elastic]") {
  auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  const int n = 4;
  std::vector<std::vector<torch::Tensor>> atHeal(n), restored(n);
  std::vector<std::vector<torch::Tensor>> rootCommit(1);
  std::vector<int64_t> steps(n);
  std::vector<double> losses(n);
  std::vector<int> roots(n, -2), collectives(n);
  runRanks(n, [&](int r) {
    CountingCommunicator comm(shmRank(store, r, n));
    Trainee t;
    // Rank 0 is a fresh replacement (no commit, no momentum); rank 1, the lowest holder, is the
    // root; ranks 2 and 3 committed elsewhere. Every holder trained past its commit.
    if (r > 0) {
      for (int s = 1; s <= (r == 1 ? 4 : r); ++s) {
        t.train(s + 10 * r);
        t.state.commit();
        if (r == 1) rootCommit[0] = t.snapshot();
      }
      t.train(99);
    }
    const auto root = t.state.heal(comm);
    roots[r] = root ? *root : -1;
    collectives[r] = comm.collectives;
    atHeal[r] = t.snapshot();
    steps[r] = t.step;
    losses[r] = t.loss;
    t.train(7);  // a step after the heal, then rolled back
    t.state.restore();
    restored[r] = t.snapshot();
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(roots[r] == 1);
    CHECK(collectives[r] == 3);  // the allgather, the mask and counters, one flat buffer (Float)
    CHECK(atHeal[r].size() == 4);  // weight, bias and their momentum
    CHECK(same(atHeal[r], rootCommit[0]));  // the root's commit, not its step 99
    CHECK(same(restored[r], rootCommit[0]));
    CHECK(steps[r] == 4);
    CHECK(losses[r] == losses[1]);
  }
}

TEST_CASE("elastic state: heal where every rank holds the same commit moves nothing (one "
          "allgather), and a rank a commit ahead takes the root's",
          "[runtime][elastic]") {
  auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  const int n = 3;
  for (const bool oneAhead : {false, true}) {
    DYNAMIC_SECTION((oneAhead ? "rank 2 committed once more" : "the same commit everywhere")) {
      std::vector<std::vector<torch::Tensor>> commits(n), atHeal(n);
      std::vector<int> roots(n, -2), collectives(n);
      std::vector<int64_t> steps(n);
      runRanks(n, [&](int r) {
        CountingCommunicator comm(shmRank(store, r, n));
        Trainee t;
        // The ranks are threads sharing torch's global generator, so their losses differ; the
        // counters of data parallel ranks do not: the loss counter is set alike.
        auto train = [&t](int seed) {
          t.train(seed);
          t.loss = 0.25;
        };
        train(1);
        t.state.commit();
        train(2);
        // Only to see whose values a rank ends with: data parallel ranks' commits are equal.
        if (r == 2) {
          torch::NoGradGuard noGrad;
          t.model->weight.add_(1);
        }
        t.state.commit();
        if (oneAhead && r == 2) {
          train(3);
          t.state.commit();
        }
        commits[r] = t.snapshot();
        train(99);  // past the commit: the heal rolls it back
        const auto root = t.state.heal(comm);
        roots[r] = root ? *root : -1;
        collectives[r] = comm.collectives;
        atHeal[r] = t.snapshot();
        steps[r] = t.step;
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(roots[r] == 0);
        CHECK(collectives[r] == (oneAhead ? 3 : 1));
        // Its own commit when all are the same one; else the root's (rank 0's).
        CHECK(same(atHeal[r], commits[oneAhead ? 0 : r]));
        CHECK(steps[r] == 2);
      }
      CHECK_FALSE(same(commits[2], commits[0]));
    }
  }
}

TEST_CASE("elastic state: heal with no holder changes nothing, and other state fails on every "
          "rank before anything moved", "[runtime][elastic]") {
  auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  std::vector<char> none(2);  // char: see committedAfter
  runRanks(2, [&](int r) {
    Trainee t;
    const auto before = t.snapshot();
    none[r] = !t.state.heal(*shmRank(store, r, 2)).has_value();
    CHECK(same(t.snapshot(), before));
  });
  CHECK(none == std::vector<char>{true, true});

  // Rank 1 names its step counter otherwise: the same tensors and counts, another program.
  auto store2 = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  std::vector<std::string> errors(2);
  std::vector<char> unchanged(2);
  runRanks(2, [&](int r) {
    Trainee t(8, r == 1 ? "steps" : "step");
    t.train(1);
    t.state.commit();
    t.train(2);
    const auto before = t.snapshot();
    try {
      t.state.heal(*shmRank(store2, r, 2));
    } catch (const ddprun::ConfigError& e) {
      errors[r] = e.what();
    }
    unchanged[r] = same(t.snapshot(), before) && t.step == 2;
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(errors[r], Catch::Contains("rank(s) 1 registered other state than rank 0, which "
                                          "holds the commit"));
    CHECK(unchanged[r]);
  }
}

TEST_CASE("recovery keys: the generation record round-trips and refuses bad text",
          "[runtime][elastic]") {
  namespace keys = ddprun::rendezvous::recovery;
  const std::string text =
      keys::formatGenerationRecord({.generation = 3, .replaced = {1, 4}, .cause = "rank 1 died"});
  const auto r = keys::parseGenerationRecord(text);
  REQUIRE(r);
  CHECK(r->generation == 3);
  CHECK(r->replaced == std::vector<int>{1, 4});
  CHECK(r->cause == "rank 1 died");
  for (const char* bad : {"", "generation=0 replaced=1", "generation=2 replaced=", "generation=x replaced=1",
                          "generation=2 replaced=1,,2", "generation=2 replaced=-1", "replaced=1 generation=2",
                          "generation=2"}) {
    INFO(bad);
    CHECK_FALSE(keys::parseGenerationRecord(bad));
  }
  CHECK(keys::generationKey(2) == "ddprun/generation/2");
  CHECK(keys::attemptPrefix(1) == "/worker/attempt_1");
  CHECK(r->spare == -1);
  // A generation whose rank a hot spare takes names it.
  const auto withSpare = keys::parseGenerationRecord(keys::formatGenerationRecord(
      {.generation = 2, .replaced = {1}, .cause = "x", .spare = 7}));
  REQUIRE(withSpare);
  CHECK(withSpare->spare == 7);
  CHECK(withSpare->replaced == std::vector<int>{1});
  for (const char* bad : {"generation=2 replaced=1 spare=", "generation=2 replaced=1 spare=-1",
                          "generation=2 replaced=1 spare=a", "generation=2 replaced=1 spares=1"}) {
    INFO(bad);
    CHECK_FALSE(keys::parseGenerationRecord(bad));
  }
}

TEST_CASE("recovery keys: a shrink record round-trips, re-densifies ranks and refuses bad text",
          "[runtime][elastic]") {
  namespace keys = ddprun::rendezvous::recovery;
  const auto r = keys::parseGenerationRecord(keys::formatGenerationRecord(
      {.generation = 2, .cause = "rank 1 died", .removed = {1, 3}, .worldSize = 3}));
  REQUIRE(r);
  CHECK(r->generation == 2);
  CHECK(r->replaced.empty());
  CHECK(r->removed == std::vector<int>{1, 3});
  CHECK(r->worldSize == 3);
  CHECK(r->cause == "rank 1 died");
  // Ranks 0 1 2 3 4 without 1 and 3: 0 -> 0, 2 -> 1, 4 -> 2.
  CHECK(keys::shrinkRank(0, r->removed) == 0);
  CHECK(keys::shrinkRank(2, r->removed) == 1);
  CHECK(keys::shrinkRank(4, r->removed) == 2);
  CHECK(keys::shrinkRank(1, r->removed) == -1);
  CHECK(keys::shrinkRank(3, r->removed) == -1);
  for (const char* bad : {"generation=2 removed=1", "generation=2 removed=1 world_size=",
                          "generation=2 removed=1 world_size=0", "generation=2 removed= world_size=1",
                          "generation=2 removed=1 world_size=2 spare=1",
                          "generation=2 removed=1 worldsize=2", "generation= removed=1 world_size=1"}) {
    INFO(bad);
    CHECK_FALSE(keys::parseGenerationRecord(bad));
  }
}

TEST_CASE("recovery keys: a shrink record of several nodes carries each node's count",
          "[runtime][elastic]") {
  namespace keys = ddprun::rendezvous::recovery;
  const std::string text = keys::formatGenerationRecord(
      {.generation = 3, .cause = "rank 2 on node 1 died", .removed = {2}, .worldSize = 3,
       .nodes = {2, 1, 0}});
  CHECK(text.rfind("generation=3 removed=2 world_size=3 nodes=2,1,0\n", 0) == 0);
  const auto r = keys::parseGenerationRecord(text);
  REQUIRE(r);
  CHECK(r->nodes == std::vector<int>{2, 1, 0});
  CHECK(r->worldSize == 3);
  for (const char* bad : {"generation=2 removed=1 world_size=3 nodes=2,2",  // 4 != 3
                          "generation=2 removed=1 world_size=3 nodes=", "generation=2 removed=1 "
                          "world_size=3 nodes=2,-1,2", "generation=2 removed=1 world_size=3 "
                          "node=3", "generation=2 removed=1 world_size=3 nodes=3 x"}) {
    INFO(bad);
    CHECK_FALSE(keys::parseGenerationRecord(bad));
  }
}

TEST_CASE("grow record: round-trips, inserts the replacement's rank and names what is wrong",
          "[runtime][elastic]") {
  namespace grow = ddprun::rendezvous::recovery;
  const std::string text = grow::formatGrowRecord(
      {.generation = 3, .added = 1, .worldSize = 3, .spare = 2, .cause = "grow back"});
  CHECK(text == "generation=3 added=1 world_size=3 spare=2\ngrow back");
  CHECK(grow::isGrowRecord(text));
  CHECK_FALSE(grow::isGrowRecord("generation=2 removed=1 world_size=2\nx"));
  std::string why;
  const auto r = grow::parseGrowRecord(text, why);
  REQUIRE(r);
  CHECK(r->generation == 3);
  CHECK(r->added == 1);
  CHECK(r->worldSize == 3);
  CHECK(r->spare == 2);
  CHECK(r->cause == "grow back");
  // Ranks 0 1 of generation 2 with a rank inserted at 1: 0 -> 0, 1 -> 2; the inverse of a
  // shrink that removed rank 1.
  CHECK(grow::growRank(0, 1) == 0);
  CHECK(grow::growRank(1, 1) == 2);
  namespace keys = ddprun::rendezvous::recovery;
  for (int q : {0, 2}) CHECK(grow::growRank(keys::shrinkRank(q, {1}), 1) == q);
  const std::pair<const char*, const char*> bad[] = {
      {"", "no generation=<n> field"},
      {"generation=0 added=1 world_size=3 spare=0", "generation='0' is not a number >= 1"},
      {"generation=2 added=x world_size=3 spare=0", "added='x' is not a number >= 0"},
      {"generation=2 added=1 spare=0 world_size=3", "field 3 is 'spare=0', expected world_size=<n>"},
      {"generation=2 added=1 world_size=3", "no spare=<n> field"},
      {"generation=2 added=1 world_size=3 spare=0 extra", "unexpected field 'extra'"},
      {"generation=2 added=3 world_size=3 spare=0", "added=3 is not a rank of world_size=3"},
      {"generation=2 added=0 world_size=1 spare=0", "world_size=1 after a grow (at least 2)"},
      {"generation=2 added= world_size=3 spare=0", "added='' is not a number >= 0"}};
  for (const auto& [input, expected] : bad) {
    INFO(input);
    why.clear();
    CHECK_FALSE(grow::parseGrowRecord(input, why));
    CHECK(why == expected);
  }
}

TEST_CASE("elastic state: the commit boundary runs after the snapshot and what it throws "
          "propagates", "[runtime][elastic]") {
  auto model = std::make_shared<torch::nn::LinearImpl>(3, 2);
  ElasticState state;
  state.addModule(model);
  int64_t step = 5;
  state.addCounter("step", &step);
  int checks = 0;
  state.setBoundary([&] {
    ++checks;
    if (step == 6) throw std::runtime_error("the group changes here");
  });
  state.commit();  // not enabled: no snapshot, no check
  CHECK(checks == 0);
  state.enable();
  state.commit();
  CHECK(checks == 1);
  step = 6;
  CHECK_THROWS_WITH(state.commit(), "the group changes here");
  CHECK(state.commits() == 2);  // the commit was made before the boundary threw
  step = 9;
  state.restore();
  CHECK(step == 6);
  state.setBoundary(nullptr);
  state.commit();
  CHECK(checks == 2);
}
TEST_CASE("recovery keys: a lost node's ranks taken by spares of other nodes (moved=) round-trip",
          "[runtime][elastic]") {
  namespace keys = ddprun::rendezvous::recovery;
  const std::string text = keys::formatGenerationRecord(
      {.generation = 2, .replaced = {2, 3}, .cause = "node rank 1 was lost",
       .moved = {{.node = 0, .spare = 3}, {.node = 2, .spare = 5}}});
  CHECK(text == "generation=2 replaced=2,3 moved=0:3,2:5\nnode rank 1 was lost");
  const auto r = keys::parseGenerationRecord(text);
  REQUIRE(r);
  CHECK(r->replaced == std::vector<int>{2, 3});
  REQUIRE(r->moved.size() == 2);
  CHECK(r->moved[1].node == 2);
  CHECK(r->moved[1].spare == 5);
  CHECK(r->spare == -1);
  CHECK(keys::nodeSparesKey(2) == "ddprun/node_spares/2");
  for (const char* bad : {"generation=2 replaced=2,3 moved=0:3",  // one taker for two ranks
                          "generation=2 replaced=2 moved=", "generation=2 replaced=2 moved=0",
                          "generation=2 replaced=2 moved=:3", "generation=2 replaced=2 moved=0:",
                          "generation=2 replaced=2 moved=0:-3", "generation=2 replaced=2 moved=a:3",
                          "generation=2 replaced=2 moved=0:3 x", "generation=2 replaced=2 move=0:3"}) {
    INFO(bad);
    CHECK_FALSE(keys::parseGenerationRecord(bad));
  }
  // A moved rank's assignment: its local rank is a slot after its new node's own.
  const auto a = keys::parseSpareAssignment(keys::formatSpareAssignment(
      {.generation = 2, .rank = 1, .localRank = 1, .localWorldSize = 2}));
  REQUIRE(a);
  CHECK(a->localRank == 1);
  CHECK(a->localWorldSize == 2);
  for (const char* bad : {"generation=2 rank=1 local_rank=1 local_world_size=1",  // not above
                          "generation=2 rank=1 local_rank=1 local_world_size=",
                          "generation=2 rank=1 local_rank=1 local_world_size=2 x"}) {
    INFO(bad);
    CHECK_FALSE(keys::parseSpareAssignment(bad));
  }
}

TEST_CASE("recovery keys: a spare's assignment round-trips and refuses bad text",
          "[runtime][elastic]") {
  namespace keys = ddprun::rendezvous::recovery;
  const auto a = keys::parseSpareAssignment(
      keys::formatSpareAssignment({.generation = 4, .rank = 3, .localRank = 1}));
  REQUIRE(a);
  CHECK(a->generation == 4);
  CHECK(a->rank == 3);
  CHECK(a->localRank == 1);
  for (const char* bad : {"", "generation=0 rank=1 local_rank=1", "generation=1 rank=-1 local_rank=0",
                          "generation=1 rank=1", "rank=1 generation=1 local_rank=1",
                          "generation=1 rank=1 local_rank=1 extra", "generation=1 rank=x local_rank=1",
                          "generation=1 rank= local_rank=1"}) {
    INFO(bad);
    CHECK_FALSE(keys::parseSpareAssignment(bad));
  }
  CHECK(keys::spareReadyKey(2) == "ddprun/spare/2/ready");
  CHECK(keys::spareAssignKey(2) == "ddprun/spare/2/rank");
}
