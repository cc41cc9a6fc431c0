// Inputs of `attnjit run` and `attnjit grad`: q, k, v (and dO) from .npy files or random normal
// values of a given shape.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/cli_common.hpp"

namespace attnjit::cli {

// --q, --k, --v (.npy) or --random SEED with the shape options (--seq, --heads-q, --head-dim, ...).
struct InputOptions {
  std::string q, k, v;
  ShapeOptions shape;
  std::optional<uint64_t> random_seed;
  int64_t max_bytes = 0;   // --max-bytes: the most host memory the call's tensors may take (0: the machine's)
  bool gradients = false;  // grad: dO, dQ, dK and dV too (for the memory estimate)
  std::string executor = "reference";  // the reference keeps its results in float64 as well
  void add_to(CLI::App* app);
};

struct Inputs {
  Shape shape;
  std::vector<float> q, k, v;
};

// The files, checked against each other, or random inputs; UserError naming the option otherwise.
// The host memory the call's tensors take is estimated and checked (--max-bytes) before random
// inputs are made, or once the files' shapes are known.
Inputs load_or_random_inputs(const InputOptions& o, const Pattern& p);

// A float array of shape `dims` from `path` (4-D, '<f2', '<f4' or '<f8'), named `option` in errors.
std::vector<float> load_array(const std::string& path, const char* option, const std::vector<int64_t>& dims);

// n random normal values from a seed (the generator --random uses).
std::vector<float> random_normal(size_t n, uint64_t seed);

}  // namespace attnjit::cli
