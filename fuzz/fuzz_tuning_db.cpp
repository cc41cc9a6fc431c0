// The tuning-database reader (compiler/tune/tuning_db.*): any text is either a database or a problem
// string (parse_tuning_db never throws); a database serializes to text that reads back to the same
// database.
#include "compiler/tune/tuning_db.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace attnjit;
using attnjit::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  DbMetadata current;
  current.attnjit_version = "0.1.0";
  current.nvrtc_version = "13.0";
  const DbFile f = parse_tuning_db("<fuzz>", fuzz::text_of(data, size), current);
  require(f.present == f.problem.empty(), "a file is present exactly when it has no problem");
  if (!f.present) {
    require(f.entries.empty() && !f.trusted, "a malformed file has no entries and is not trusted");
    return 0;
  }
  const std::string text = serialize_tuning_db(f.metadata, f.entries);
  const DbFile again = parse_tuning_db("<fuzz>", text, current);
  require(again.present, "the serialized database reads back: " + again.problem);
  require(again.trusted == f.trusted && again.entries.size() == f.entries.size(), "the same entries, trusted alike");
  require(serialize_tuning_db(again.metadata, again.entries) == text, "a read-back database serializes identically");
  return 0;
}
