// Errors: user errors are recoverable and name the place and the fix; broken invariants are bugs.
#pragma once

#include <stdexcept>
#include <string>

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

// A mistake in what the user gave us (a spec, a shape, a file). `where` is a JSON pointer
// ("/branches/2/dilation") or a file or option name; the message says what is wrong and how to fix it.
class UserError : public std::runtime_error {
public:
  UserError(std::string where, const std::string& message)
      : std::runtime_error(where.empty() ? message : where + ": " + message), where_(std::move(where)), message_(message) {}
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }

private:
  std::string where_;
  std::string message_;
};

// User input as an error message shows it: control characters escaped as \uXXXX (a NUL would end
// the message early, an escape sequence would reach the terminal) and at most `max` characters,
// then "... (N characters)".
std::string printable(const std::string& text, size_t max = 60);

// An internal invariant that does not hold: a bug in attnjit, never the user's fault.
[[noreturn]] void internal_error(const char* file, int line, const std::string& message);

}  // namespace attnjit
#pragma GCC visibility pop

#define ATTNJIT_CHECK(cond, msg)                                         \
  do {                                                                   \
    if (!(cond)) ::attnjit::internal_error(__FILE__, __LINE__, (msg));   \
  } while (0)
