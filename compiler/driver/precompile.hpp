// Precompile manifests: which kernels a deployment needs (patterns x head dims x dtypes x tiles x
// archs, plus the tiles the tuning databases selected), and filling a kernel cache with them.
//
//   {"attnjit_manifest": 1, "entries": [{"patterns": ["longnet.json"], "head_dims": [64, 128],
//    "dtypes": ["bf16"], "tiles": ["default", "candidates", "64x128"], "backward": true}]}
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"

namespace attnjit {

// One entry of a manifest, as read and checked by read_manifest.
struct ManifestEntry {
  std::vector<std::string> patterns;  // spec paths as written (relative to the manifest's folder)
  std::vector<int> head_dims;
  std::vector<DType> dtypes;
  std::vector<std::string> tiles = {"default"};  // "default", "candidates" or a kernel tile "QxK[wN]"
  bool backward = false;
};

// A manifest's entries. Strict, so that a mistake never leaves a deployment short of kernels: an
// unknown field is an error listing the valid ones, the nearest named when it is near ("backwards":
// did you mean "backward"?),
// numbers must be integers in range (64.9 or 2^32 + 64 is not read as 64), "attnjit_manifest" must
// be exactly 1, and an empty "entries" or an empty list in an entry (no kernels) is an error.
// UserErrors name the file and the JSON pointer (manifest.json: /entries/0/head_dims/1).
std::vector<ManifestEntry> read_manifest(const std::string& path);

// The kernels a manifest asks for on `archs` (10 * major + minor), each once. Pattern paths are
// relative to the manifest. Tiles: "default" (the default configuration plus what the tuning
// databases selected: their best and, with top_k, their k fastest), "candidates" (every
// configuration the autotuner may time) or "QxK". "backward": true adds the backward kernels.
// UserError naming the file and entry for a malformed manifest.
std::vector<KernelSource> manifest_kernels(const std::string& path, const std::vector<ArchName>& archs, int top_k = 1);

struct PrecompileReport {
  size_t kernels = 0;
  int compiled = 0, cached = 0, failed = 0;
  double seconds = 0;
  std::string cache_dir;            // the cache that was filled
  std::vector<std::string> errors;  // "<kernel> for <arch>: <why>", one per failed kernel
};

// Compiles (or finds) every kernel of the manifest into the cache at `cache_dir` (empty: the
// knobs' cache) on `jobs` threads; a failed kernel is reported, never stops the others.
PrecompileReport precompile_manifest(const std::string& manifest, const std::vector<ArchName>& archs,
                                     const std::string& cache_dir = "", int jobs = 1, int top_k = 1,
                                     const std::function<void(size_t, size_t)>& progress = {});

}  // namespace attnjit
