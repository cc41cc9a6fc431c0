#include "compiler/support/read_file.hpp"

#include <filesystem>
#include <fstream>

#include "compiler/support/error.hpp"

namespace attnjit {

namespace fs = std::filesystem;

int64_t regular_file_size(const std::string& path, const std::string& what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows links: a link to a regular file is one
  if (st.type() == fs::file_type::not_found) throw UserError(path, "cannot open the " + what + "; check the path (file not found)");
  if (ec) throw UserError(path, "cannot open the " + what + "; check the path and its permissions (" + ec.message() + ")");
  const char* kind = nullptr;
  switch (st.type()) {
    case fs::file_type::regular: break;
    case fs::file_type::directory:
      throw UserError(path, "is a directory, not a " + what + "; give the path of the file itself");
    case fs::file_type::fifo: kind = "a FIFO (named pipe)"; break;
    case fs::file_type::character: kind = "a character device"; break;
    case fs::file_type::block: kind = "a block device"; break;
    case fs::file_type::socket: kind = "a socket"; break;
    default: kind = "not a regular file"; break;
  }
  // A device or a pipe may never end (/dev/zero) or block until a writer comes: refused before opening.
  if (kind) {
    throw UserError(path, std::string("is ") + kind + "; attnjit reads a " + what +
                              " only from a regular file, so save it to one first");
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw UserError(path, "cannot read the size of the " + what + " (" + ec.message() + ")");
  return static_cast<int64_t>(size);
}

std::string read_small_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  const int64_t size = regular_file_size(path, what);
  auto too_large = [&](const std::string& size_text) {
    return UserError(path, "is " + size_text + " bytes, more than the " + std::to_string(max_bytes) + " bytes attnjit reads from a " +
                               what + "; check that this is the right file");
  };
  if (size > max_bytes) throw too_large(std::to_string(size));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "cannot open the " + what + " for reading; check its permissions");
  // In chunks, stopping past the cap: a file that grew since it was examined is still bounded.
  std::string text;
  text.reserve(static_cast<size_t>(size));
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > max_bytes) throw too_large("more than " + std::to_string(max_bytes));
  }
  if (in.bad()) throw UserError(path, "read error while reading the " + what);
  return text;
}

}  // namespace attnjit
