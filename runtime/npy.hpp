// NumPy .npy files: how attnjit exchanges tensors (inputs, reference outputs) with Python.
// Only the few dtypes the kernels use are supported; everything else is a UserError that
// tells the user which numpy call converts their array.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/support/half.hpp"  // the fp16/bf16 conversions the readers use, for their callers too

namespace attnjit {

enum class NpyDtype { F16, F32, F64, U8 };

// Bytes per element of `dtype` (2, 4, 8, 1).
std::size_t npy_itemsize(NpyDtype dtype);
// The numpy descr string we write for `dtype`: "<f2", "<f4", "<f8", "|u1".
const char* npy_descr(NpyDtype dtype);

struct NpyArray {
  NpyDtype dtype = NpyDtype::F32;
  std::vector<int64_t> shape;        // empty for a 0-d (scalar) array
  std::vector<unsigned char> bytes;  // raw little-endian C-order data, numel() * itemsize bytes
  int64_t numel() const;             // product of shape; 1 for 0-d, 0 if any dimension is 0, -1 on overflow
};

// Every dtype read_npy knows.
inline const std::vector<NpyDtype> kAllNpyDtypes = {NpyDtype::F16, NpyDtype::F32, NpyDtype::F64, NpyDtype::U8};

// Reads a .npy file (format versions 1.0, 2.0, 3.0; C order only). Throws UserError naming `path`;
// a dtype outside `accepted` is one (its message lists only the accepted dtypes). Only a regular
// file is read, and only as many bytes as its header names.
NpyArray read_npy(const std::string& path, const std::vector<NpyDtype>& accepted = kAllNpyDtypes);
// The same from the file's bytes; errors name `source`.
NpyArray parse_npy(const std::string& bytes, const std::string& source, const std::vector<NpyDtype>& accepted = kAllNpyDtypes);

// Element-wise conversion of any supported dtype to float / double.
std::vector<float> npy_to_float(const NpyArray& array);
std::vector<double> npy_to_double(const NpyArray& array);

// Writes a format 1.0 .npy file byte-identical to what np.save writes for the same array.
// `data` holds numel(shape) elements of `dtype` in C order (may be null when that is 0).
void write_npy(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape, const void* data);

}  // namespace attnjit
