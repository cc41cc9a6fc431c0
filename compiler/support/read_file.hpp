// Reading input files whole: specs, dynamic layout tables, manifests, tuning databases, and the
// checks .npy inputs share. Only regular files are read, and text files only up to a size cap, so
// a path such as /dev/zero, /dev/urandom or a FIFO given by mistake is a clear error rather than
// gigabytes of memory or a read that never returns.
#pragma once

#include <cstdint>
#include <string>

namespace attnjit {

// The most bytes read_small_file reads by default: far more than any spec, table, manifest or
// tuning database attnjit writes.
constexpr int64_t kMaxSmallFileBytes = int64_t{256} << 20;

// The size of the regular file at `path`. A UserError naming `path` when it does not exist or
// cannot be examined ("cannot open the <what>; check the path ..."), is a directory, or is not a
// regular file (a FIFO, a device, a socket). `what` names the file's role: "spec file".
int64_t regular_file_size(const std::string& path, const std::string& what);

// The whole of a regular file of at most `max_bytes` bytes; a UserError naming `path`, its size
// and the cap above it.
std::string read_small_file(const std::string& path, const std::string& what, int64_t max_bytes = kMaxSmallFileBytes);

}  // namespace attnjit
