#include "error.hpp"

#include <sstream>

namespace attnjit {

void internal_error(const char* file, int line, const std::string& message) {
  std::ostringstream os;
  os << "attnjit internal error at " << file << ":" << line << ": " << message
     << " (this is a bug in attnjit; please report it with the command that triggered it)";
  throw std::logic_error(os.str());
}

}  // namespace attnjit
