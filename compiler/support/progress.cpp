#include "compiler/support/progress.hpp"

#include <iomanip>

namespace attnjit {

Progress::Progress(std::string what, std::ostream& out, double after_s)
    : what_(std::move(what)), out_(out), after_s_(after_s), start_(Clock::now()) {}

double Progress::elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

void Progress::update(double fraction) {
  if (calls_++ % 1024 != 0) return;
  const double t = elapsed();
  if (t < after_s_ || (last_print_ >= 0 && t - last_print_ < 1.0)) return;
  out_ << what_ << ": " << std::fixed << std::setprecision(0) << fraction * 100.0 << "% (" << std::setprecision(1) << t
       << " s)" << std::defaultfloat << std::endl;
  last_print_ = t;
}

void Progress::done() {
  if (last_print_ < 0) return;
  out_ << what_ << ": done in " << std::fixed << std::setprecision(1) << elapsed() << " s" << std::defaultfloat << std::endl;
  last_print_ = -1.0;
}

}  // namespace attnjit
