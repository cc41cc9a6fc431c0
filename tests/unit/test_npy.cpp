// .npy reading/writing: round trips, byte-exact agreement with np.save, half-float conversion,
// and the UserError messages for each kind of bad file.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compiler/support/error.hpp"
#include "compiler/support/read_file.hpp"
#include "runtime/npy.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using attnjit::testing::TempDir;

namespace {


void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Builds a .npy file by hand: magic, version, header length, the header dict padded to 64 bytes, data.
std::string make_npy(const std::string& dict, const std::string& data = "", int major = 1) {
  std::size_t len_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  header.append(64 - (8 + len_bytes + header.size() + 1) % 64, ' ');
  header += '\n';
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  for (std::size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

// The message of the UserError that reading `path` throws (and checks that it names the path).
std::string read_error(const std::string& path) {
  try {
    read_npy(path);
  } catch (const UserError& e) {
    CHECK(e.where() == path);
    return e.what();
  }
  FAIL("read_npy(" << path << ") did not throw a UserError");
  return "";
}

std::string error_of_read_small(const std::string& path, int64_t max_bytes = kMaxSmallFileBytes) {
  try {
    read_small_file(path, "spec file", max_bytes);
  } catch (const UserError& e) {
    CHECK(e.where() == path);
    return e.what();
  }
  FAIL("read_small_file(" << path << ") did not throw a UserError");
  return "";
}

std::string error_for_bytes(const TempDir& dir, const std::string& bytes) {
  std::string path = dir.file("bad.npy");
  write_bytes(path, bytes);
  return read_error(path);
}

template <typename T>
NpyArray round_trip(const TempDir& dir, NpyDtype dtype, const std::vector<int64_t>& shape, const std::vector<T>& v) {
  std::string path = dir.file("a.npy");
  write_npy(path, dtype, shape, v.data());
  // The data must start at a multiple of 64 bytes and the header must end with '\n'.
  std::string bytes = read_bytes(path);
  std::size_t header_end = 10 + (static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8);
  CHECK(header_end % 64 == 0);
  CHECK(bytes[header_end - 1] == '\n');
  CHECK(bytes.size() == header_end + v.size() * sizeof(T));
  NpyArray a = read_npy(path);
  CHECK(a.dtype == dtype);
  CHECK(a.shape == shape);
  CHECK(a.bytes.size() == v.size() * sizeof(T));
  CHECK((v.empty() || std::memcmp(a.bytes.data(), v.data(), a.bytes.size()) == 0));
  return a;
}

}  // namespace

TEST_CASE("npy round trip float32", "[npy]") {
  TempDir dir;
  std::vector<float> v = {0.f, 1.5f, -2.25f, 3.0e7f, -1e-30f, 6.f};
  NpyArray a = round_trip(dir, NpyDtype::F32, {2, 3}, v);
  CHECK(a.numel() == 6);
  CHECK(npy_to_float(a) == v);
  CHECK(npy_to_double(a)[2] == -2.25);
}

TEST_CASE("npy round trip float16", "[npy]") {
  TempDir dir;
  std::vector<uint16_t> v = {float_to_half(1.f), float_to_half(-0.5f), float_to_half(65504.f), 0x0001};
  NpyArray a = round_trip(dir, NpyDtype::F16, {4, 1}, v);
  CHECK(npy_to_float(a) == std::vector<float>{1.f, -0.5f, 65504.f, std::ldexp(1.f, -24)});
}

TEST_CASE("npy round trip float64", "[npy]") {
  TempDir dir;
  std::vector<double> v = {0.1, -1e300, 2.0};
  NpyArray a = round_trip(dir, NpyDtype::F64, {3}, v);
  CHECK(npy_to_double(a) == v);
  CHECK(npy_to_float(a)[0] == 0.1f);
  CHECK(std::isinf(npy_to_float(a)[1]));
}

TEST_CASE("npy round trip uint8", "[npy]") {
  TempDir dir;
  std::vector<uint8_t> v = {0, 1, 127, 128, 255, 42, 7, 9};
  NpyArray a = round_trip(dir, NpyDtype::U8, {2, 2, 2}, v);
  CHECK(npy_to_float(a) == std::vector<float>{0, 1, 127, 128, 255, 42, 7, 9});
}

TEST_CASE("npy round trip 0-d and empty arrays", "[npy]") {
  TempDir dir;
  NpyArray scalar = round_trip(dir, NpyDtype::F64, {}, std::vector<double>{3.5});
  CHECK(scalar.numel() == 1);
  CHECK(npy_to_double(scalar) == std::vector<double>{3.5});

  NpyArray empty = round_trip(dir, NpyDtype::F32, {3, 0, 2}, std::vector<float>{});
  CHECK(empty.numel() == 0);
  CHECK(npy_to_float(empty).empty());
  write_npy(dir.file("null.npy"), NpyDtype::U8, {0}, nullptr);  // null data is fine when there is none
  CHECK(read_npy(dir.file("null.npy")).shape == std::vector<int64_t>{0});
}

TEST_CASE("write_npy is byte-identical to np.save", "[npy]") {
  // Expected bytes come from np.save in numpy 2.4: the dict, spaces up to a 64-byte boundary, '\n'.
  TempDir dir;
  std::string path = dir.file("a.npy");
  std::vector<float> f32 = {0, 1, 2, 3, 4, 5};
  write_npy(path, NpyDtype::F32, {2, 3}, f32.data());
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  std::string expected = std::string("\x93NUMPY\x01\x00v\x00", 10) + dict + std::string(58, ' ') + "\n" +
                         std::string(reinterpret_cast<const char*>(f32.data()), 24);
  CHECK(read_bytes(path) == expected);

  uint16_t h = float_to_half(1.5f);
  write_npy(path, NpyDtype::F16, {}, &h);
  dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (), }";
  std::string data("\x00>", 2);  // 1.5 as a little-endian half
  CHECK(read_bytes(path) == std::string("\x93NUMPY\x01\x00v\x00", 10) + dict + std::string(62, ' ') + "\n" + data);

  write_npy(path, NpyDtype::F16, {1000000, 0}, nullptr);
  dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (1000000, 0), }";
  CHECK(read_bytes(path) == std::string("\x93NUMPY\x01\x00v\x00", 10) + dict + std::string(52, ' ') + "\n");
}

