// The tensor maps of the Hopper TMA forward (templates/fwd_sm90_tma.cuh): one K map and one V map
// per key stride of the plan and one Q map per query-row stride of its items, made per call (they
// hold the tensors' addresses), and the test of whether TMA describes a call's rows at all. Where
// it does not, the backend launches the cp.async Hopper kernel instead (KernelRequest::tma = false).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "emulator/tensor_map.hpp"

namespace attnjit {

// AjTmaRows and AjTmaMaps, byte for byte.
struct TmaRows {
  int64_t stride[kTmaMaps];
  int32_t rows[kTmaMaps];
  int32_t fold[kTmaMaps];
};
struct alignas(64) TmaMaps {
  emu::TensorMapBytes k[kTmaMaps];
  emu::TensorMapBytes v[kTmaMaps];
  TmaRows kv;
  emu::TensorMapBytes q[kTmaMaps];  // the forward's; none in the backward's
  TmaRows qr;
};
static_assert(sizeof(TmaMaps) == 3328 && offsetof(TmaMaps, q) == 2176 && offsetof(TmaMaps, qr) == 3200,
              "TmaMaps must match templates/fwd_sm90_tma.cuh's AjTmaMaps");
// AjFwdTmaMaps of a kernel that stages O (AJ_O_STAGED); one that does not reads `in` alone.
struct alignas(64) TmaForwardMaps {
  TmaMaps in;
  emu::TensorMapBytes o[kTmaMaps];
  TmaRows orows;
};
static_assert(sizeof(TmaForwardMaps) == 4480 && offsetof(TmaForwardMaps, o) == 3328 && offsetof(TmaForwardMaps, orows) == 4352,
              "TmaForwardMaps must match templates/fwd_sm90_tma.cuh's AjFwdTmaMaps");

// The maps' specs for a call: key tensor k, value tensor v ([B, S, H, D], any strides with a
// contiguous last dimension) and the plan's key spans, tiles of `tile_k` keys. Stride r up to 8:
// a map of the plain rows traversed with element stride r, boxes of `rows` dilated rows (r x rows
// <= 256; rows past the sequence read zero; fold 0). Stride r above 8: the rows folded by f, the
// least divisor of r that divides seq_k and leaves r / f <= 8: dimensions row mod f and row / f,
// the second traversed with element stride r / f (fold f; f = r is the residue and the dilated
// row). nullopt, with the reason in *why, when no such f exists, the plan has more than kTmaMaps
// strides, or a tensor's address or strides break the tensor-map rules.
struct TmaMapSpecs {
  int64_t strides[kTmaMaps] = {};
  int32_t rows[kTmaMaps] = {};
  int32_t fold[kTmaMaps] = {};
  emu::TensorMapSpec k[kTmaMaps], v[kTmaMaps];
  int used = 0;
};
std::optional<TmaMapSpecs> tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& k, const TensorView& v, int tile_k,
                                         std::string* why = nullptr);

// The forward's Q maps (in `k`; `v` unused): one per query-row stride of the plan's items of more
// than one row (the kernel reads a one-row item's row through map 0), tiles of `tile_q` rows, the
// query heads; the same rules and refusals as the keys'.
std::optional<TmaMapSpecs> query_tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& q, int tile_q,
                                               std::string* why = nullptr);
// The same rows of the output O (head dim head_dim_v), for TMA stores of `rows` rows at most.
std::optional<TmaMapSpecs> output_tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& o, int rows,
                                                std::string* why = nullptr);

// The backward TMA kernel's maps (templates/bwd_sm90_tma.cuh): Q's in `k` and dO's in `v`, one
// pair per query-row stride of the key-major plan's entries of more than one row (the kernel reads
// a one-row entry through map 0), tiles of `tile_q` rows; the same rules and refusals as the
// forward's.
std::optional<TmaMapSpecs> backward_tma_map_specs(const BackwardPlan& key_major, const Problem& pb, const TensorView& q,
                                                  const TensorView& dout, int tile_q, std::string* why = nullptr);

// Encoded for the emulator, or by the CUDA driver (runtime/cuda/cuda_driver.hpp) for a GPU: the
// K/V (or backward's Q/dO) maps, and the forward's Q maps where given.
TmaMaps encode_tma_maps(const TmaMapSpecs& specs, bool emulated, const TmaMapSpecs* query = nullptr);

// A forward call's sets of specs (O's where `o` is given: a kernel that stages O, whose maps take
// boxes of a warpgroup's 64 rows at most), or nullopt with the reason in *why.
struct TmaForwardSpecs {
  TmaMapSpecs kv, q;
  std::optional<TmaMapSpecs> o;
};
std::optional<TmaForwardSpecs> forward_tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& q, const TensorView& k,
                                                     const TensorView& v, const TensorView* o, int tile_q, int tile_k,
                                                     std::string* why = nullptr);
TmaForwardMaps encode_forward_tma_maps(const TmaForwardSpecs& specs, bool emulated);

}  // namespace attnjit
