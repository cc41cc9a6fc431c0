// Inputs of `attnjit run` and `attnjit grad`.
#include "tools/run_inputs.hpp"

#include <random>

#include "compiler/support/error.hpp"
#include "runtime/npy.hpp"

namespace attnjit::cli {
namespace {

std::vector<float> load_4d(const std::string& path, const char* option, std::vector<int64_t>& dims) {
  NpyArray a;
  try {
    a = read_npy(path, {NpyDtype::F16, NpyDtype::F32, NpyDtype::F64});
  } catch (const UserError& e) {
    throw UserError(std::string(option) + " " + path, e.message());
  }
  if (a.shape.size() != 4) {
    std::string dims;
    for (int64_t d : a.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    throw UserError(std::string(option) + " " + path,
                    "is a " + std::to_string(a.shape.size()) + "-D '" + npy_descr(a.dtype) + "' array of shape (" + dims +
                        "); attnjit expects a 4-D float array [batch, seq, heads, head_dim] of '<f2', '<f4' or '<f8'");
  }
  dims = a.shape;
  return npy_to_float(a);
}

void expect_equal(int64_t got, int64_t want, const std::string& what) {
  if (got != want) throw UserError(what, "is " + std::to_string(got) + " but must be " + std::to_string(want) + " to match");
}

Inputs load_inputs(const InputOptions& o) {
  if (o.shape.has_seq()) throw UserError("--seq", "cannot be combined with --q/--k/--v: the shapes come from the .npy files");
  if (o.k.empty() || o.v.empty()) throw UserError("--k/--v", "give all three of --q, --k and --v (or --random SEED)");
  Inputs in;
  std::vector<int64_t> qd, kd, vd;
  in.q = load_4d(o.q, "--q", qd);
  in.k = load_4d(o.k, "--k", kd);
  in.v = load_4d(o.v, "--v", vd);
  const std::string kname = "--k " + o.k, vname = "--v " + o.v;
  expect_equal(kd[0], qd[0], kname + " batch (dim 0), --q's batch");
  expect_equal(vd[0], qd[0], vname + " batch (dim 0), --q's batch");
  expect_equal(vd[1], kd[1], vname + " sequence length (dim 1), --k's");
  expect_equal(vd[2], kd[2], vname + " heads (dim 2), --k's");
  expect_equal(kd[3], qd[3], kname + " head dim (dim 3), --q's");
  Shape& s = in.shape;
  s.batch = qd[0];
  s.seq_q = qd[1];
  s.heads_q = qd[2];
  s.head_dim = qd[3];
  s.seq_k = kd[1];
  s.heads_kv = kd[2];
  s.head_dim_v = vd[3];
  s.q_offset = o.shape.q_offset;
  s.k_offset = o.shape.k_offset;
  return in;
}

// The host memory of a call's float32 tensors (and the reference's float64 results), about.
void check_memory(const InputOptions& o, const Shape& s) {
  const double q = double(s.batch) * s.seq_q * s.heads_q * s.head_dim, k = double(s.batch) * s.seq_k * s.heads_kv * s.head_dim,
               v = double(s.batch) * s.seq_k * s.heads_kv * s.head_dim_v, out = double(s.batch) * s.seq_q * s.heads_q * s.head_dim_v,
               lse = double(s.batch) * s.heads_q * s.seq_q;
  const bool reference = o.executor == "reference";
  double bytes = 4 * (q + k + v + out + lse) + (reference ? 8 * (out + lse) : 0);
  std::string tensors = reference ? "q, k, v, O and LSE in float32, O and LSE in float64 on the reference"
                                  : "q, k, v, O and LSE in float32";
  if (o.gradients) {
    bytes += 4 * (out + q + k + v) + (reference ? 8 * (q + k + v) : 0);
    tensors = reference ? "q, k, v, O, LSE, dO, dQ, dK and dV in float32, and the gradients in float64 on the reference"
                        : "q, k, v, O, LSE, dO, dQ, dK and dV in float32";
  }
  check_host_memory(bytes, o.max_bytes, tensors);
}

Inputs random_inputs(const InputOptions& o, const Pattern& p) {
  if (!o.shape.has_seq()) throw UserError("--random", "needs --seq N (and optionally --heads-q, --head-dim, --batch)");
  Inputs in;
  in.shape = o.shape.shape();
  check_pattern_fits(p, in.shape);  // before allocating anything of that shape
  check_memory(o, in.shape);
  const Shape& s = in.shape;
  std::mt19937_64 rng(*o.random_seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& t, int64_t n) {
    t.resize(static_cast<size_t>(n));
    for (float& x : t) x = normal(rng);
  };
  fill(in.q, s.batch * s.seq_q * s.heads_q * s.head_dim);
  fill(in.k, s.batch * s.seq_k * s.heads_kv * s.head_dim);
  fill(in.v, s.batch * s.seq_k * s.heads_kv * s.head_dim_v);
  return in;
}

}  // namespace

void InputOptions::add_to(CLI::App* app) {
  app->add_option("--q", q, "queries .npy (float32 or float16)");
  app->add_option("--k", k, "keys .npy");
  app->add_option("--v", v, "values .npy");
  app->add_option("--random", random_seed, "use random normal inputs with this seed (needs --seq)");
  app->add_option("--max-bytes", max_bytes,
                  "the most host memory the call's tensors may take, estimated before they are made (0: this machine's memory)")
      ->capture_default_str()
      ->check(at_least(0));
  shape.add_to(app, true);
}

Inputs load_or_random_inputs(const InputOptions& o, const Pattern& p) {
  if (o.random_seed && !(o.q.empty() && o.k.empty() && o.v.empty())) {
    throw UserError("--random", "cannot be combined with --q/--k/--v; use one or the other");
  }
  if (!o.random_seed && o.q.empty()) throw UserError("--q", "give input tensors (--q, --k, --v as .npy) or --random SEED");
  if (o.random_seed) return random_inputs(o, p);
  Inputs in = load_inputs(o);
  check_memory(o, in.shape);
  return in;
}

std::vector<float> load_array(const std::string& path, const char* option, const std::vector<int64_t>& want) {
  std::vector<int64_t> dims;
  std::vector<float> x = load_4d(path, option, dims);
  if (dims != want) {
    auto text = [](const std::vector<int64_t>& v) {
      std::string s;
      for (int64_t d : v) s += (s.empty() ? "" : ", ") + std::to_string(d);
      return "(" + s + ")";
    };
    throw UserError(std::string(option) + " " + path, "has shape " + text(dims) + " but must be " + text(want) +
                                                          " ([batch, seq, heads, head_dim] of the inputs)");
  }
  return x;
}

std::vector<float> random_normal(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

}  // namespace attnjit::cli
