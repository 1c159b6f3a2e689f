// KeyTable: the store's semantics, without sockets.
#include <catch2/catch.hpp>

#include "rendezvous/key_table.h"

using ddprun::rendezvous::KeyTable;

TEST_CASE("ADD counts in ASCII decimal from zero", "[keytable]") {
  KeyTable t;
  KeyTable::Woken w;
  CHECK(t.add("c", 5, w) == 5);
  CHECK(t.add("c", -2, w) == 3);
  CHECK(*t.get("c") == "3");
  t.set("text", "abc", w);
  CHECK_FALSE(t.add("text", 1, w).has_value());
  CHECK(*t.get("text") == "abc");  // left untouched
  t.set("big", "9223372036854775807", w);
  CHECK_FALSE(t.add("big", 1, w).has_value());  // overflow refused, value kept
  CHECK(*t.get("big") == "9223372036854775807");
}

TEST_CASE("COMPARE_SET follows c10d, quirk included", "[keytable]") {
  KeyTable t;
  KeyTable::Woken w;
  CHECK(t.compareSet("k", "", "first", w) == "first");  // missing + empty expected: create
  CHECK(t.compareSet("k", "wrong", "x", w) == "first");  // mismatch: unchanged
  CHECK(t.compareSet("k", "first", "second", w) == "second");
  CHECK(t.compareSet("missing", "exp", "x", w) == "exp");  // the quirk: returns expected
  CHECK(t.get("missing") == nullptr);
}

TEST_CASE("waiters complete when their last key arrives", "[keytable]") {
  KeyTable t;
  KeyTable::Woken w;
  t.set("a", "1", w);
  CHECK(t.wait(1, {"a"}));  // already there: nothing registered
  CHECK(t.waiterCount() == 0);
  CHECK_FALSE(t.wait(2, {"a", "b", "c"}));
  CHECK_FALSE(t.wait(3, {"c"}));
  CHECK(t.waiterCount() == 2);
  t.set("b", "x", w);
  CHECK(w.empty());
  t.add("c", 1, w);
  CHECK(w == KeyTable::Woken{2, 3});
  CHECK(t.waiterCount() == 0);
}

TEST_CASE("cancel forgets a waiter everywhere", "[keytable]") {
  KeyTable t;
  KeyTable::Woken w;
  CHECK_FALSE(t.wait(7, {"x", "y"}));
  CHECK(t.cancel(7));
  CHECK_FALSE(t.cancel(7));
  t.set("x", "1", w);
  t.set("y", "1", w);
  CHECK(w.empty());
  CHECK(t.waiterCount() == 0);
}

TEST_CASE("APPEND creates then extends", "[keytable]") {
  KeyTable t;
  KeyTable::Woken w;
  CHECK_FALSE(t.wait(1, {"log"}));
  t.append("log", "ab", w);
  CHECK(w == KeyTable::Woken{1});
  t.append("log", "cd", w);
  CHECK(*t.get("log") == "abcd");
  CHECK(t.erase("log"));
  CHECK_FALSE(t.erase("log"));
  CHECK(t.size() == 0);
}

TEST_CASE("queues are FIFO and wake one waiter per push", "[keytable]") {
  KeyTable t;
  KeyTable::Woken w;
  CHECK_FALSE(t.wait(1, {"q"}));
  CHECK_FALSE(t.wait(2, {"q"}));
  t.queuePush("q", "first", w);
  CHECK(w == KeyTable::Woken{1});
  t.queuePush("q", "second", w);
  CHECK(w == KeyTable::Woken{1, 2});
  CHECK(t.queueLen("q") == 2);
  CHECK(t.check({"q"}));
  auto [len, v] = t.queuePop("q");
  CHECK(len == 2);
  CHECK(v == "first");
  CHECK(t.queuePop("q").second == "second");
  CHECK(t.queuePop("q").first == 0);
  CHECK_FALSE(t.check({"q"}));
}
