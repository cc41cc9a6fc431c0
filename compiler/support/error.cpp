#include "error.hpp"

#include <cstdio>
#include <sstream>

namespace attnjit {

std::string printable(const std::string& text, size_t max) {
  std::string out;
  for (const char ch : text.substr(0, max)) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " characters)";
  return out;
}

void internal_error(const char* file, int line, const std::string& message) {
  std::ostringstream os;
  os << "attnjit internal error at " << file << ":" << line << ": " << message
     << " (this is a bug in attnjit; please report it with the command that triggered it)";
  throw std::logic_error(os.str());
}

}  // namespace attnjit
