#include "runtime/npy.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

#include "compiler/support/error.hpp"
#include "compiler/support/half.hpp"
#include "compiler/support/read_file.hpp"

namespace attnjit {

// The raw bytes are little-endian and are reinterpreted with memcpy, so the host must be too.
static_assert(std::endian::native == std::endian::little, "npy.cpp assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes, then major and minor version bytes
constexpr std::size_t kMagicLen = 6;
// numpy writes headers of a few hundred bytes (np.load refuses those above 10000 by default).
constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;

// "'<f2' (float16), '<f4' (float32)": the dtypes a caller accepts, for messages.
std::string supported(const std::vector<NpyDtype>& accepted) {
  std::string s;
  for (NpyDtype d : accepted) {
    const char* name = d == NpyDtype::F16 ? "float16" : d == NpyDtype::F32 ? "float32" : d == NpyDtype::F64 ? "float64" : "uint8";
    s += (s.empty() ? "'" : ", '") + std::string(npy_descr(d)) + "' (" + name + ")";
  }
  return s;
}

std::string plural_bytes(std::size_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

// A tiny recursive-descent parser for the header, which is a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }. We never eval anything.
class HeaderParser {
public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), text_(text) {}

  struct Fields {
    std::string descr;
    bool fortran_order = false;
    std::vector<int64_t> shape;
  };

  Fields parse() {
    Fields f;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (!consume('}')) {
      std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == '[')
          throw UserError(path_, "structured (record) dtypes are not supported; save a plain numeric array instead");
        f.descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        f.fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        f.shape = parse_shape();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      if (!consume(',')) {  // a trailing comma before '}' is allowed, as in Python
        expect('}');
        break;
      }
    }
    if (!have_descr || !have_order || !have_shape)
      fail("the dict must contain the keys 'descr', 'fortran_order' and 'shape'");
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the closing '}'");
    return f;
  }

private:
  [[noreturn]] void fail(const std::string& what) const {
    throw UserError(path_, "malformed header dict: " + what + " at offset " + std::to_string(pos_) +
                               " in header \"" + text_ + "\". Re-save the array with numpy.save.");
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  std::string parse_string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) fail("expected a quoted string");
    char quote = text_[pos_++];
    std::size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) fail("unterminated string");
    std::string s = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  bool parse_bool() {
    skip_space();
    for (const char* word : {"True", "False"}) {
      if (text_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        return word[0] == 'T';
      }
    }
    fail("expected True or False");
  }
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    while (!consume(')')) {
      skip_space();
      std::size_t start = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      if (pos_ == start) fail("expected a non-negative integer dimension");
      if (pos_ - start > 18) fail("dimension too large");
      shape.push_back(std::stoll(text_.substr(start, pos_ - start)));
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long literal, e.g. (3L,)
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return shape;
  }

  const std::string& path_;
  const std::string& text_;
  std::size_t pos_ = 0;
};

// The dtype of `descr`, if the caller accepts it; any other is a UserError listing only what it accepts.
NpyDtype parse_descr(const std::string& path, const std::string& descr, const std::vector<NpyDtype>& accepted) {
  std::optional<NpyDtype> d;
  if (descr == "<f2") d = NpyDtype::F16;
  if (descr == "<f4") d = NpyDtype::F32;
  if (descr == "<f8") d = NpyDtype::F64;
  // Byte order is meaningless for one-byte types, so every order mark means the same thing.
  if (descr == "|u1" || descr == "<u1" || descr == ">u1" || descr == "=u1") d = NpyDtype::U8;
  if (d && std::find(accepted.begin(), accepted.end(), *d) != accepted.end()) return *d;
  if (descr == ">f2" || descr == ">f4" || descr == ">f8")
    throw UserError(path, "array data is big-endian (descr '" + descr +
                              "'); only little-endian data is supported. Convert it with "
                              "arr.astype(arr.dtype.newbyteorder('<')) before saving.");
  throw UserError(path, "unsupported dtype '" + descr + "'; supported dtypes " + (d ? "here " : "") + "are " +
                            supported(accepted) + ". Convert the array first, e.g. arr.astype(np.float32).");
}

// Python's repr of a shape tuple: (), (3,), (2, 3).
std::string shape_repr(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Product of the dimensions, or -1 if it overflows int64 (only possible for a crafted header).
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    if (n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

}  // namespace

std::size_t npy_itemsize(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::F16: return 2;
    case NpyDtype::F32: return 4;
    case NpyDtype::F64: return 8;
    case NpyDtype::U8: return 1;
  }
  internal_error(__FILE__, __LINE__, "unknown NpyDtype");
}

