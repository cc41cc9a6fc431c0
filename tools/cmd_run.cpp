// attnjit run SPEC: attention from .npy inputs or random ones, on the CPU (the float64 reference or
// the plan executor), on a GPU, or on the emulator (the GPU kernel run on the CPU).
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <random>

#include "compiler/support/error.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "runtime/npy.hpp"
#include "compiler/plan/plan.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "tools/run_device.hpp"
#include "runtime/input_checks.hpp"
#include "attnjit/reference.hpp"
#include "tools/cli_common.hpp"
#include "tools/run_inputs.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {
struct RunOptions : DeviceOptions {
  std::string spec, out, lse, weights, dynamic, kernel_tile = "default";
  DocumentsOption cu_seqlens;
  int stages = 0;
  InputOptions in;
  bool pack_branches = false;
  std::string out_dtype;                          // fp8_e4m3 inputs: bf16 (default) or fp16
  float q_descale = 1, k_descale = 1, v_descale = 1;  // fp8_e4m3 inputs: value = code x descale
  CLI::Option *kernel_tile_option = nullptr, *stages_option = nullptr;
};

// Options of run's alone that only some devices or executors read (the ones grad shares:
// DeviceOptions::check): given where none does, they would be ignored, so they are errors naming
// where they apply (docs/cli.md).
void check_run_options(const RunOptions& o) {
  const bool kernel = o.device != "cpu";
  if (!kernel) {
    if (o.kernel_tile_option->count() > 0)
      throw UserError("--kernel-tile " + o.kernel_tile, "applies to --device cuda or emu (the kernel's tile); the cpu device runs no "
                                                        "kernel (the plan executor's tile is --tile)");
    if (o.stages_option->count() > 0)
      throw UserError("--stages " + std::to_string(o.stages),
                      "applies to --device cuda or emu (the kernel's cp.async stages); the cpu device runs no kernel");
    if (!o.out_dtype.empty())
      throw UserError("--out-dtype " + o.out_dtype, "applies to --device cuda or emu (the dtype the kernel writes O in); the cpu "
                                                    "executors write O in float32");
  }
  if (o.pack_branches && (kernel || o.executor != "plan"))
    throw UserError("--pack-branches", kernel ? "applies to --device cpu --executor plan; --device " + o.device +
                                                    " packs branches already (ATTNJIT_PACK_BRANCHES=0 turns it off)"
                                              : std::string("applies to --executor plan; the reference executor has no tiles to pack"));
}

// FP8 inputs: each tensor's values x quantised to e4m3 codes of x / descale (ties to even,
// saturating at 448). `codes` gets the codes' values (what the executor and the devices read),
// `values` code x descale (what the reference reads). Returns how many saturated.
int64_t quantise_e4m3(std::vector<float>& x, float descale, std::vector<float>& codes) {
  int64_t saturated = 0;
  codes.resize(x.size());
  for (size_t n = 0; n < x.size(); ++n) {
    const float scaled = x[n] / descale;
    codes[n] = e4m3_to_float(float_to_e4m3(scaled));
    if (std::isfinite(scaled) && std::abs(scaled) > 464.0f) ++saturated;  // past 448's rounding range
    x[n] = codes[n] * descale;
  }
  return saturated;
}

