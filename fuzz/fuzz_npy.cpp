// The .npy reader (runtime/npy.*): any bytes are either an array or a UserError; an array's bytes
// match its shape and dtype and convert to float and double.
#include "compiler/support/error.hpp"
#include "fuzz/fuzz_support.hpp"
#include "runtime/npy.hpp"

using namespace attnjit;
using attnjit::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  NpyArray a;
  try {
    a = parse_npy(fuzz::text_of(data, size), "<fuzz>");
  } catch (const UserError&) {
    return 0;
  }
  const int64_t numel = a.numel();
  require(numel >= 0 && static_cast<uint64_t>(numel) * npy_itemsize(a.dtype) == a.bytes.size(),
          "the data is numel * itemsize bytes");
  require(npy_to_float(a).size() == static_cast<size_t>(numel) && npy_to_double(a).size() == static_cast<size_t>(numel),
          "every element converts");
  return 0;
}
