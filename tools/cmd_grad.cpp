// attnjit grad SPEC: the gradients dQ, dK, dV of attention given dO, on the float64 reference, the
// plan executor (float32, tile by tile), a GPU or the emulator, from .npy inputs or random ones.
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>

#include "compiler/pattern/spec_json.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/support/error.hpp"
#include "runtime/npy.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "attnjit/reference.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"
#include "tools/run_device.hpp"
#include "tools/run_inputs.hpp"

namespace attnjit::cli {

namespace {
struct GradOptions : DeviceOptions {
  std::string spec, dout, o, lse, dlse, dq, dk, dv, dynamic;
  DocumentsOption cu_seqlens;
  InputOptions in;
  bool deterministic = false;
};

// Options of grad's alone that only some devices or executors read (the ones run shares:
// DeviceOptions::check): given where none does, they would be ignored, so they are errors naming
// where they apply (docs/cli.md).
void check_grad_options(const GradOptions& o) {
  const bool kernel = o.device != "cpu";
  if (!kernel && o.executor == "reference" && (!o.o.empty() || !o.lse.empty()))
    throw UserError("--o/--lse", "are read by --executor plan and --device cuda or emu (the backward from the forward's O and LSE); "
                                 "the reference executor recomputes the forward itself, so it would ignore them (drop them, or use "
                                 "--executor plan)");
  if (kernel) return;
  if (o.deterministic)
    throw UserError("--deterministic", "applies to --device cuda or emu; the cpu executors are always deterministic");
}

void write(const std::string& path, const std::vector<int64_t>& dims, const std::vector<float>& x) {
  if (!path.empty()) write_npy(path, NpyDtype::F32, dims, x.data());
}

double mean_abs(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += std::abs(v);
  return x.empty() ? 0 : s / double(x.size());
}

// An array over the query rows, [batch, heads_q, seq_q]: the forward's LSE (--lse) or its gradient (--dlse).
std::vector<float> load_lse(const std::string& path, const Shape& s, const char* flag = "--lse") {
  const NpyArray l = read_npy(path, {NpyDtype::F16, NpyDtype::F32, NpyDtype::F64});
  if (l.shape != std::vector<int64_t>{s.batch, s.heads_q, s.seq_q}) {
    throw UserError(std::string(flag) + " " + path, "must have shape (batch, heads_q, seq_q) = (" + std::to_string(s.batch) + ", " +
                                         std::to_string(s.heads_q) + ", " + std::to_string(s.seq_q) + ")");
  }
  return npy_to_float(l);
}

int run_grad(const GradOptions& o) {
  if (parse_dtype(o.dtype) == DType::E4M3)
    throw UserError("--dtype fp8_e4m3", "has no gradients: FP8 attention is forward only; use fp32, fp16 or bf16");
  const Pattern p = load_spec(o.spec);
  if (o.o.empty() != o.lse.empty()) {
    throw UserError(o.o.empty() ? "--lse" : "--o", "give the forward's O and LSE together (--o O.npy --lse LSE.npy), or "
                                                   "neither and grad runs the forward first");
  }
  o.check();
  check_grad_options(o);
  check_distinct_outputs({{"--dq", o.dq}, {"--dk", o.dk}, {"--dv", o.dv}});
  InputOptions inputs = o.in;
  inputs.gradients = true;
  inputs.executor = o.device == "cpu" ? o.executor : o.device;
  const Inputs in = load_or_random_inputs(inputs, p);
  const Shape& s = in.shape;
  check_pattern_fits(p, s);
  if (s.q_offset == 0 && s.k_offset == 0) check_blocks_inside_sequence(p, s.seq_q, s.seq_k);
  const std::optional<DynamicLayout> dyn = dynamic_table_for(p, s, o.dynamic);
  const DynamicLayout* table = dyn ? &*dyn : nullptr;
  const std::optional<std::vector<int64_t>> docs = documents_for(p, s, o.cu_seqlens, table != nullptr);
  const std::vector<int64_t>* documents = docs ? &*docs : nullptr;
  const std::vector<int64_t> odims{s.batch, s.seq_q, s.heads_q, s.head_dim_v};
  std::vector<float> dout;
  if (!o.dout.empty()) dout = load_array(o.dout, "--do", odims);
  else if (o.in.random_seed) dout = random_normal(size_t(s.batch * s.seq_q * s.heads_q * s.head_dim_v), *o.in.random_seed + 1);
  else throw UserError("--do", "give dO, the gradient of the loss with respect to O, as a .npy file [batch, seq_q, heads_q, head_dim_v]");
  const std::vector<float> dlse = o.dlse.empty() ? std::vector<float>{} : load_lse(o.dlse, s, "--dlse");
  const float* dlse_ptr = dlse.empty() ? nullptr : dlse.data();

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> dq, dk, dv;
  std::string where = "the cpu " + o.executor + " executor";
  if (o.device != "cpu") {
    DeviceBackward bwd;
    bwd.dout = dout;
    std::vector<float> of, lf;
    if (!o.o.empty()) {
      of = load_array(o.o, "--o", odims);
      lf = load_lse(o.lse, s);
      bwd.forward_given = true;
    }
    const Device d = o.device == "cuda" ? Device::cuda(0) : emu_device(o.arch);
    bwd.deterministic = o.deterministic;
    bwd.lse_grad = dlse;
    o.start_bank_profile();
    run_on_device(d, p, s, in.q, in.k, in.v, table, parse_dtype(o.dtype), KernelConfig{}, of, lf, &bwd, nullptr, documents);
    dq = std::move(bwd.dq), dk = std::move(bwd.dk), dv = std::move(bwd.dv);
    where = o.device == "cuda" ? "cuda (" + o.dtype + ")" : "the emulator (" + o.arch + ", " + o.dtype + ")";
  } else if (o.executor == "plan") {
    const Plan plan = lower_to_plan(p, s, parse_tile_config(o.tile), table, documents);
    std::vector<float> of, lf;
    if (!o.o.empty()) {
      of = load_array(o.o, "--o", odims);
      lf = load_lse(o.lse, s);
    } else {
      ExecutorOutput f = execute_plan(plan, p, in.q.data(), in.k.data(), in.v.data(), table, {.threads = o.threads});
      of = std::move(f.o);
      lf = std::move(f.lse);
    }
    ExecutorGradients g = execute_plan_backward(plan, lower_to_backward_plan(plan), p, in.q.data(), in.k.data(), in.v.data(),
                                                of.data(), lf.data(), dout.data(), table, {.threads = o.threads}, dlse_ptr);
    dq = std::move(g.dq), dk = std::move(g.dk), dv = std::move(g.dv);
  } else {
    // The reference recomputes the softmax itself (--o/--lse are refused for it: check_grad_options).
    const ReferenceGradients g =
        reference_attention_backward(p, s, in.q.data(), in.k.data(), in.v.data(), dout.data(), table, o.threads, documents, dlse_ptr);
    dq.assign(g.dq.begin(), g.dq.end()), dk.assign(g.dk.begin(), g.dk.end()), dv.assign(g.dv.begin(), g.dv.end());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write(o.dq, {s.batch, s.seq_q, s.heads_q, s.head_dim}, dq);
  write(o.dk, {s.batch, s.seq_k, s.heads_kv, s.head_dim}, dk);
  write(o.dv, {s.batch, s.seq_k, s.heads_kv, s.head_dim_v}, dv);
  std::cout << "grad " << pattern_hash(p) << " on " << where << ": " << shape_summary(s) << " in " << secs << " s\n";
  std::cout << "  mean |dQ| = " << mean_abs(dq) << ", mean |dK| = " << mean_abs(dk) << ", mean |dV| = " << mean_abs(dv) << "\n";
  for (const auto& [name, path] : {std::pair<const char*, std::string>{"dQ", o.dq}, {"dK", o.dk}, {"dV", o.dv}})
    if (!path.empty()) std::cout << "  wrote " << name << " to " << path << "\n";
  o.print_bank_profile();
  return 0;
}
}  // namespace

void register_grad(CLI::App& app, int& rc) {
  auto o = std::make_shared<GradOptions>();
  CLI::App* sub = app.add_subcommand("grad", "gradients dQ, dK, dV of attention given dO (.npy, [batch, seq, heads, head_dim])");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  o->in.add_to(sub);
  sub->add_option("--do", o->dout, "dO .npy [batch, seq_q, heads_q, head_dim_v] (random with --random)");
  sub->add_option("--o", o->o, "the forward's O .npy (with --lse; --executor plan and --device cuda|emu; default: the forward runs first)");
  sub->add_option("--lse", o->lse, "the forward's LSE .npy [batch, heads_q, seq_q] (with --o)");
  sub->add_option("--dlse", o->dlse, "the gradient of the loss with respect to the LSE output .npy [batch, heads_q, seq_q] "
                                     "(default: none; a loss of O alone)");
  sub->add_option("--dq", o->dq, "write dQ (float32 [batch, seq_q, heads_q, head_dim]) here");
  sub->add_option("--dk", o->dk, "write dK (float32 [batch, seq_k, heads_kv, head_dim]) here");
  sub->add_option("--dv", o->dv, "write dV (float32 [batch, seq_k, heads_kv, head_dim_v]) here");
  sub->add_option("--dynamic", o->dynamic, "CSR table for a dynamic layout (JSON)");
  add_cu_seqlens_option(sub, o->cu_seqlens);
  o->DeviceOptions::add_to(sub, "the generated kernels");
  sub->add_option("--dtype", o->dtype, "with --device cuda|emu: the dtype the inputs are converted to (fp32, fp16, bf16; the cpu "
                                       "executors take fp32, the default)")
      ->capture_default_str();
  sub->add_flag("--deterministic", o->deterministic,
                "with --device cuda|emu: bitwise-reproducible gradients (the CPU executors always are)");
  sub->callback([o, &rc] { rc = guarded([&] { return run_grad(*o); }); });
}

}  // namespace attnjit::cli
