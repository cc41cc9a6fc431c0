// The shipped tuning database (autotune_db/<gpu>.json) on the GPU it was tuned for: its entries
// are trusted by this build, every one is the lookup's exact hit, and Runtime::prepare launches the
// kernel of the tuned tiles. On a GPU without a shipped file (or without a GPU) it says so and
// skips.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/tune/autotune.hpp"
#include "compiler/tune/tuning_db.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/cuda/cuda_probe.hpp"
#include "runtime/cuda/tuning_search.hpp"
#include "tests/gpu/test_target.hpp"

using namespace attnjit;

TEST_CASE("the shipped tuning database of this GPU is what prepare uses", "[gpu][tuning]") {
  if (gputest::target() != gputest::Target::Gpu) { WARN("SKIPPED: needs the GPU the database was tuned on"); return; }
  if (std::string why; !CudaDriver::available(&why) || device_count() == 0) { WARN("SKIPPED: no CUDA driver/GPU: " + why); return; }
  shared_context(0).make_current();
  const TuningGpu gpu = tuning_gpu(0);
  const std::string shipped = shipped_db_dir() + "/" + sanitize_gpu_name(gpu.name) + ".json";
  if (!std::filesystem::exists(shipped)) { WARN("SKIPPED: no shipped tuning database for " + gpu.name + " (" + shipped + ")"); return; }

  const TuningDb file({shipped});
  REQUIRE(file.files().size() == 1);
  const DbFile& f = file.files()[0];
  INFO(shipped << ": " << f.problem);
  REQUIRE(f.present);
  REQUIRE(f.trusted);  // written by this attnjit and NVRTC version
  REQUIRE(!f.entries.empty());

  // The runtime's files, with an empty user cache: the shipped entry is the exact hit.
  Knobs k = knobs();
  const std::filesystem::path user = std::filesystem::temp_directory_path() / "attnjit-shipped-db-test";
  std::filesystem::remove_all(user);
  k.cache_dir = user.string();
  const TuningDb db(default_db_files(k, gpu.name));
  int ours = 0;
  for (const DbEntry& e : f.entries) {
    if (e.key.gpu != gpu.name || e.key.arch != gpu.arch || e.key.sm_count != gpu.sm_count) continue;
    ++ours;
    INFO(e.key.describe());
    const LookupResult r = db.lookup(e.key);
    CHECK(r.source == LookupResult::Source::Exact);
    CHECK(r.file == shipped);
    CHECK(r.config == e.result.best);
  }
  CHECK(ours > 0);

  // prepare() of an example pattern tuned in the file launches the tuned tiles' kernel: the
  // entries of the forward this runtime runs (on compute capability 9.0 the Hopper forward's,
  // keys marked arch_specific, unless ATTNJIT_SM90A=0).
  const bool specific = cuda_arch_specific(gpu.arch);
  INFO("the runtime runs the " << (specific ? "arch-specific (sm_90a)" : "portable") << " forward; a shipped file without "
       "entries for it is stale: bash bench/tune_gpu.sh autotune_db/" << sanitize_gpu_name(gpu.name) << ".json");
  int prepared = 0;
  for (const auto& spec : std::filesystem::directory_iterator(ATTNJIT_EXAMPLES_DIR)) {
    if (spec.path().extension() != ".json" || spec.path().stem() == "manifest") continue;
    const Pattern p = load_spec_file(spec.path().string());
    for (const DbEntry& e : f.entries) {
      if (e.key.backward || e.key.gpu != gpu.name || e.key.pattern_signature != pattern_signature(p)) continue;
      if (e.key.arch_specific != specific) continue;
      INFO(spec.path().filename().string() << " " << e.key.describe());
      RuntimeOptions o;
      o.device = Device::cuda(0);
      o.cache_dir = user.string();
      Runtime rt(o);
      const Problem pb{1, e.key.seq_bucket, e.key.seq_bucket, 16, 16, e.key.head_dim, e.key.head_dim_v, e.key.dtype, {}};
      KernelRequest req;
      req.head_dim = e.key.head_dim, req.head_dim_v = e.key.head_dim_v, req.dtype = e.key.dtype, req.arch = gpu.arch;
      req.arch_specific = specific;
      req.tma = knobs().tma;
      req.config = e.result.best;
      CHECK(rt.prepare(p, pb).kernel_name() == generate_kernel(p, req).name);
      ++prepared;
      break;
    }
  }
  CHECK(prepared > 0);
  std::filesystem::remove_all(user);
}