const char* npy_descr(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::F16: return "<f2";
    case NpyDtype::F32: return "<f4";
    case NpyDtype::F64: return "<f8";
    case NpyDtype::U8: return "|u1";
  }
  internal_error(__FILE__, __LINE__, "unknown NpyDtype");
}

int64_t NpyArray::numel() const { return checked_numel(shape); }

namespace {

// What the preamble and header say: the array without its data, and where the data lies.
struct NpyHeader {
  NpyArray array;  // dtype and shape; bytes empty
  std::size_t data_offset = 0, data_bytes = 0;
};

// Parses the preamble and header at the start of `file`, a prefix of a file of `file_size` bytes
// that holds at least the whole header when the file does. Checks that the data fits the file.
NpyHeader parse_npy_header(const std::string& file, std::size_t file_size, const std::string& path,
                           const std::vector<NpyDtype>& accepted) {
  if (file.size() < kMagicLen || file.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    throw UserError(path, "not a .npy file (missing the \\x93NUMPY magic); write it with numpy.save");
  // Preamble: magic, major, minor, then a little-endian header length of 2 (v1) or 4 (v2, v3) bytes.
  if (file_size < kMagicLen + 2)
    throw UserError(path, "truncated header: expected at least " + plural_bytes(kMagicLen + 2) + ", found " +
                              plural_bytes(file_size));
  int major = static_cast<unsigned char>(file[6]), minor = static_cast<unsigned char>(file[7]);
  if (minor != 0 || major < 1 || major > 3)
    throw UserError(path, "unsupported .npy format version " + std::to_string(major) + "." +
                              std::to_string(minor) + "; supported versions are 1.0, 2.0 and 3.0");
  std::size_t len_bytes = major == 1 ? 2 : 4;
  std::size_t preamble = kMagicLen + 2 + len_bytes;
  if (file_size < preamble)
    throw UserError(path, "truncated header: expected at least " + plural_bytes(preamble) + ", found " +
                              plural_bytes(file_size));
  std::size_t header_len = 0;
  for (std::size_t i = 0; i < len_bytes; ++i)
    header_len |= std::size_t(static_cast<unsigned char>(file[8 + i])) << (8 * i);
  if (file_size - preamble < header_len)
    throw UserError(path, "truncated header: expected " + plural_bytes(header_len) + " of header, found " +
                              plural_bytes(file_size - preamble));
  if (header_len > kMaxHeaderBytes)
    throw UserError(path, "header of " + plural_bytes(header_len) + " is larger than numpy ever writes (" +
                              plural_bytes(kMaxHeaderBytes) + " at most here); re-save the array with numpy.save");

  // Version 3.0 only differs by allowing UTF-8 in the header; our keys and values are ASCII anyway.
  std::string header = file.substr(preamble, header_len);
  HeaderParser::Fields fields = HeaderParser(path, header).parse();
  NpyHeader h;
  NpyArray& array = h.array;
  array.dtype = parse_descr(path, fields.descr, accepted);
  if (fields.fortran_order)
    throw UserError(path, "array is stored in Fortran (column-major) order (fortran_order: True); only C order "
                          "is supported. Save np.ascontiguousarray(arr) instead.");
  array.shape = std::move(fields.shape);

  int64_t numel = checked_numel(array.shape);
  std::size_t itemsize = npy_itemsize(array.dtype);
  if (numel < 0 || static_cast<uint64_t>(numel) > std::numeric_limits<std::size_t>::max() / itemsize)
    throw UserError(path, "shape " + shape_repr(array.shape) + " is too large to load");
  std::size_t data_bytes = static_cast<std::size_t>(numel) * itemsize;
  std::size_t available = file_size - preamble - header_len;
  if (available < data_bytes)
    throw UserError(path, "truncated data: expected " + plural_bytes(data_bytes) + " for shape " +
                              shape_repr(array.shape) + " of '" + fields.descr + "', found " +
                              plural_bytes(available) + "; the file was cut short, re-save it");
  h.data_offset = preamble + header_len;
  h.data_bytes = data_bytes;
  return h;
}

}  // namespace

NpyArray read_npy(const std::string& path, const std::vector<NpyDtype>& accepted) {
  // A regular file only (not /dev/zero or a FIFO), and only the bytes the header names: a file
  // that is not a .npy is refused after its first bytes, and bytes after the array (np.save may
  // append more arrays) are never read.
  const std::size_t size = static_cast<std::size_t>(regular_file_size(path, ".npy file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "cannot open the file for reading; check its permissions");
  std::string head(std::min(size, kMagicLen + 2 + 4 + kMaxHeaderBytes), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  NpyHeader h = parse_npy_header(head, size, path, accepted);
  h.array.bytes.resize(h.data_bytes);
  in.clear();
  in.seekg(static_cast<std::streamoff>(h.data_offset));
  in.read(reinterpret_cast<char*>(h.array.bytes.data()), static_cast<std::streamsize>(h.data_bytes));
  if (static_cast<std::size_t>(in.gcount()) != h.data_bytes)
    throw UserError(path, "read error while reading the file (it may have been changed while being read)");
  return std::move(h.array);
}

NpyArray parse_npy(const std::string& file, const std::string& path, const std::vector<NpyDtype>& accepted) {
  NpyHeader h = parse_npy_header(file, file.size(), path, accepted);
  // Bytes after the data are ignored, as numpy does: np.save may append several arrays to one file.
  const auto* data = reinterpret_cast<const unsigned char*>(file.data()) + h.data_offset;
  h.array.bytes.assign(data, data + h.data_bytes);
  return std::move(h.array);
}

namespace {

// Converts each element to T; shared by npy_to_float and npy_to_double.
template <typename T>
std::vector<T> convert(const NpyArray& a) {
  std::size_t n = a.bytes.size() / npy_itemsize(a.dtype);
  ATTNJIT_CHECK(static_cast<int64_t>(n) == a.numel() && n * npy_itemsize(a.dtype) == a.bytes.size(),
                "NpyArray bytes do not match its shape and dtype");
  std::vector<T> out(n);
  const unsigned char* p = a.bytes.data();
  for (std::size_t i = 0; i < n; ++i) {
    switch (a.dtype) {
      case NpyDtype::F16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = static_cast<T>(half_to_float(h));
        break;
      }
      case NpyDtype::F32: {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        out[i] = static_cast<T>(f);
        break;
      }
      case NpyDtype::F64: {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<T>(d);
        break;
      }
      case NpyDtype::U8: out[i] = static_cast<T>(p[i]); break;
    }
  }
  return out;
}

}  // namespace

std::vector<float> npy_to_float(const NpyArray& array) { return convert<float>(array); }
std::vector<double> npy_to_double(const NpyArray& array) { return convert<double>(array); }

void write_npy(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape, const void* data) {
  for (int64_t d : shape)
    if (d < 0) throw UserError(path, "cannot write shape " + shape_repr(shape) + ": dimensions must be >= 0");
  int64_t numel = checked_numel(shape);
  if (numel < 0) throw UserError(path, "cannot write shape " + shape_repr(shape) + ": too many elements");
  ATTNJIT_CHECK(numel == 0 || data != nullptr, "write_npy given null data for a non-empty array");

  // Same text as np.save, including its spare spaces that let the first dimension grow in place,
  // so our files are byte-identical to numpy's (stable hashes, easy diffs).
  std::string header = std::string("{'descr': '") + npy_descr(dtype) +
                       "', 'fortran_order': False, 'shape': " + shape_repr(shape) + ", }";
  if (!shape.empty()) header.append(21 - std::to_string(shape[0]).size(), ' ');
  // Pad with spaces and a final '\n' so that the data starts at a multiple of 64 bytes (numpy
  // pads a full 64 when already aligned; we match that).
  std::size_t preamble = kMagicLen + 2 + 2;
  header.append(64 - (preamble + header.size() + 1) % 64, ' ');
  header += '\n';
  ATTNJIT_CHECK(header.size() <= 0xffff, "npy header too long for format 1.0");

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw UserError(path, "cannot open the file for writing; check that the directory exists and is writable");
  out.write(kMagic, kMagicLen);
  // Version 1.0, then the header length as a little-endian uint16.
  const char version_and_len[4] = {1, 0, static_cast<char>(header.size() & 0xff),
                                   static_cast<char>(header.size() >> 8)};
  out.write(version_and_len, 4);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (numel > 0)
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(numel * npy_itemsize(dtype)));
  out.close();
  if (!out) throw UserError(path, "writing the file failed; check that the disk has free space");
}

}  // namespace attnjit
