// Numbers in text the user typed (compiler/support/parse_int.hpp) and the names that carry them:
// arch names and kernel tiles read whole and range checked, never wrapped past 32 bits.
#include <catch2/catch.hpp>
#include <cstdint>

#include "compiler/codegen/codegen.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/parse_int.hpp"

using namespace attnjit;

TEST_CASE("numbers in arch names and kernel tiles are read whole and range checked, never wrapped", "[codegen][parse]") {
  CHECK(read_int("4294967376", 1, INT64_MAX).value == 4294967376);
  CHECK(read_int("-3", -5, 5).value == -3);
  CHECK(read_int("99999999999999999999", 1, INT64_MAX).status == IntText::OutOfRange);
  CHECK(read_int("4294967376", 1, 1024).status == IntText::OutOfRange);
  for (const char* bad : {"", "-", "+4", " 4", "4 ", "4x", "0x10", "1e3"}) CHECK(read_int(bad, 0, 100).status == IntText::NotInteger);
  CHECK(!parse_int("65", 1, 64));
  CHECK(*parse_int("64", 1, 64) == 64);

  CHECK(parse_arch_name("sm_80").arch == 80);
  CHECK(parse_arch_name("sm_121").arch == 121);
  CHECK((parse_arch_name("sm_90a").arch == 90 && parse_arch_name("sm_90a").specific));
  // 4294967376 is 2^32 + 80: sscanf("%d") read it as sm_80.
  CHECK_THROWS_WITH(parse_arch_name("sm_4294967376"),
                    Catch::Contains("--arch sm_4294967376: expected sm_XX") && Catch::Contains("got 4294967376"));
  CHECK_THROWS_WITH(parse_arch_name("sm_4294967386a"), Catch::Contains("got 4294967386"));
  CHECK_THROWS_WITH(parse_arch_name("sm_99999999999999999999", "arch"), Catch::Contains("arch sm_99999999999999999999:"));
  for (const char* bad : {"sm_", "sm_a", "sm_ 80", "sm_+80", "sm_80 ", "sm_80b", "sm_90aa", "sm80", "sm_5"})
    CHECK_THROWS_WITH(parse_arch_name(bad), Catch::Contains("expected sm_XX or sm_XXa"));
  CHECK_THROWS_WITH(parse_arch_name("sm_80a"), Catch::Contains("sm_90a only"));

  CHECK(parse_kernel_tile("128x64w4") == KernelConfig{128, 64, 0, 4});
  CHECK(parse_kernel_tile("16x32") == KernelConfig{16, 32, 0, 0});
  // 4294967312 is 2^32 + 16, 4294967297 2^32 + 1.
  CHECK_THROWS_WITH(parse_kernel_tile("4294967312x16"),
                    Catch::Contains("--kernel-tile 4294967312x16: expected QxK") && Catch::Contains("Q must lie in [1, 1024], got 4294967312"));
  CHECK_THROWS_WITH(parse_kernel_tile("16x4294967312"), Catch::Contains("K must lie in [1, 1024], got 4294967312"));
  CHECK_THROWS_WITH(parse_kernel_tile("32x32w4294967297"), Catch::Contains("N must lie in [1, 32], got 4294967297"));
  CHECK_THROWS_WITH(parse_kernel_tile("32x32w-1"), Catch::Contains("N must lie in [1, 32], got -1"));
  CHECK_THROWS_WITH(parse_kernel_tile("32x32w 4"), Catch::Contains("--kernel-tile 32x32w 4: expected QxK"));
}
