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
  void add_to(CLI::App* app);
};

struct Inputs {
  Shape shape;
  std::vector<float> q, k, v;
};

// The files, checked against each other, or random inputs; UserError naming the option otherwise.
Inputs load_or_random_inputs(const InputOptions& o, const Pattern& p);

// A float array of shape `dims` from `path` (4-D, '<f2', '<f4' or '<f8'), named `option` in errors.
std::vector<float> load_array(const std::string& path, const char* option, const std::vector<int64_t>& dims);

// n random normal values from a seed (the generator --random uses).
std::vector<float> random_normal(size_t n, uint64_t seed);

}  // namespace attnjit::cli
