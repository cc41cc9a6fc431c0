// The pipeline's stages, printed: one registry that the CLI's `attnjit dump` and Python's
// `attnjit.dump` both call, so every stage exists in both and prints the same text.
//
//   pattern    the canonical spec and its hash
//   plan       the forward plan of one shape (work items, spans, tiles, statistics)
//   plan-bwd   the backward's key-major plan of one shape
//   plan-paged the plan of one call over a paged KV cache (requests' queries and cached tokens)
//   cuda       the generated kernel source (the backward kernels with `backward`, the paged ones
//              with `paged`), per request
//   ptx        that source compiled by NVRTC
//   sass       the CUBIN's machine code (nvdisasm), compiled through the kernel cache
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/pattern/pattern.hpp"
#include "compiler/plan/paged_plan.hpp"
#include "compiler/plan/plan.hpp"

namespace attnjit {

struct DumpRequest {
  std::string stage = "pattern";
  std::optional<Shape> shape;                // plan, plan-bwd: required
  TileConfig tiles{64, 64};                  // plan, plan-bwd
  const DynamicLayout* dynamic = nullptr;    // plan, plan-bwd: a dynamic layout's table
  bool random_in_kernel = false;             // plan: random layouts left to the kernels
  bool pack_branches = false;                // plan: BranchPacking::Packed (not with plan-bwd)
  std::string pack_branches_name = "--pack-branches";
  std::vector<KernelRequest> kernels;        // cuda, ptx, sass: one text per request (arch)
  bool backward = false;                     // cuda, ptx, sass: the backward kernels
  bool paged = false;                        // cuda, ptx, sass: the paged kernels
  // plan-paged: the requests, their heads and head dims (heads_q, heads_kv, head_dim, head_dim_v of
  // `paged_heads`) and the paged kernel's tiles (zeros: its default)
  std::vector<PagedRequest> paged_requests;
  Shape paged_heads;
  KernelConfig paged_config;
  bool full = false;                         // every work item / every block of long explicit lists
  std::string full_hint = "--full";          // how the caller asks for `full`, in the "not shown" line
  // The names the caller gives the sequence length, the backward flag and the stage, in errors
  // (the CLI's "--seq", "--backward", "--stage"; Python's "seq", "backward", "stage").
  std::string seq_name = "--seq", backward_name = "--backward", stage_name = "--stage", kv_lens_name = "--kv-lens";
};

// The stages, in pipeline order.
const std::vector<std::string>& dump_stages();

// `r.stage` of pattern `p` as text; a UserError names what is missing or unknown.
std::string dump_stage(const Pattern& p, const DumpRequest& r);

}  // namespace attnjit