int run_attention(const RunOptions& o) {
  const Pattern p = load_spec(o.spec);
  const DType dtype = parse_dtype(o.dtype);
  if (!o.out_dtype.empty() && dtype != DType::E4M3)
    throw UserError("--out-dtype", "is for --dtype fp8_e4m3 only (other dtypes write O in their own)");
  if (dtype != DType::E4M3 && (o.q_descale != 1 || o.k_descale != 1 || o.v_descale != 1))
    throw UserError("--q-descale/--k-descale/--v-descale", "are for --dtype fp8_e4m3 only");
  o.check();
  check_run_options(o);
  check_distinct_outputs({{"--out", o.out}, {"--lse", o.lse}, {"--weights", o.weights}});
  InputOptions inputs = o.in;
  inputs.executor = o.device == "cpu" ? o.executor : o.device;
  Inputs in = load_or_random_inputs(inputs, p);
  const Shape& s = in.shape;
  // FP8: every executor reads the quantised inputs (the reference their values, code x descale).
  std::optional<DeviceFp8> fp8;
  std::vector<float> q8, k8, v8;
  if (dtype == DType::E4M3) {
    fp8.emplace();
    fp8->q_descale = o.q_descale, fp8->k_descale = o.k_descale, fp8->v_descale = o.v_descale;
    for (float f : {o.q_descale, o.k_descale, o.v_descale})
      if (!(f > 0 && std::isfinite(f)))
        throw UserError("--q-descale/--k-descale/--v-descale", "must be positive and finite, got " + std::to_string(f));
    if (!o.weights.empty()) throw UserError("--weights", "is not available for --dtype fp8_e4m3 (FP8 attention is forward only)");
    fp8->out_dtype = o.out_dtype.empty() ? DType::BF16 : parse_dtype(o.out_dtype);
    const int64_t sat = quantise_e4m3(in.q, o.q_descale, q8) + quantise_e4m3(in.k, o.k_descale, k8) +
                        quantise_e4m3(in.v, o.v_descale, v8);
    if (sat > 0)
      std::cerr << "warning: --dtype fp8_e4m3: " << sat << " input value" << (sat == 1 ? "" : "s")
                << " past 448 x its descale saturated to +-448; raise --q-descale, --k-descale or --v-descale\n";
  }
  check_pattern_fits(p, s);
  // Without offsets the call is taken to be the whole sequence; with offsets it may be one chunk
  // of a longer one, where explicit blocks outside the chunk legitimately attend nothing.
  if (s.q_offset == 0 && s.k_offset == 0) check_blocks_inside_sequence(p, s.seq_q, s.seq_k);
  const std::optional<DynamicLayout> dyn = dynamic_table_for(p, s, o.dynamic);
  const DynamicLayout* table = dyn ? &*dyn : nullptr;
  const std::optional<std::vector<int64_t>> docs = documents_for(p, s, o.cu_seqlens, table != nullptr);
  const std::vector<int64_t>* documents = docs ? &*docs : nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  // The weights' size is checked before anything runs.
  if (!o.weights.empty()) check_weights_size(s.batch, s.heads_q, s.seq_q, s.seq_k);
  std::vector<float> of, lf, wf;
  std::vector<float>* weights = o.weights.empty() ? nullptr : &wf;
  if (o.device == "cuda" || o.device == "emu") {
    KernelConfig config = parse_kernel_tile(o.kernel_tile);
    config.stages = o.stages;
    const Device d = o.device == "cuda" ? Device::cuda(0) : emu_device(o.arch);
    o.start_bank_profile();
    if (fp8) run_on_device(d, p, s, q8, k8, v8, table, dtype, config, of, lf, nullptr, weights, documents, &*fp8);
    else run_on_device(d, p, s, in.q, in.k, in.v, table, dtype, config, of, lf, nullptr, weights, documents);
  } else if (o.executor == "plan") {
    const Plan plan = lower_to_plan(p, s, parse_tile_config(o.tile), table, documents, RandomLayouts::InPlan,
                                    o.pack_branches ? BranchPacking::Packed : BranchPacking::Separate);
    // FP8: the codes' values, with the descales and P's rounding as the kernels do them.
    const size_t units = size_t(s.batch * s.heads_kv);
    const Fp8Arithmetic arith{std::vector<float>(units, o.q_descale * o.k_descale), std::vector<float>(units, o.v_descale)};
    ExecutorOutput r = fp8 ? execute_plan(plan, p, q8.data(), k8.data(), v8.data(), table, {.threads = o.threads, .fp8 = &arith})
                           : execute_plan(plan, p, in.q.data(), in.k.data(), in.v.data(), table, {.threads = o.threads});
    of = std::move(r.o);
    lf = std::move(r.lse);
    if (weights) {
      wf.resize(static_cast<size_t>(s.batch * s.heads_q * s.seq_q * s.seq_k));
      execute_plan_weights(plan, p, in.q.data(), in.k.data(), lf.data(), wf.data(), table, {.threads = o.threads});
    }
  } else {
    const ReferenceOutput r = reference_attention(p, s, in.q.data(), in.k.data(), in.v.data(), table, o.threads, documents);
    of.assign(r.o.begin(), r.o.end());
    lf.assign(r.lse.begin(), r.lse.end());
    if (weights) {
      const std::vector<double> w = reference_weights(p, s, in.q.data(), in.k.data(), table, o.threads, documents);
      wf.assign(w.begin(), w.end());
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!o.out.empty()) write_npy(o.out, NpyDtype::F32, {s.batch, s.seq_q, s.heads_q, s.head_dim_v}, of.data());
  if (!o.lse.empty()) write_npy(o.lse, NpyDtype::F32, {s.batch, s.heads_q, s.seq_q}, lf.data());
  if (weights) write_npy(o.weights, NpyDtype::F32, {s.batch, s.heads_q, s.seq_q, s.seq_k}, wf.data());
  int64_t empty = 0;
  double mean_abs = 0.0;
  // A row that attends nothing has LSE -inf (docs/spec.md); +inf is a row whose scores overflowed.
  for (float x : lf) empty += x == -std::numeric_limits<float>::infinity();
  for (float x : of) mean_abs += std::abs(x);
  mean_abs /= static_cast<double>(of.size());
  const std::string where = o.device == "cuda"   ? "cuda (" + o.dtype + ")"
                            : o.device == "emu" ? "the emulator (" + o.arch + ", " + o.dtype + ")"
                                                : "the cpu " + o.executor + " executor" + (fp8 ? " (fp8_e4m3 inputs)" : "");
  std::cout << "ran " << pattern_hash(p) << " on " << where << ": " << shape_summary(s) << " in " << secs << " s\n";
  if (documents) std::cout << "  packed documents: " << documents->size() - 1 << "\n";
  std::cout << "  mean |O| = " << mean_abs << ", rows with no keys: " << empty << " of " << lf.size() << "\n";
  if (!o.out.empty()) std::cout << "  wrote O to " << o.out << "\n";
  if (!o.lse.empty()) std::cout << "  wrote LSE to " << o.lse << "\n";
  if (weights) std::cout << "  wrote the attention weights to " << o.weights << "\n";
  o.print_bank_profile();
  return 0;
}
}  // namespace

