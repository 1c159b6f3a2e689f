// The one Catch2 main shared by every unit-test executable. A run in which a test case called
// skipTest() (tests/support/skip.h) and nothing failed exits with 77, ctest's skip code.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/support/skip.h"

int main(int argc, char** argv) {
  const int rc = Catch::Session().run(argc, argv);
  return rc == 0 && ddprun::testing::skippedFlag() ? 77 : rc;
}
