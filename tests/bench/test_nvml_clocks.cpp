// bench/nvml_clocks.hpp against tests/bench/fake_nvml.cpp (ctest puts it first on the library
// path): the SM clock and power read through the loaded functions, the SM clock asked for (not
// another), and a device NVML refuses named in the reason.
#include <cstdio>
#include <string>

#include "bench/nvml_clocks.hpp"

int main() {
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
    failures += !ok;
  };
  attnjit_bench::NvmlClocks good("GPU-b7caacd4-0000-0000-0000-000000000000"), bad("not-a-uuid");
  double mhz = 0, watts = 0;
  check(good.ok() && good.why().empty(), "a device by its UUID: " + good.why());
  check(good.read(mhz, watts) && mhz == 1980 && watts == 612.345,
        "the SM clock and the power read: " + std::to_string(mhz) + " MHz, " + std::to_string(watts) + " W");
  check(!bad.ok() && bad.why().find("not-a-uuid") != std::string::npos, "a refused device is named: " + bad.why());
  mhz = watts = -1;
  check(!bad.read(mhz, watts) && mhz == -1 && watts == -1, "nothing read from a refused device");
  return failures ? 1 : 0;
}