void register_run(CLI::App& app, int& rc) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand("run", "run attention on inputs (.npy, [batch, seq, heads, head_dim])");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  o->in.add_to(sub);
  sub->add_option("--out,-o", o->out, "write O (float32 [batch, seq_q, heads_q, head_dim_v]) here");
  sub->add_option("--lse", o->lse, "write LSE (float32 [batch, heads_q, seq_q]) here");
  sub->add_option("--weights", o->weights,
                  "write the attention weights (float32 [batch, heads_q, seq_q, seq_k], O = W V) here; "
                  "refused above ATTNJIT_MAX_WEIGHTS elements");
  sub->add_option("--dynamic", o->dynamic, "CSR table for a dynamic layout (JSON)");
  add_cu_seqlens_option(sub, o->cu_seqlens);
  o->DeviceOptions::add_to(sub, "the GPU kernel");
  sub->add_option("--dtype", o->dtype,
                  "with --device cuda|emu: the dtype the inputs are converted to (fp32, fp16, bf16); fp8_e4m3 on every "
                  "device and executor: the inputs quantised to e4m3 codes of value / descale (the cpu executors take "
                  "fp32, the default, or fp8_e4m3)")
      ->capture_default_str();
  sub->add_option("--out-dtype", o->out_dtype, "with --dtype fp8_e4m3 and --device cuda|emu: O's dtype, bf16 (default) or fp16");
  sub->add_option("--q-descale", o->q_descale, "with --dtype fp8_e4m3: q's descale factor (value = code x factor)")->capture_default_str();
  sub->add_option("--k-descale", o->k_descale, "with --dtype fp8_e4m3: k's descale factor")->capture_default_str();
  sub->add_option("--v-descale", o->v_descale, "with --dtype fp8_e4m3: v's descale factor")->capture_default_str();
  o->kernel_tile_option =
      sub->add_option("--kernel-tile", o->kernel_tile, "with --device cuda|emu: kernel tile QxK, or QxKwN for N warps, or default")
          ->capture_default_str();
  o->stages_option = sub->add_option("--stages", o->stages, "with --device cuda|emu: cp.async stages (0: default)");
  sub->add_flag("--pack-branches", o->pack_branches,
                "--executor plan: a pair several branches attend computed once, weighted by their number (as the CPU device runs it)");
  sub->callback([o, &rc] { rc = guarded([&] { return run_attention(*o); }); });
}

}  // namespace attnjit::cli
