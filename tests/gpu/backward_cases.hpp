// The harness of the GPU backward suites (tests/gpu/test_backward_gpu.cpp, test_backward_add_gpu.cpp):
// memory of the device under test, inputs in a storage type, and check_backward, which runs a
// forward and a backward (or backward_add) on the device under test and compares the gradients
// with the float64 reference.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "attnjit/reference.hpp"
#include "runtime/cuda/cuda_driver.hpp"

namespace attnjit::gradtest {

// The device under test as main.cpp reads it (tests/gpu/test_target.hpp).
bool on_gpu();

// Memory of the device under test: device memory on a GPU, host memory for the emulator. Both
// start poisoned (0xFF bytes: NaN), so an output a kernel leaves unwritten shows, and nothing a
// kernel reads is uninitialised (compute-sanitizer's initcheck does not see the TMA unit's stores).
// An upload has landed when it returns (the graph cases run on a non-blocking stream).
class Mem {
public:
  explicit Mem(size_t bytes) : bytes_(bytes) {
    if (on_gpu()) {
      dev_ = DeviceBuffer(bytes);
      memset_d8_async(dev_.get(), 0xFF, bytes, nullptr);
      synchronize(nullptr, "poisoning a test buffer");
    } else {
      host_.assign(bytes, 0xFF);
    }
  }
  void* data() { return on_gpu() ? reinterpret_cast<void*>(dev_.get()) : static_cast<void*>(host_.data()); }
  void upload(const std::vector<uint8_t>& b) {
    if (on_gpu()) {
      copy_to_device(dev_.get(), b.data(), b.size());
      synchronize(nullptr, "an upload");
    } else {
      host_ = b;
    }
  }
  std::vector<uint8_t> download() {
    if (!on_gpu()) return host_;
    std::vector<uint8_t> b(bytes_);
    copy_to_host(b.data(), dev_.get(), bytes_);
    return b;
  }

private:
  size_t bytes_;
  DeviceBuffer dev_;
  std::vector<uint8_t> host_;
};

std::vector<uint8_t> encode(const std::vector<float>& x, DType dt);
std::vector<float> decode(const std::vector<uint8_t>& b, DType dt);
std::vector<float> rounded(std::vector<float> x, DType dt);

// A value put into one input after the random fill (a NaN or an inf: exact in every dtype): tensor
// 'q', 'k', 'v' or 'o' (dO), element `at`.
struct Poke {
  char tensor;
  size_t at;
  float value;
};

// "" when dQ, dK, dV match the reference, else the first problem. `bytes` receives the gradients'
// bytes (dq, dk, dv in turn) when given. `in_graph` (a GPU): the first forward and backward calls
// are captured in one CUDA graph on a stream of their own, which then runs twice. `add`: the
// gradients by Attention::backward_add, onto fp32 accumulators that start random, with D computed
// here from the forward's O (the dlse subtracted); what they gained is checked (and `bytes` are
// the accumulators').
std::string check_backward(Runtime& rt, const Pattern& p, const Shape& s, DType dt, const DynamicLayout* dyn, uint64_t seed,
                           bool deterministic = false, std::vector<uint8_t>* bytes = nullptr, bool caller_workspace = false,
                           bool device_table = false, bool in_graph = false, const std::vector<Poke>& pokes = {},
                           bool with_dlse = false, bool add = false);

// The device under test: cuda:0, the emulator standing in for an sm_80 GPU, or the CPU.
Device device_under_test();

// The example patterns (examples/*.json but the manifest), by file name, in a stable order.
std::vector<std::pair<std::string, Pattern>> example_patterns();

}  // namespace attnjit::gradtest
