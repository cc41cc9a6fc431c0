// attnjit run SPEC: attention from .npy inputs or random ones, on the CPU (the float64 reference or
// the plan executor), on a GPU, or on the emulator (the GPU kernel run on the CPU).
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <random>

#include "compiler/error.hpp"
#include "compiler/spec_json.hpp"
#include "runtime/npy.hpp"
#include "compiler/plan.hpp"
#include "runtime/plan_executor.hpp"
#include "tools/run_device.hpp"
#include "runtime/reference.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {
struct RunOptions {
  std::string spec, q, k, v, out, lse, dynamic, device = "cpu", executor = "reference", tile = "64x64",
              dtype = "fp32", arch = "sm_80", kernel_tile = "default";
  int stages = 0;
  ShapeOptions shape;
  std::optional<uint64_t> random_seed;
  unsigned threads = 0;
};

struct Inputs {
  Shape shape;
  std::vector<float> q, k, v;
};

std::vector<float> load_4d(const std::string& path, const char* option, std::vector<int64_t>& dims) {
  const NpyArray a = read_npy(path);
  if (a.shape.size() != 4 || a.dtype == NpyDtype::U8) {
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

Inputs load_inputs(const RunOptions& o) {
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

Inputs random_inputs(const RunOptions& o, const Pattern& p) {
  if (!o.shape.has_seq()) throw UserError("--random", "needs --seq N (and optionally --heads-q, --head-dim, --batch)");
  Inputs in;
  in.shape = o.shape.shape();
  check_pattern_fits(p, in.shape);  // before allocating anything of that shape
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

int run_attention(const RunOptions& o) {
  const Pattern p = load_spec_file(o.spec);
  if (o.random_seed && !(o.q.empty() && o.k.empty() && o.v.empty())) {
    throw UserError("--random", "cannot be combined with --q/--k/--v; use one or the other");
  }
  if (!o.random_seed && o.q.empty()) throw UserError("--q", "give input tensors (--q, --k, --v as .npy) or --random SEED");
  const Inputs in = o.random_seed ? random_inputs(o, p) : load_inputs(o);
  const Shape& s = in.shape;
  check_pattern_fits(p, s);
  // Without offsets the call is taken to be the whole sequence; with offsets it may be one chunk
  // of a longer one, where explicit blocks outside the chunk legitimately attend nothing.
  if (s.q_offset == 0 && s.k_offset == 0) check_blocks_inside_sequence(p, s.seq_q, s.seq_k);
  const std::optional<DynamicLayout> dyn = dynamic_table_for(p, s, o.dynamic);
  const DynamicLayout* table = dyn ? &*dyn : nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> of, lf;
  if (o.device == "gpu" || o.device == "emu") {
    KernelConfig config = parse_kernel_tile(o.kernel_tile);
    config.stages = o.stages;
    const Device d = o.device == "gpu" ? Device::cuda(0) : Device::emu(parse_arch(o.arch));
    run_on_device(d, p, s, in.q, in.k, in.v, table, parse_dtype(o.dtype), config, of, lf);
  } else if (o.executor == "plan") {
    const Plan plan = lower_to_plan(p, s, parse_tile_config(o.tile), table);
    ExecutorOutput r = execute_plan(plan, p, in.q.data(), in.k.data(), in.v.data(), table, o.threads);
    of = std::move(r.o);
    lf = std::move(r.lse);
  } else {
    const ReferenceOutput r = reference_attention(p, s, in.q.data(), in.k.data(), in.v.data(), table, o.threads);
    of.assign(r.o.begin(), r.o.end());
    lf.assign(r.lse.begin(), r.lse.end());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!o.out.empty()) write_npy(o.out, NpyDtype::F32, {s.batch, s.seq_q, s.heads_q, s.head_dim_v}, of.data());
  if (!o.lse.empty()) write_npy(o.lse, NpyDtype::F32, {s.batch, s.heads_q, s.seq_q}, lf.data());
  int64_t empty = 0;
  double mean_abs = 0.0;
  for (float x : lf) empty += std::isinf(x);
  for (float x : of) mean_abs += std::abs(x);
  mean_abs /= static_cast<double>(of.size());
  const std::string where = o.device == "gpu"   ? "the gpu (" + o.dtype + ")"
                            : o.device == "emu" ? "the emulator (" + o.arch + ", " + o.dtype + ")"
                                                : "the cpu " + o.executor + " executor";
  std::cout << "ran " << pattern_hash(p) << " on " << where
            << ": batch=" << s.batch << " seq_q=" << s.seq_q
            << " seq_k=" << s.seq_k << " heads_q=" << s.heads_q << " heads_kv=" << s.heads_kv << " head_dim=" << s.head_dim
            << " head_dim_v=" << s.head_dim_v << " in " << secs << " s\n";
  std::cout << "  mean |O| = " << mean_abs << ", rows with no keys: " << empty << " of " << lf.size() << "\n";
  if (!o.out.empty()) std::cout << "  wrote O to " << o.out << "\n";
  if (!o.lse.empty()) std::cout << "  wrote LSE to " << o.lse << "\n";
  return 0;
}
}  // namespace

void register_run(CLI::App& app, int& rc) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand("run", "run attention on inputs (.npy, [batch, seq, heads, head_dim])");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  sub->add_option("--q", o->q, "queries .npy (float32 or float16)");
  sub->add_option("--k", o->k, "keys .npy");
  sub->add_option("--v", o->v, "values .npy");
  sub->add_option("--out,-o", o->out, "write O (float32 [batch, seq_q, heads_q, head_dim_v]) here");
  sub->add_option("--lse", o->lse, "write LSE (float32 [batch, heads_q, seq_q]) here");
  sub->add_option("--random", o->random_seed, "use random normal inputs with this seed (needs --seq)");
  o->shape.add_to(sub, true);
  sub->add_option("--dynamic", o->dynamic, "CSR table for a dynamic layout (JSON)");
  sub->add_option("--device", o->device,
                  "where to run: cpu (reference or plan executor), gpu, or emu (the GPU kernel in the CPU emulator)")
      ->check(CLI::IsMember({"cpu", "gpu", "emu"}))
      ->capture_default_str();
  sub->add_option("--dtype", o->dtype, "with --device gpu|emu: the dtype the inputs are converted to (fp32, fp16, bf16)")
      ->capture_default_str();
  sub->add_option("--arch", o->arch, "with --device emu: the GPU arch whose kernel is emulated (sm_75, sm_80, ...)")
      ->capture_default_str();
  sub->add_option("--kernel-tile", o->kernel_tile, "with --device gpu|emu: kernel tile QxK, or default")->capture_default_str();
  sub->add_option("--stages", o->stages, "with --device gpu|emu: cp.async stages (0: default)");
  sub->add_option("--threads", o->threads, "CPU threads (0: all)");
  sub->add_option("--executor", o->executor, "on the CPU: the float64 reference, or the plan executor (float32, tile by tile)")
      ->check(CLI::IsMember({"reference", "plan"}))
      ->capture_default_str();
  sub->add_option("--tile", o->tile, "tile size for --executor plan")->capture_default_str();
  sub->callback([o, &rc] { rc = guarded([&] { return run_attention(*o); }); });
}

}  // namespace attnjit::cli