TEST_CASE("read_npy accepts format versions 2.0 and 3.0 and header variations", "[npy]") {
  TempDir dir;
  std::string path = dir.file("a.npy");
  std::string two_floats("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);  // 1.0f, 2.0f
  for (int major : {1, 2, 3}) {
    write_bytes(path, make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", two_floats, major));
    CHECK(npy_to_float(read_npy(path)) == std::vector<float>{1.f, 2.f});
  }
  // Key order, double quotes, no trailing commas, Python 2 longs and extra spacing are all valid Python.
  write_bytes(path, make_npy("{ \"shape\" : ( 1 , 2L ) , 'fortran_order':False,'descr':'<f4'}", two_floats));
  NpyArray a = read_npy(path);
  CHECK(a.shape == std::vector<int64_t>{1, 2});
  // Bytes after the data are ignored, as numpy does.
  write_bytes(path, make_npy("{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }", "\x05\x06trailing"));
  CHECK(npy_to_float(read_npy(path)) == std::vector<float>{5.f, 6.f});
}

TEST_CASE("half_to_float known values", "[npy][half]") {
  CHECK(half_to_float(0x0000) == 0.f);
  CHECK(std::signbit(half_to_float(0x8000)));
  CHECK(half_to_float(0x3c00) == 1.f);
  CHECK(half_to_float(0xc000) == -2.f);
  CHECK(half_to_float(0x3555) == 0.333251953125f);
  CHECK(half_to_float(0x7bff) == 65504.f);               // largest finite half
  CHECK(half_to_float(0x0400) == std::ldexp(1.f, -14));  // smallest normal
  CHECK(half_to_float(0x0001) == std::ldexp(1.f, -24));  // smallest subnormal
  CHECK(half_to_float(0x03ff) == std::ldexp(1023.f, -24));
  CHECK(half_to_float(0x8001) == -std::ldexp(1.f, -24));
  CHECK(half_to_float(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(half_to_float(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(half_to_float(0x7e00)));
  CHECK(std::isnan(half_to_float(0x7c01)));
}

TEST_CASE("float_to_half rounds to nearest even", "[npy][half]") {
  CHECK(float_to_half(0.f) == 0x0000);
  CHECK(float_to_half(-0.f) == 0x8000);
  CHECK(float_to_half(1.f) == 0x3c00);
  CHECK(float_to_half(-2.f) == 0xc000);
  CHECK(float_to_half(1.f / 3.f) == 0x3555);
  CHECK(float_to_half(1.f + std::ldexp(1.f, -11)) == 0x3c00);      // tie: round down to even
  CHECK(float_to_half(1.f + 3 * std::ldexp(1.f, -11)) == 0x3c02);  // tie: round up to even
  CHECK(float_to_half(1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -20)) == 0x3c01);  // above tie
  CHECK(float_to_half(65504.f) == 0x7bff);
  CHECK(float_to_half(65519.f) == 0x7bff);
  CHECK(float_to_half(65520.f) == 0x7c00);  // tie between 65504 and 65536: even is inf
  CHECK(float_to_half(1e6f) == 0x7c00);
  CHECK(float_to_half(-1e6f) == 0xfc00);
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(float_to_half(-std::numeric_limits<float>::infinity()) == 0xfc00);
  uint16_t nan = float_to_half(std::numeric_limits<float>::quiet_NaN());
  CHECK(((nan & 0x7c00) == 0x7c00 && (nan & 0x03ff) != 0));
  // Subnormals: multiples of 2^-24, with ties to even, and underflow to zero.
  CHECK(float_to_half(std::ldexp(1.f, -14)) == 0x0400);
  CHECK(float_to_half(std::ldexp(1.f, -24)) == 0x0001);
  CHECK(float_to_half(std::ldexp(1.f, -25)) == 0x0000);                // tie between 0 and 1: even is 0
  CHECK(float_to_half(std::ldexp(1.0001f, -25)) == 0x0001);            // just above the tie
  CHECK(float_to_half(std::ldexp(3.f, -25)) == 0x0002);                // tie between 1 and 2
  CHECK(float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);            // rounds up into the normals
  CHECK(float_to_half(-std::ldexp(5.f, -24)) == 0x8005);
  CHECK(float_to_half(std::ldexp(1.f, -30)) == 0x0000);
  CHECK(float_to_half(std::numeric_limits<float>::denorm_min()) == 0x0000);
}

TEST_CASE("every half survives half -> float -> half", "[npy][half]") {
  int mismatches = 0;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      uint16_t back = float_to_half(f);
      mismatches += !((back & 0x7c00) == 0x7c00 && (back & 0x03ff) != 0);
    } else {
      mismatches += float_to_half(f) != h;
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("read_npy errors: missing file, directory, bad magic", "[npy][errors]") {
  TempDir dir;
  CHECK_THAT(read_error(dir.file("nope.npy")), Contains("not found"));
  CHECK_THAT(read_error(dir.path), Contains("directory"));
  CHECK_THAT(error_for_bytes(dir, "PK\x03\x04 this is a zip"), Contains("not a .npy file"));
  CHECK_THAT(error_for_bytes(dir, ""), Contains("not a .npy file"));
}

TEST_CASE("input files: regular files only, .npy headers and small files capped", "[npy][errors]") {
  // Devices and pipes are refused before they are opened: /dev/zero never ends, a FIFO blocks.
  CHECK_THAT(read_error("/dev/zero"), Contains("/dev/zero: is a character device; attnjit reads a .npy file only from a regular file"));
  CHECK_THAT(error_of_read_small("/dev/urandom"), Contains("is a character device"));
  TempDir dir;
  const std::string fifo = dir.file("pipe.npy");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(read_error(fifo), Contains("is a FIFO (named pipe)"));
  CHECK_THAT(error_of_read_small(fifo), Contains("is a FIFO (named pipe)"));
  CHECK_THAT(error_of_read_small(dir.path), Contains("is a directory, not a spec file"));
  CHECK_THAT(error_of_read_small(dir.file("nope.json")), Contains("cannot open the spec file; check the path (file not found)"));
  // A small file above its cap is refused with its size; at the cap it is read whole.
  write_bytes(dir.file("s.json"), std::string(100, ' '));
  CHECK_THAT(error_of_read_small(dir.file("s.json"), 99), Contains("is 100 bytes, more than the 99 bytes attnjit reads from a spec file"));
  CHECK(read_small_file(dir.file("s.json"), "spec file", 100) == std::string(100, ' '));
  // A .npy header larger than numpy writes is refused before anything else is read.
  std::string huge = std::string("\x93NUMPY\x02\x00", 8) + std::string("\x00\x00\x00\x01", 4);  // 16 MiB of header
  huge += std::string(1 << 24, ' ');
  CHECK_THAT(error_for_bytes(dir, huge), Contains("header of 16777216 bytes is larger than numpy ever writes"));
  // Only the bytes the header names are read: what follows (another np.save) is ignored.
  const std::string one = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", std::string("\0\0\x80\x3f", 4));
  write_bytes(dir.file("two.npy"), one + one);
  CHECK(npy_to_float(read_npy(dir.file("two.npy"))) == std::vector<float>{1.0f});
}

TEST_CASE("read_npy names only the dtypes its caller accepts", "[npy][errors]") {
  TempDir dir;
  const std::string u8 = make_npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", "\x01\x02");
  write_bytes(dir.file("u8.npy"), u8);
  CHECK(read_npy(dir.file("u8.npy")).dtype == NpyDtype::U8);  // every dtype by default
  const std::vector<NpyDtype> floats = {NpyDtype::F16, NpyDtype::F32, NpyDtype::F64};
  try {
    read_npy(dir.file("u8.npy"), floats);
    FAIL("a uint8 array was accepted where only floats are");
  } catch (const UserError& e) {
    CHECK_THAT(std::string(e.what()), Contains("unsupported dtype '|u1'; supported dtypes here are '<f2' (float16), '<f4' (float32), "
                                               "'<f8' (float64)"));
    CHECK_THAT(std::string(e.what()), !Contains("uint8"));
  }
  const std::string i4 = make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'));
  write_bytes(dir.file("i4.npy"), i4);
  try {
    read_npy(dir.file("i4.npy"), floats);
    FAIL("an int32 array was accepted");
  } catch (const UserError& e) {
    CHECK_THAT(std::string(e.what()), Contains("'<f8' (float64). Convert") && !Contains("uint8"));
  }
}

TEST_CASE("read_npy errors: truncated header and data", "[npy][errors]") {
  TempDir dir;
  CHECK_THAT(error_for_bytes(dir, std::string("\x93NUMPY\x01", 7)),
             Contains("truncated header") && Contains("expected at least 8 bytes") && Contains("found 7 bytes"));
  CHECK_THAT(error_for_bytes(dir, std::string("\x93NUMPY\x02\x00\x10", 9)),
             Contains("truncated header") && Contains("expected at least 12 bytes"));
  std::string full = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", std::string(24, '\0'));
  CHECK_THAT(error_for_bytes(dir, full.substr(0, 30)),
             Contains("truncated header") && Contains("expected 118 bytes") && Contains("found 20 bytes"));
  CHECK_THAT(error_for_bytes(dir, full.substr(0, full.size() - 16)),
             Contains("truncated data") && Contains("expected 24 bytes") && Contains("found 8 bytes"));
}

TEST_CASE("read_npy errors: unsupported dtype, fortran order, big-endian", "[npy][errors]") {
  TempDir dir;
  std::string msg = error_for_bytes(dir, make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }",
                                                  std::string(4, '\0')));
  CHECK_THAT(msg, Contains("unsupported dtype") && Contains("'<i4'") && Contains("'<f4'") && Contains("'|u1'") &&
                      Contains("arr.astype(np.float32)"));
  msg = error_for_bytes(dir, make_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }"));
  CHECK_THAT(msg, Contains("structured"));
  msg = error_for_bytes(dir, make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
                                      std::string(16, '\0')));
  CHECK_THAT(msg, Contains("fortran_order") && Contains("np.ascontiguousarray"));
  msg = error_for_bytes(dir, make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                                      std::string(4, '\0')));
  CHECK_THAT(msg, Contains("big-endian") && Contains("'>f4'"));
  msg = error_for_bytes(dir, make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "", 4));
  CHECK_THAT(msg, Contains("unsupported .npy format version 4.0"));
}

