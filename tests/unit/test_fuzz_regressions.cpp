// Inputs the fuzz targets (fuzz/, scripts/fuzz.sh) found that a reader did not reject cleanly; each
// is now a UserError naming what was wrong. The CLI's dynamic-layout reader had the same fault:
// its regression is tests/lit/dynamic/table-number-overflow.test.
#include <catch2/catch.hpp>

#include <string>

#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"

using namespace attnjit;
using Catch::Matchers::Contains;

namespace {

UserError spec_error(const std::string& spec) {
  try {
    parse_spec(spec, "spec.json");
  } catch (const UserError& e) {
    return e;
  }
  FAIL("parse_spec did not throw a UserError");
  return UserError("", "");
}

}  // namespace

TEST_CASE("fuzz: a number past a double's range in a spec is a UserError", "[fuzz]") {
  // fuzz_spec's input as it found it: nlohmann's out_of_range (406) escaped parse_spec, which
  // promises UserErrors only (the CLI printed nlohmann's bare message, Python raised RuntimeError).
  const std::string found =
      "{\"attnjit\": 1, \"branches\": [{\"segment\": \"full\", \"causal\": true},\n"
      "             333333333333333333E3333333333333333333333333333333333333333333333333333333333333333333333333333"
      "33333333333333333333333333333333333         -      {\"segment\": \"full\", \"dilation\": \"branches\"\": 0}]}";
  const UserError e = spec_error(found);
  CHECK(e.where() == "spec.json");
  CHECK_THAT(e.message(), Contains("number overflow parsing '333333333333333333E3333") && Contains("/branches/1"));
  CHECK_THAT(spec_error(R"({"attnjit": 1, "scale": -1e999, "branches": [{"segment": 8}]})").message(),
             Contains("number overflow parsing '-1e999'") && Contains("/scale"));
}
