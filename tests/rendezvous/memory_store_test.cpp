// MemoryStore: ranks as threads on one in-process store.
#include <catch2/catch.hpp>

#include <thread>

#include "base/errors.h"
#include "rendezvous/memory_store.h"

using namespace ddprun::rendezvous;

TEST_CASE("memory store: threads meet through it", "[memory]") {
  MemoryStore s(Millis(5000));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&s, r] {
      s.set("rank/" + std::to_string(r), std::to_string(r * r));
      s.add("arrived", 1);
      s.wait({"rank/0", "rank/1", "rank/2", "rank/3"});
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(s.get("arrived") == "4");
  CHECK(s.multiGet({"rank/3", "rank/2"}) == std::vector<std::string>{"9", "4"});
  CHECK_THROWS_AS(s.wait({"never"}, Millis(50)), ddprun::TimeoutError);
}
