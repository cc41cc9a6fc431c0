// Which device the GPU test binary runs on, read once from the environment by main.cpp and every
// test file alike: ATTNJIT_GPU_TESTS_DEVICE (gpu, emu or cpu) when set, else cpu when
// ATTNJIT_GPU_TESTS_ON_CPU=1, else gpu. main.cpp refuses any other value before a test runs.
#pragma once

#include <cstdlib>
#include <string>

namespace attnjit::gputest {

enum class Target { Gpu, Emu, Cpu };

// The environment's words, unchecked ("" when neither variable says anything but gpu).
inline std::string target_name() {
  const char* e = std::getenv("ATTNJIT_GPU_TESTS_DEVICE");
  const char* on_cpu = std::getenv("ATTNJIT_GPU_TESTS_ON_CPU");
  return e && *e ? e : on_cpu && *on_cpu == '1' ? "cpu" : "gpu";
}

inline bool target_name_valid(const std::string& d) { return d == "gpu" || d == "emu" || d == "cpu"; }

inline Target target() {
  static const Target t = [] {
    const std::string d = target_name();
    return d == "emu" ? Target::Emu : d == "cpu" ? Target::Cpu : Target::Gpu;
  }();
  return t;
}

// The emulator and the CPU device take host memory; a GPU takes device memory.
inline bool on_host() { return target() != Target::Gpu; }

}  // namespace attnjit::gputest