TEST_CASE("read_npy errors: malformed header dict", "[npy][errors]") {
  TempDir dir;
  for (const char* dict : {
           "not a dict",
           "{'descr': '<f4', 'fortran_order': False}",                              // no shape
           "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",            // negative dim
           "{'descr': '<f4', 'fortran_order': false, 'shape': (1,), }",             // not Python
           "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1, }",     // unknown key
           "{'descr': '<f4', 'fortran_order': False, 'shape': (1,) 'extra': 1}",    // missing comma
           "{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }",              // bad quoting
           "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } trailing",    // text after dict
           "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
       }) {
    INFO(dict);
    CHECK_THAT(error_for_bytes(dir, make_npy(dict)), Contains("malformed header"));
  }
}

TEST_CASE("write_npy errors", "[npy][errors]") {
  TempDir dir;
  float x = 1.f;
  std::string path = dir.file("no_such_dir/a.npy");
  CHECK_THROWS_WITH(write_npy(path, NpyDtype::F32, {1}, &x), Contains("cannot open") && Contains(path));
  CHECK_THROWS_AS(write_npy(dir.file("a.npy"), NpyDtype::F32, {-1}, &x), UserError);
  CHECK_THROWS_AS(write_npy(dir.file("a.npy"), NpyDtype::F32, {1LL << 40, 1LL << 40}, &x), UserError);
}

TEST_CASE("bfloat16 conversions round to nearest even and keep NaN", "[npy]") {
  auto from_bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  };
  CHECK(float_to_bfloat16(1.0f) == 0x3f80);
  CHECK(bfloat16_to_float(0x3f80) == 1.0f);
  CHECK(float_to_bfloat16(from_bits(0x3f808000u)) == 0x3f80);  // tie: to the even 0x3f80
  CHECK(float_to_bfloat16(from_bits(0x3f818000u)) == 0x3f82);  // tie: to the even 0x3f82
  CHECK(float_to_bfloat16(from_bits(0x3f808001u)) == 0x3f81);  // above the tie: up
  CHECK(float_to_bfloat16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(from_bits(0x7f800001u)))));  // a NaN that rounding would make inf
  for (uint32_t b = 0; b < 0x10000; b += 7) {
    const uint16_t x = static_cast<uint16_t>(b);
    if (!std::isnan(bfloat16_to_float(x))) REQUIRE(float_to_bfloat16(bfloat16_to_float(x)) == x);
  }
}
