// Progress lines for a computation that may take long (the CLI's statistics over millions of
// rows): nothing while it is quick, then a line at most once a second, so a user never stares at a
// silent terminal. The library computes; whoever owns the terminal passes a Progress in.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace attnjit {

class Progress {
public:
  // Lines go to `out` as "what: 45% (2.1 s)", the first once `after_s` seconds have passed (the
  // ATTNJIT_PROGRESS_AFTER knob, default 1), then at most one a second; done() ends with
  // "what: done in 3.4 s" if anything was printed.
  Progress(std::string what, std::ostream& out, double after_s);

  // `fraction` of the work is done (0 to 1). Cheap enough to call per row: the clock is read on
  // the first call and on every 1024th after it.
  void update(double fraction);
  void done();

private:
  using Clock = std::chrono::steady_clock;
  double elapsed() const;

  std::string what_;
  std::ostream& out_;
  double after_s_;
  Clock::time_point start_;
  double last_print_ = -1.0;  // seconds since start of the last line, < 0 before the first
  uint64_t calls_ = 0;
};

}  // namespace attnjit
