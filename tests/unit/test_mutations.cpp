// Deliberately broken kernels: each mutation below puts one defect into the real templates (a
// missing barrier, a missing cp.async wait, a wrong ldmatrix lane map, an off-by-one in a row map,
// swapped conversion operands) and the emulator must catch it, by a fault (race, bounds) or by an
// answer that no longer matches the float64 reference. The unmutated kernel passes the same check
// (tests/unit/mutation_check.cpp), so the check is what tells them apart.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>

#include "attnjit/attnjit.hpp"
#include "tests/unit/mutation_check.hpp"
#include "tests/unit/template_mutation.hpp"

using namespace attnjit;
using attnjit::testing::check_kernel;

namespace {

struct Mutation {
  const char* name;
  const char* file;
  const char* from;
  const char* to;
  DType dtype;  // bf16: the tensor-core path; fp32: the SIMT path
  bool backward = false;  // checks the gradients (forward and backward run)
  bool deterministic = false;  // the backward in deterministic mode (dK/dV added layer by layer)
  int head_dim = 64;  // 128: the tensor-core forward's Q lies over the last V stage on sm_80
  bool sm90a = false;  // the Hopper forward (and backward: bwd_sm90.cuh's dK/dV), emulated as sm_90a
  bool tma = true;     // with sm90a: the TMA kernel (fwd_sm90_tma.cuh), else the cp.async one (fwd_sm90.cuh)
  // Scores far below zero: q = |q| + 3.5, k = k - 3.5 (scores near -900 before the scale), so a
  // key past a tile's count that is let through (a zero row, score 0) gets P = exp(0 - LSE) = inf.
  bool far_below = false;
  // The pattern's layouts come from a dynamic table the kernels read in place (DeviceDynamicLayout):
  // a branch that is the table (32-key blocks over 64-key tiles) and a union of it with a local band
  // and explicit pairs.
  bool device_table = false;
  // Random layouts decided in the kernels (RuntimeOptions::random_in_kernel_above = 0): a causal
  // union of a band and a random layout with 32-position blocks, and a dilated random branch.
  bool random_in_kernel = false;
  // A branch of dilation 12 at 776 tokens: the TMA kernel's maps fold its rows by 2 (TMA's element
  // strides end at 8), and a 128-key tile takes four boxes of 32 of its rows.
  bool folded = false;
  // The kernel configuration (default: the runtime's); 192x128 gives the TMA kernel three consumer
  // warpgroups.
  KernelConfig config{};
  // A NaN and an inf in V at keys that some rows mask: they must reach only the rows that attend
  // them (the reference's NaN and inf, no others).
  bool nonfinite_v = false;
  // q and k scaled to scores of about 1e23: an exponent fused with the scale is off by hundreds.
  bool extreme = false;
  // 'q': a NaN in Q and in dO at rows that some keys' tiles mask; 'k': a NaN in K at a key that
  // some rows of its tiles mask. The tensor cores multiply them by the zero dS or P of the masked
  // pairs, and they must reach only the reference's gradients (through the exact sums). 'v': the
  // NaN of nonfinite_v alone, which the two-pass dQ must not need its exact sum for.
  char nonfinite_in = 0;
  // One causal branch: disjoint key tiles that cover every key, so _dkdv stores dK and dV itself
  // (BackwardPlan::keys_cover_all; the other patterns' key tiles overlap or leave keys out).
  bool causal = false;
  bool lazy = false;  // RuntimeOptions::lazy_rescale (the forwards' AJ_LAZY_RESCALE)
  bool poly = false;  // RuntimeOptions::poly_exp2 (the forwards' AJ_POLY_EXP2)
  // A causal LongNet-like pattern (segment 256 dilation 1, 128 dilation 2, 512 dilation 4; head
  // offsets) whose packed plan leaves out the dilated branches' tiles (the dense branch holds their
  // keys) and weights the dense branch's keys (the runtime packs by default), differently in
  // different tiles of a span (the second branch covers only the query's 128 positions): the
  // weights must reach every score they stand for.
  bool packed = false;
  int persistent = 0;  // RuntimeOptions::persistent_blocks (the TMA forward's AJ_PERSISTENT)
};

const Mutation kMutations[] = {
    {"no barrier before a stage is overwritten", "fwd_sm80.cuh",
     "    aj_syncthreads();  // this stage is overwritten by a later prefetch\n", "\n", DType::BF16},
    {"no barrier after the cp.async wait", "fwd_sm80.cuh", "    aj_cp_async_wait<AJ_STAGES - 1>();\n    aj_syncthreads();\n",
     "    aj_cp_async_wait<AJ_STAGES - 1>();\n", DType::BF16},
    {"no cp.async wait", "fwd_sm80.cuh", "    aj_cp_async_wait<AJ_STAGES - 1>();\n", "\n", DType::BF16},
    {"Q over a V stage: no barrier before the first prefetch overwrites it", "fwd_sm80.cuh",
     "    if (busy) aj_sm80_q_to_registers(qf, q_frag);\n    if (AJ_Q_OVER_KV) aj_syncthreads();\n",
     "    if (busy) aj_sm80_q_to_registers(qf, q_frag);\n", DType::BF16, false, false, 128},
    {"Q over a V stage: Q read before its cp.async has landed", "fwd_sm80.cuh",
     "    if (AJ_Q_OVER_KV) aj_cp_async_wait<0>();\n", "    if (AJ_Q_OVER_KV) {}\n", DType::BF16, false, false, 128},
    {"Q in registers: read before its cp.async group has landed", "fwd_sm80.cuh",
     "    else aj_cp_async_wait<AJ_STAGES - 1>();\n", "\n", DType::BF16},
    {"128x64, 4 warps: the K and V bases read before the barrier that publishes them", "fwd_sm80.cuh",
     "  }\n  aj_syncthreads();\n  if (AJ_Q_IN_REGS && issued > 0) {", "  }\n  if (AJ_Q_IN_REGS && issued > 0) {", DType::BF16,
     false, false, 128, false, true, false, false, false, false, KernelConfig{128, 64, 2, 4}},
    {"128x64, 4 warps: the epilogue's item read again from the wrong block", "fwd_sm80.cuh",
     "? p.items[aj_block_idx_x()] : item;", "? p.items[aj_block_idx_x() ^ 1] : item;", DType::BF16, false, false, 128, false,
     true, false, false, false, false, KernelConfig{128, 64, 2, 4}},
    {"one K and one V buffer: V(j) loaded before every warp is past P V(j - 1)", "fwd_sm80.cuh",
     "    aj_syncthreads();  // K(j) has landed for every thread;", "    // K(j) has landed for every thread;", DType::BF16, false,
     false, 128, false, true, false, false, false, false, KernelConfig{128, 64, 1, 4}},
    {"one K and one V buffer: K(j + 1) loaded before every warp is past S(j)", "fwd_sm80.cuh",
     "    aj_syncthreads();  // V(j) has landed for every thread;", "    // V(j) has landed for every thread;", DType::BF16, false,
     false, 128, false, true, false, false, false, false, KernelConfig{128, 64, 1, 4}},
    {"one K and one V buffer: O laid over V before every warp is past its last P V", "fwd_sm80.cuh",
     "  aj_syncthreads();  // every warp is past its last P V", "  // every warp is past its last P V", DType::BF16, false, false,
     128, false, true, false, false, false, false, KernelConfig{128, 64, 1, 4}},
    {"a tile's copies take one row past its count", "fwd_sm80.cuh", "src, i * STEP < left);", "src, i * STEP <= left);",
     DType::BF16},
    {"a thread's first copied row taken without the dilation", "fwd_sm80.cuh",
     "const aj_u32 row = (aj_u32)first + r0 * (aj_u32)stride;", "const aj_u32 row = (aj_u32)first + r0;", DType::BF16},
    {"a thread's copies stepped without the dilation", "fwd_sm80.cuh",
     "const aj_i64 step = (aj_i64)(aj_u32)stride * row_stride * STEP;", "const aj_i64 step = row_stride * STEP;", DType::BF16},
    {"the tile slot's first key and stride read swapped", "fwd_sm80.cuh", "t.first = (int)a.x, t.stride = (int)a.y,",
     "t.first = (int)a.y, t.stride = (int)a.x,", DType::BF16},
    {"partial tiles: one key past the count let through", "fwd_sm80.cuh", "if (!((j * 8 + (e & 1) < left) &",
     "if (!((j * 8 + (e & 1) <= left) &", DType::BF16, false, false, 64, false, true, true},
    {"the row maximum's partials start at 0, not at the first n-tiles", "fwd_sm80.cuh",
     "    part[0][j % PARTS] = j < PARTS ? m0 :", "    part[0][j % PARTS] = j < PARTS ? 0.0f :", DType::BF16, false, false,
     64, false, true, true},
    {"K fragments loaded with V's ldmatrix lane map", "fwd_sm80.cuh",
     "const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;",
     "const int k_row = (lane & 7) + ((lane >> 3) & 1) * 8, k_col = (lane >> 4) * 8;", DType::BF16},
    {"off-by-one in the output row map", "fwd_sm80.cuh", "aj_st_u32x4(base + (first + (aj_i64)r * stride)",
     "aj_st_u32x4(base + (first + (aj_i64)(r + 1) * stride)", DType::BF16},
    {"off-by-one in the LSE's row map", "fwd_sm80.cuh",
     "const aj_i64 i0 = item.rows_start + (aj_i64)r0 * item.rows_stride,",
     "const aj_i64 i0 = item.rows_start + (aj_i64)(r0 + 1) * item.rows_stride,", DType::BF16},
    {"epilogue: O stored before every warp has staged its rows", "fwd_sm80.cuh",
     "o_tile);\n  aj_syncthreads();\n  aj_elem* ob", "o_tile);\n  aj_elem* ob", DType::BF16},
    {"epilogue: the O tile's pitch taken as the head dim", "fwd_sm80.cuh",
     "  aj_store_tile_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_DVP>", "  aj_store_tile_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_HEAD_DIM_V>",
     DType::BF16},
    {"the loop reads the tile slot of the stage being prefetched", "fwd_sm80.cuh",
     "      const AjTile t = aj_sm80_issued(sh, stage);", "      const AjTile t = aj_sm80_issued(sh, (iter + 1) % AJ_STAGES);",
     DType::BF16},
    {"tensor-core dQ: the loop reads the tile slot of the stage being prefetched", "bwd_sm80.cuh",
     "    const AjTile t = aj_sm80_issued(sh, stage);", "    const AjTile t = aj_sm80_issued(sh, (iter + 1) % AJ_STAGES);",
     DType::BF16, true, true},
    {"the cp.async copies of rows past a tile read their (out of range) source", "blocks/memory.cuh",
     "  aj_emu_cp_async(smem, gmem, 16, valid ? 16 : 0);", "  aj_emu_cp_async(smem, gmem, 16, 16);", DType::BF16},
    {"device table: the seek lands one tile past the next kept key", "mask_lib.cuh",
     "      j = (n - origin + s.keys_stride - 1) / s.keys_stride;\n",
     "      j = (n - origin + s.keys_stride - 1) / s.keys_stride + AJ_TILE_K;\n", DType::BF16, true, false, 64, false, true, false,
     true},
    {"device table: a tile over two key blocks taken whole", "mask_lib.cuh", "  whole = aj_layout_whole(p, branch, head, q_lo, q_hi, k_lo, k_hi);\n  return true;",
     "  whole = true;\n  return true;", DType::BF16, true, false, 64, false, true, false, true},
    {"device table: the seek finds an explicit layout's next pair one block late", "mask_lib.cuh",
     "pairs[2 * at + 1] < best)) best = pairs[2 * at + 1];\n  }\n  return best;",
     "pairs[2 * at + 1] < best)) best = pairs[2 * at + 1];\n  }\n  return best < 0 ? best : best + 1;", DType::BF16, false, false, 64, false, true, false, true},
    {"device table: the problem count's bound on key blocks left out", "mask_lib.cuh", "kb >= p.dyn_k_blocks", "kb > p.dyn_k_blocks + 99",
     DType::BF16, false, false, 64, false, true, false, true},
    {"random in the kernels: a tile the band keeps whole taken whole, the layout not asked", "common.cuh",
     "    if (aj_seeks(*p, s.branch)) full = full && layout_whole;\n", "\n", DType::BF16, false, false, 64, false, true, false,
     false, true},
    {"random in the kernels: the cursor walks every tile of the band", "common.cuh", "        if (!aj_seeks(*p, s.branch)) return;",
     "        return;", DType::F32, false, false, 64, false, true, false, false, true},
    {"random in the kernels: the backward's entries not narrowed by the layout", "bwd_common.cuh", "  if (aj_seeks(p, qe.branch)) {",
     "  if (false) {", DType::BF16, true, false, 64, false, true, false, false, true},
    {"cvt.rn.bf16x2 operands swapped", "common.cuh", "  return aj_cvt_bf16x2(hi, lo);", "  return aj_cvt_bf16x2(lo, hi);",
     DType::BF16},
    {"SIMT: no barrier before the next tile is loaded", "fwd_simt.cuh",
     "    aj_syncthreads();  // the previous tile is no longer read\n", "\n", DType::F32},
    {"partial tiles: the branch's mask rule not applied (only the key count)", "fwd_sm80.cuh",
     "aj_keys_rule(p, t.branch, head, t.full, apply);", "aj_keys_rule(p, t.branch, head, true, apply);", DType::BF16},
    {"tensor-core dQ: a full tile cut short taken as whole (keys past its count kept)", "bwd_sm80.cuh",
     "if (t.full && t.count == AJ_TILE_K) apply(AjAllowAll(), false);", "if (t.full) apply(AjAllowAll(), false);", DType::BF16,
     true, true, 64, false, true, true},
    {"backward: dK without the softmax scale", "bwd_simt.cuh", "aj_red_add_f32(dka + lane + AJ_SIMT_LANES * x, dk[x] * bp.scale);",
     "aj_red_add_f32(dka + lane + AJ_SIMT_LANES * x, dk[x]);", DType::F32, true},
    {"backward: no barrier before the next query chunk is staged", "bwd_simt.cuh",
     "      aj_syncthreads();  // the previous chunk is no longer read\n", "\n", DType::F32, true},
    {"backward: dS without D = rowsum(dO * O)", "bwd_simt.cuh", "      const float ds = pr * (f * dp - delta);",
     "      const float ds = pr * f * dp;", DType::F32, true},
    {"backward: the dK/dV workspace stored instead of accumulated", "bwd_simt.cuh",
     "aj_red_add_f32(dva + lane + AJ_SIMT_LANES * x, dv[x]);", "dva[lane + AJ_SIMT_LANES * x] = dv[x];", DType::F32, true},
    {"backward, deterministic: the layered dV add stores instead of adding", "bwd_simt.cuh",
     "for (int x = 0; x < AJ_VD; ++x) dva[lane + AJ_SIMT_LANES * x] += dv[x];",
     "for (int x = 0; x < AJ_VD; ++x) dva[lane + AJ_SIMT_LANES * x] = dv[x];", DType::F32, true, true},
    {"tensor-core backward: dS^T without D = rowsum(dO * O)", "bwd_sm80.cuh",
     "      s[j][x] = masked ? 0.0f : pr * (f * dp[j][x] - delta[col]);", "      s[j][x] = masked ? 0.0f : pr * f * dp[j][x];", DType::BF16,
     true},
    {"tensor-core backward: a masked pair's dS^T multiplied by its marker P^T = -0 instead of selected", "bwd_sm80.cuh",
     "      s[j][x] = masked ? 0.0f : pr * (f * dp[j][x] - delta[col]);", "      s[j][x] = pr * (f * dp[j][x] - delta[col]);",
     DType::BF16, true, false, 64, false, true, false, false, false, false, KernelConfig{}, true},
    {"tensor-core backward: no barrier before the prefetch overwrites a query stage", "bwd_sm80.cuh",
     "    aj_syncthreads();  // this stage is overwritten by the prefetch two tiles on\n", "\n", DType::BF16, true, true},
    {"tensor-core backward: no cp.async wait before a query stage is read", "bwd_sm80.cuh", "    aj_cp_async_wait<1>();\n",
     "\n", DType::BF16, true},
    {"tensor-core backward: the B operand of dQ += dS K and dK += dS^T Q not transposed", "bwd_sm80.cuh",
     "aj_ldmatrix_x4_trans(bf, b + (kk * 16 + b_row) * BPITCH + n * 16 + b_col);",
     "aj_ldmatrix_x4(bf, b + (kk * 16 + b_row) * BPITCH + n * 16 + b_col);", DType::BF16, true},
    {"tensor-core backward: dK/dV of key rows past the key tile added too", "bwd_sm80.cuh",
     "    if (kr >= ki.keys_count) continue;\n", "\n", DType::BF16, true},
    {"tensor-core backward: dQ of the row's second accumulator half from the first's LSE", "bwd_sm80.cuh",
     "aj_ex2(aj_mul_rn(s[j][e], p.scale_log2) - (e < 2 ? lse0 : lse1))", "aj_ex2(aj_mul_rn(s[j][e], p.scale_log2) - lse0)", DType::BF16, true, true},
    {"single-pass backward: no barrier before dS^T is read for dQ", "bwd_sm80.cuh",
     "  const int g = lane / 4, quad = lane % 4;\n  aj_syncthreads();\n  for (int u = warp;",
     "  const int g = lane / 4, quad = lane % 4;\n  for (int u = warp;", DType::BF16, true},
    {"single-pass backward, head dim 128 (two row blocks an entry): no barrier before the next rows overwrite dS^T",
     "bwd_sm80.cuh", "        if (c0 + AJ_BWD_SUB_Q < qe.rows_count) aj_syncthreads();\n", "\n", DType::BF16, true, false, 128},
    {"single-pass backward: dS^T of the second row half left out of dQ", "bwd_sm80.cuh",
     "in1 ? aj_pack2(s[j][2], s[j][3]) : 0u;", "0u;", DType::BF16, true},
    {"single-pass backward: dS^T of key rows past the tile's count kept", "bwd_sm80.cuh",
     "const bool in0 = kr0 < ki.keys_count, in1 = kr1 < ki.keys_count;", "const bool in0 = true, in1 = true;", DType::BF16, true,
     false, 64, false, true, true},
    {"single-pass backward: dQ added to the row of the next tile row", "bwd_sm80.cuh",
     "const aj_i64 i = qe.rows_start + (aj_i64)r * qe.rows_stride;", "const aj_i64 i = qe.rows_start + (aj_i64)(r ^ 1) * qe.rows_stride;",
     DType::BF16, true},
    {"single-pass backward: dQ without the softmax scale", "bwd_sm80.cuh",
     "aj_red_add_f32x2(dst + n * 8, acc[n][2 * half] * bp.scale,", "aj_red_add_f32x2(dst + n * 8, acc[n][2 * half],",
     DType::BF16, true},
    {"single-pass backward: A operand of dQ += dS K read without the transpose", "bwd_sm80.cuh",
     "    aj_ldmatrix_x4_trans(af, at + (ks * 16 + a_row) * APITCH + a_col);", "    aj_ldmatrix_x4(af, at + (ks * 16 + a_row) * APITCH + a_col);",
     DType::BF16, true},
    {"backward: the lse output's gradient left out of D", "bwd_common.cuh",
     "    sum -= bp.dlse[b * bp.dlse_batch_stride + h * bp.dlse_head_stride + i];", "    ;", DType::BF16, true},
    // Past head dim 128: dK, dV and the single pass's dQ a column slice at a time.
    {"column slices: dK of every slice added at the first slice's columns", "bwd_sm80.cuh",
     "      const int at = k0 + c * 8;\n      const float x0 = dk", "      const int at = c * 8;\n      const float x0 = dk", DType::BF16,
     true, false, 256},
    {"column slices: dV of every slice from the first slice's columns of dO", "bwd_sm80.cuh",
     "st.dout + c0 * AJ_DVP + v0, lane, vcols", "st.dout + c0 * AJ_DVP, lane, vcols", DType::BF16, true, false, 256},
    {"column slices: the single pass's dQ of every slice over the first slice's columns", "bwd_sm80.cuh",
     "uc = k0 / 16 + u % col_blocks", "uc = u % col_blocks", DType::BF16, true, false, 256},
    {"column slices: dV of every slice added at the first slice's columns", "bwd_sm80.cuh",
     "      const int at = v0 + c * 8;", "      const int at = c * 8;", DType::BF16, true, false, 256},
    {"column slices: the first query tile staged again without its commit (read before it lands)", "bwd_sm80.cuh",
     "bp.query_entries[ki.entry_begin], b);\n      aj_cp_async_commit();\n    }", "bp.query_entries[ki.entry_begin], b);\n    }",
     DType::BF16, true, false, 256},
    {"column slices: the next slice starts from a stale query stage", "bwd_sm80.cuh",
     "    if (slice > 0 && ki.entry_begin < ki.entry_end) {", "    if (false) {", DType::BF16, true, false, 256},
    {"column slices: the uneven last slice takes the full width", "bwd_sm80.cuh",
     "aj_bwd_slice_cols(k0, AJ_HEAD_DIM, AJ_BWD_DK_COLS);", "k0 >= AJ_HEAD_DIM ? 0 : AJ_BWD_DK_COLS;", DType::BF16, true, false,
     208},
    {"column slices: a key row's exact sum reads the first slice's columns of Q", "bwd_sm80.cuh",
     "qrow + (k0 + blk) * 8", "qrow + blk * 8", DType::BF16, true, false, 256, false, true, false, false, false, false, KernelConfig{},
     false, false, 'q'},
    {"tensor-core backward, deterministic: the layered dV add stores instead of adding", "bwd_sm80.cuh",
     "if (bp.plain_add) dva[at] += x0, dva[at + 1] += x1;", "if (bp.plain_add) dva[at] = x0, dva[at + 1] = x1;",
     DType::BF16, true, true},
    {"sm_90a, cp.async: no fence.proxy.async between the cp.async copies and the wgmma that reads them", "fwd_sm90.cuh",
     "  aj_fence_proxy_async();\n  aj_syncthreads();\n}", "  aj_syncthreads();\n}", DType::BF16, false, false, 64, true, false},
    {"sm_90a, cp.async: S(j + 1) read before its wgmma is waited for", "fwd_sm90.cuh", "  aj_wgmma_wait<1>();  // S(j + 1) is done; P(j) V(j) may still run\n", "\n", DType::BF16,
     false, false, 64, true, false},
    {"sm_90a, cp.async: no wgmma.fence before O += P V", "fwd_sm90.cuh", "  aj_wgmma_fence();\n#pragma unroll\n  for (int kk",
     "#pragma unroll\n  for (int kk", DType::BF16, false, false, 64, true, false},
    {"sm_90a, cp.async: the next P packed while P V still reads its registers", "fwd_sm90.cuh",
     "    aj_tc_softmax_scores(s, m, l, c, p.scale_log2);\n  }\n  aj_wgmma_wait<0>();",
     "    aj_tc_softmax_scores(s, m, l, c, p.scale_log2);\n  }\n  aj_sm90_pack(s, pa);\n  aj_wgmma_wait<0>();", DType::BF16,
     false, false, 64, true, false},
    {"sm_90a: a partial tile's softmax without its mask (the arms of the mask's branch swapped)", "fwd_sm90.cuh",
     "  if (!(t.full && t.count == AJ_TILE_K)) {\n    aj_sm80_mask", "  if (t.full && t.count == AJ_TILE_K) {\n    aj_sm80_mask",
     DType::BF16, false, false, 64, true, false},
    {"sm_90a, cp.async: one cp.async group too few waited for (V(j) not landed)", "fwd_sm90.cuh", "#define AJ_SM90_AHEAD (2 * (AJ_STAGES - 1))",
     "#define AJ_SM90_AHEAD (2 * AJ_STAGES - 1)", DType::BF16, false, false, 64, true, false},
    {"sm_90a, cp.async: V read K-major", "fwd_sm90.cuh", "aj_wgmma_rs<AJ_HEAD_DIM_V, AJ_WGMMA_TYPE, 1>", "aj_wgmma_rs<AJ_HEAD_DIM_V, AJ_WGMMA_TYPE, 0>",
     DType::BF16, false, false, 64, true, false},
    {"sm_90a, cp.async: a k16 step of Q moves 16 bytes instead of 32", "fwd_sm90.cuh", "(ks / 4) * AJ_TILE_Q * AJ_SW + (ks % 4) * 32) >> 4",
     "(ks / 4) * AJ_TILE_Q * AJ_SW + (ks % 4) * 16) >> 4", DType::BF16, false, false, 128, true, false},
    {"sm_90a, cp.async: tiles stored without the swizzle", "fwd_sm90.cuh", "((chunk ^ (r & 7)) << 4)", "(chunk << 4)", DType::BF16, false,
     false, 64, true, false},
    {"sm_90a, cp.async: no barrier before a stage is overwritten (head dim 256: 64-key tiles, so a stage is reused)", "fwd_sm90.cuh",
     "    aj_syncthreads();  // K(j + 1)'s and V(j)'s stages are overwritten by later prefetches\n", "\n", DType::BF16, false, false, 256, true, false},
    {"sm_90a, TMA: consumers read K(j + 1) without waiting for its load", "fwd_sm90_tma.cuh",
     "      aj_mbarrier_wait(&k_full[sk], aj_ring_parity(j0 + j + 1));\n", "\n", DType::BF16, false, false, 64, true},
    // (head dim 256: 64-key tiles, so stages are reused)
    {"sm_90a, TMA: the producer refills a V stage without waiting for its release", "fwd_sm90_tma.cuh",
     "    if (use > 0) aj_mbarrier_wait(&r.v_empty[s], (use - 1) & 1);\n", "\n", DType::BF16, false, false, 256, true},
    {"sm_90a, TMA: a V stage released before P V's wgmma has read it", "fwd_sm90.cuh",
     "  aj_wgmma_wait<0>();  // P(j) V(j) is done\n  hooks.pv_read();\n", "  hooks.pv_read();\n  aj_wgmma_wait<0>();\n", DType::BF16, false, false,
     256, true},
    {"sm_90a, TMA: consumers wait on V's stage with the wrong parity", "fwd_sm90_tma.cuh",
     "      aj_mbarrier_wait(&v_full[sv], aj_ring_parity(j0 + j));\n      // Straight-line",
     "      aj_mbarrier_wait(&v_full[sv], aj_ring_parity(j0 + j) ^ 1);\n      // Straight-line", DType::BF16, false, false, 64,
     true},
    {"sm_90a, TMA: expect_tx announces half of K's bytes", "fwd_sm90_tma.cuh", "aj_mbarrier_arrive_expect_tx(&r.k_full[s], AJ_SM90_K_STAGE);",
     "aj_mbarrier_arrive_expect_tx(&r.k_full[s], AJ_SM90_K_STAGE / 2);", DType::BF16, false, false, 64, true},
    {"sm_90a, TMA: a tile's first row given as its dilated index", "fwd_sm90_tma.cuh", "(int)(first + r0 * stride)",
     "(int)(first / stride + r0 * stride)", DType::BF16, false, false, 128, true},
    {"sm_90a, TMA: folded rows stepped by the stride instead of stride / fold", "fwd_sm90_tma.cuh", "row + r0 * step, b)",
     "row + r0 * (int)stride, b)", DType::BF16, false, false, 64, true, true, false, false, false, true},
    {"sm_90a, TMA: consumers read Q without waiting for its load", "fwd_sm90_tma.cuh",
     "    aj_mbarrier_wait(&r.q_full[qb], (count.items / AJ_Q_BUFFERS) & 1);\n", "\n", DType::BF16, false, false, 64, true},
    {"sm_90a, TMA: consumers wait on Q's buffer with the wrong parity", "fwd_sm90_tma.cuh", "(count.items / AJ_Q_BUFFERS) & 1);",
     "((count.items / AJ_Q_BUFFERS) & 1) ^ 1);", DType::BF16, false, false, 128, true},
    {"sm_90a, TMA: expect_tx announces half of Q's bytes", "fwd_sm90_tma.cuh", "aj_mbarrier_arrive_expect_tx(&r.q_full[qb], AJ_SM90_Q_TILE);",
     "aj_mbarrier_arrive_expect_tx(&r.q_full[qb], AJ_SM90_Q_TILE / 2);", DType::BF16, false, false, 64, true},
    {"sm_90a, TMA: Q's boxes over the key maps (Q's rows read from K)", "fwd_sm90_tma.cuh",
     "SET == AJ_MAPS_V ? maps.v : maps.q,", "SET == AJ_MAPS_V ? maps.v : maps.k,", DType::BF16, false, false, 64, true},
    {"sm_90a, TMA: ping-pong without warpgroup 1's first handoff", "fwd_sm90_tma.cuh",
     "    if (AJ_CONSUMER_WGS > 1 && wg == AJ_CONSUMER_WGS - 1) aj_named_arrive(1, 256);  // warpgroup 0 issues first\n", "\n",
     DType::BF16, false, false, 64, true},
    {"sm_90a, TMA: ping-pong with warpgroup 1 handing over its last issue too", "fwd_sm90_tma.cuh", "!(wg == AJ_CONSUMER_WGS - 1 && last)", "true",
     DType::BF16, false, false, 64, true},
    {"sm_90a, TMA: the plan read ahead keeps the first tile it read (the next tile not refreshed)", "fwd_sm90_tma.cuh",
     "    if (*more) *next = cur->tile();\n", "\n", DType::BF16, false, false, 64, true},
    {"sm_90a, TMA: the plan read ahead moves after reading (each step's mask from the tile before)", "fwd_sm90_tma.cuh",
     "    cur->next();\n    *more = !cur->done();\n    if (*more) *next = cur->tile();\n",
     "    const AjTile seen = cur->tile();\n    cur->next();\n    *more = !cur->done();\n    if (*more) *next = seen;\n",
     DType::BF16, false, false, 64, true},
    {"sm_90a, TMA, three warpgroups: warpgroup 1 hands over to warpgroup 0, skipping warpgroup 2", "fwd_sm90_tma.cuh",
     ": 1 + (wg + 1) % AJ_CONSUMER_WGS;", ": 1 + (wg + 1) % 2;", DType::BF16, false, false,
     64, true, true, false, false, false, false, KernelConfig{192, 128, 2}},
    {"sm_90a, 128x176: K's second 64-column block taken 128 key rows on (a power-of-two tile assumed)", "fwd_sm90.cuh",
     "    const aj_u64 db = k_desc + (((ks / 4) * AJ_TILE_K * AJ_SW", "    const aj_u64 db = k_desc + (((ks / 4) * 128 * AJ_SW",
     DType::BF16, false, false, 128, true, true, false, false, false, false, KernelConfig{128, 176, 2}},
    {"sm_90a, TMA: the mbarriers used before the barrier after their init", "fwd_sm90_tma.cuh",
     "  aj_syncthreads();  // the mbarriers are initialised for every thread\n", "\n", DType::BF16, false, false, 64, true},
    // Persistent blocks (two: block 0 takes items 0 and 2, block 1 items 1 and 3; one: all four).
    {"sm_90a, TMA, persistent: each block's next unit one too far (units left out)", "fwd_sm90_tma.cuh",
     "(aj_i64)aj_grid_dim_x(), (aj_i64)p.num_items * p.batch}", "(aj_i64)aj_grid_dim_x() + 1, (aj_i64)p.num_items * p.batch}",
     DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 2},
    {"sm_90a, TMA, persistent: the producer's tile count restarts at each item (stages out of step)", "fwd_sm90_tma.cuh",
     "u % p.batch, c);", "u % p.batch, AjTmaCount{0, c.items});", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false,
     false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent: the consumers' tile count restarts at each item", "fwd_sm90_tma.cuh",
     "    c = aj_sm90_tma_consume(p, maps, r, item, u % p.batch, cur, c);",
     "    c = aj_sm90_tma_consume(p, maps, r, item, u % p.batch, cur, AjTmaCount{0, c.items});", DType::BF16, false, false, 64,
     true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    // (head dim 256: one Q buffer, which the next item's Q overwrites)
    {"sm_90a, TMA, persistent: the producer loads the next item's Q without waiting for the buffer's release", "fwd_sm90_tma.cuh",
     "    if (use > 0) aj_mbarrier_wait(&r.q_empty[qb], (use - 1) & 1);\n", "\n", DType::BF16, false, false, 256, true, true, false, false,
     false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent: the consumers never release Q's buffer (the producer waits forever)", "fwd_sm90_tma.cuh",
     "    if (!more) aj_mbarrier_arrive(&r.q_empty[qb]);", "", DType::BF16, false, false, 64, true, true, false, false, false, false,
     KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent: Q's buffer released after the item's first S, while the next tiles' S still read it", "fwd_sm90_tma.cuh",
     "    if (!more) aj_mbarrier_arrive(&r.q_empty[qb]);", "    if (j == 0) aj_mbarrier_arrive(&r.q_empty[qb]);", DType::BF16, false,
     false, 256, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent: the consumers read every item's Q from buffer 0", "fwd_sm90_tma.cuh", "  sh.q += qb * AJ_SM90_Q_TILE;\n",
     "\n", DType::BF16, false, false, 128, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false,
     false, 1},
    {"sm_90a, TMA, persistent: the consumers count an item's tiles one short", "fwd_sm90_tma.cuh", "      ++j;\n      break;",
     "      break;", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false,
     false, false, 1},
    {"sm_90a, TMA, persistent, O by TMA: the staging rows written without fence.proxy.async", "fwd_sm90_tma.cuh",
     "  aj_fence_proxy_async();  // the generic stores, then the TMA stores that read them\n", "\n", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent, O by TMA: the staging rows rewritten before the last stores have read them", "fwd_sm90_tma.cuh",
     "  if (issuers) aj_bulk_wait_read<0>();  // the last stores have read the staging rows\n", "\n", DType::BF16, false, false, 128, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent, O by TMA: no barrier before the staging rows are rewritten", "fwd_sm90_tma.cuh",
     "  if (issuers) aj_bulk_wait_read<0>();  // the last stores have read the staging rows\n  aj_named_sync(AJ_O_BARRIER + wg, 128);\n", "  if (issuers) aj_bulk_wait_read<0>();  // the last stores have read the staging rows\n", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent, O by TMA: no barrier between the staging rows' stores and the TMA stores", "fwd_sm90_tma.cuh",
     "  aj_fence_proxy_async();  // the generic stores, then the TMA stores that read them\n  aj_named_sync(AJ_O_BARRIER + wg, 128);\n", "  aj_fence_proxy_async();  // the generic stores, then the TMA stores that read them\n", DType::BF16, false, false, 128, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a, TMA, persistent, O by TMA: the block ends before its last stores are done", "fwd_sm90_tma.cuh",
     "  if (tid / 32 % 4 == 0) aj_bulk_wait<0>();", "", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    // (one causal branch: items of 128 rows, so both warpgroups store by TMA)
    {"sm_90a, TMA, persistent, O by TMA: every warpgroup's boxes from warpgroup 0's staging rows", "fwd_sm90_tma.cuh",
     "    const unsigned char* const src = o + wg * AJ_WG_ROWS * AJ_SW;", "    const unsigned char* const src = o;", DType::BF16, false, false, 128, true, true, false, false, false, false, KernelConfig{}, false, false, 0, true, false, false, false, 1},
    {"sm_90a, TMA, persistent, O by TMA: the staging rows written without the swizzle", "fwd_sm90_tma.cuh",
     "((((col % AJ_COLS) / 8) ^ (tr % 8)) << 4)", "(((col % AJ_COLS) / 8) << 4)", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"the softmax's exponent fused with the scale (the maximum's weight not exactly 1)", "fwd_sm80.cuh",
     "aj_mul_rn(s[j][e], scale_log2) - base[e >> 1]", "fmaf(s[j][e], scale_log2, -base[e >> 1])", DType::BF16,
     false, false, 64, false, true, false, false, false, false, KernelConfig{}, false, true},
    {"sm_90a: the softmax's exponent fused with the scale", "fwd_sm80.cuh",
     "aj_mul_rn(s[j][e], scale_log2) - base[e >> 1]", "fmaf(s[j][e], scale_log2, -base[e >> 1])", DType::BF16,
     false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, true},
    {"a row a masked non-finite V reached is not summed again", "fwd_sm80.cuh",
     "    *at(r0, col) = w0;", "    bad[0] = bad[1] = false;\n    *at(r0, col) = w0;",
     DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, true},
    {"sm_90a, TMA: a row a masked non-finite V reached is not summed again", "fwd_sm80.cuh",
     "    if (r0 < item.rows_count) *(aj_u32*)(ob + i0", "    bad[0] = bad[1] = false;\n    if (r0 < item.rows_count) *(aj_u32*)(ob + i0",
     DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, true},
    {"the non-finite test looks at the low half of each stored word only", "common.cuh",
     "(w & AJ_HALF_EXP) == AJ_HALF_EXP || (w & (AJ_HALF_EXP << 16)) == (AJ_HALF_EXP << 16)", "(w & AJ_HALF_EXP) == AJ_HALF_EXP",
     DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, true},
    {"the exact sum weighs the keys a row masks too", "fwd_sm80.cuh", "att[h] = want[h] && (t.full || ", "att[h] = want[h] && (true || ",
     DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, true},
    {"the exact sum reads the row below the thread's", "fwd_sm80.cuh", "(aj_i64)(want[h] ? r0 + 8 * h : 0)",
     "(aj_i64)(want[h] ? r0 + 8 * h + 1 : 0)", DType::BF16, false, false, 64, false, true, false, false, false, false,
     KernelConfig{}, true},
    {"SIMT: a masked key weighted by P = 0 instead of skipped", "fwd_simt.cuh", "      if (s[c] == AJ_NEG_INF) continue;\n", "\n",
     DType::F32, false, false, 64, false, true, false, false, false, false, KernelConfig{}, true},
    {"backward, dQ: a masked pair's dS multiplied by P = 0 instead of selected", "bwd_sm80.cuh",
     "s[j][e] = ok ? pr * (f * dp[j][e] - (e < 2 ? delta0 : delta1)) : 0.0f;",
     "s[j][e] = (ok ? pr : 0.0f) * (f * dp[j][e] - (e < 2 ? delta0 : delta1));", DType::BF16, true, true, 64, false, true,
     false, false, false, false, KernelConfig{}, false, false, 'v'},
    {"backward: a key row that a masked non-finite Q or dO reached is not summed again", "bwd_sm80.cuh",
     "    if (bad) {\n      aj_bwd_exact_key_row(", "    if (false) {\n      aj_bwd_exact_key_row(", DType::BF16, true, false, 64,
     false, true, false, false, false, false, KernelConfig{}, false, false, 'q'},
    {"backward: the exact key-row sum weighs the queries that mask the key too", "bwd_sm80.cuh",
     "        if (!full && !aj_queries_allowed(p, qe.branch, qe.head, kpos, q_origin + qe.rows_start, (aj_cs)r",
     "        if (false && !aj_queries_allowed(p, qe.branch, qe.head, kpos, q_origin + qe.rows_start, (aj_cs)r", DType::BF16, true,
     false, 64, false, true, false, false, false, false, KernelConfig{}, false, false, 'q'},
    {"backward, single pass: a dQ block that a masked non-finite K reached is not summed again", "bwd_sm80.cuh",
     "if (masked_kbad && aj_bwd_any_nonfinite(acc))", "if (false && aj_bwd_any_nonfinite(acc))", DType::BF16, true, false, 64, false,
     true, false, false, false, false, KernelConfig{}, false, false, 'k'},
    {"backward, single pass: the key tile's test looks at the first row only", "bwd_sm80.cuh",
     "for (int x = lane; x < AJ_TILE_K * WORDS; x += 32)", "for (int x = lane; x < WORDS; x += 32)", DType::BF16, true, false, 64,
     false, true, false, false, false, false, KernelConfig{}, false, false, 'k'},
    {"backward, single pass: the exact dQ block weighs the pairs that mask the key too", "bwd_sm80.cuh",
     "(aj_cs)(q0 + r) * (aj_cs)qe.rows_stride))", "(aj_cs)(q0 + r) * (aj_cs)qe.rows_stride) && false)", DType::BF16, true, false,
     64, false, true, false, false, false, false, KernelConfig{}, false, false, 'k'},
    {"backward, two-pass dQ: a row that a masked non-finite K reached is not stored again", "bwd_sm80.cuh",
     "  if (const int redo = redo_rows(bad)) {", "  if (const int redo = 0 * redo_rows(bad)) {", DType::BF16, true, true, 64, false, true,
     false, false, false, false, KernelConfig{}, false, false, 'k'},
    {"sm_90a backward: dS read by the dQ wgmma without the barrier after its stores", "bwd_sm90.cuh",
     "        aj_fence_proxy_async();  // dS's generic stores, then the wgmma that reads them\n        aj_syncthreads();\n",
     "        aj_fence_proxy_async();  // dS's generic stores, then the wgmma that reads them\n", DType::BF16, true, false, 64, true, false},
    {"sm_90a backward: dS read by the dQ wgmma without the proxy fence after its stores", "bwd_sm90.cuh",
     "        aj_fence_proxy_async();  // dS's generic stores, then the wgmma that reads them\n", "\n", DType::BF16, true, false,
     64, true, false},
    {"sm_90a backward: the next query tile's loads overwrite a stage the wgmmas may still read (no wait)", "bwd_sm90.cuh",
     "      aj_wgmma_wait<0>();\n    }\n    aj_syncthreads();", "    }\n    aj_syncthreads();", DType::BF16, true, true, 64, true, false},
    {"sm_90a backward: dK's B operand read K-major (Q's leading offset of the S^T product)", "bwd_sm90.cuh",
     "dsa[kk],\n                                               q_n + ", "dsa[kk],\n                                               q_b + ",
     DType::BF16, true, false, 128, true, false},
    {"sm_90a backward, head dim 128: every query sub-block's S^T reads Q's first rows", "bwd_sm90.cuh",
     "q_b + (((ks / 4) * AJ_TILE_Q * AJ_SW + c0 * AJ_SW + (ks % 4) * 32) >> 4), ks > 0);",
     "q_b + (((ks / 4) * AJ_TILE_Q * AJ_SW + (ks % 4) * 32) >> 4), ks > 0);",
     DType::BF16, true, false, 128, true, false},
    {"sm_90a backward: every dQ column block reads K's first", "bwd_sm90.cuh",
     "k_b + (((c0 / AJ_COLS) * AJ_TILE_K * AJ_SW + ks * 16 * AJ_SW) >> 4)", "k_b + ((ks * 16 * AJ_SW) >> 4)", DType::BF16,
     true, false, 128, true, false},
    {"sm_90a backward: dS of key rows past the tile's count not zeroed", "bwd_sm90.cuh",
     "    if (kr0 >= ki.keys_count) {", "    if (false) {", DType::BF16, true, false, 64, true, false, true},
    {"sm_90a backward: the key tile's NaN test skipped", "bwd_sm90.cuh", "      kbad = aj_warp_any(bad);", "      kbad = false;",
     DType::BF16, true, false, 64, true, false, false, false, false, false, KernelConfig{}, false, false, 'k'},
    {"sm_90a backward: the exact dQ block weighs the pairs that mask the key too", "bwd_sm90.cuh",
     "        if (!aj_queries_allowed(p, qe.branch, qe.head, kpos, q_origin, (aj_cs)r * (aj_cs)qe.rows_stride)) continue;",
     "", DType::BF16, true, false, 64, true, false, false, false, false, false, KernelConfig{}, false, false, 'k'},
    {"sm_90a backward: a masked pair's P^T not selected", "bwd_sm80.cuh",
     "      s[j][x] = ok ? aj_ex2(aj_mul_rn(s[j][x], p.scale_log2) - lse2[col]) : -0.0f;",
     "      s[j][x] = aj_ex2(aj_mul_rn(s[j][x], p.scale_log2) - lse2[col]);", DType::BF16,
     true, false, 64, true},
    {"sm_90a TMA backward: dQ read dS without the consumers' barrier after its stores", "bwd_sm90_tma.cuh",
     "    aj_named_sync(1, AJ_BWDT_CONSUMERS);", "", DType::BF16, true, false, 128, true},
    {"sm_90a TMA backward, head dim 64: dQ read dS without the consumers' barrier after its stores", "bwd_sm90_tma.cuh",
     "    aj_named_sync(1, AJ_BWDT_CONSUMERS);", "", DType::BF16, true, false, 64, true},
    {"sm_90a TMA backward: a stage released before the wgmmas that read it are waited for", "bwd_sm90_tma.cuh",
     "      aj_wgmma_wait<0>();\n    }\n    aj_mbarrier_arrive(&sh.empty[stage]);", "    }\n    aj_mbarrier_arrive(&sh.empty[stage]);",
     DType::BF16, true, true, 64, true},
    {"sm_90a backward: P^T's exponentials read S^T before its wait", "bwd_sm90.cuh", "  aj_wgmma_wait<1>();\n  if (full) {",
     "  if (full) {", DType::BF16, true, false, 64, true},
    {"sm_90a backward: dS^T's stmatrix rows take the other half of the warp's keys", "bwd_sm90.cuh",
     "kr0 - lane / 4 + (m & 1) * 8)", "kr0 - lane / 4 + (m >> 1) * 8)", DType::BF16, true, false, 128, true},
    {"sm_90a backward: dS^T's stmatrix rows take the sub-block's other query columns", "bwd_sm90.cuh",
     "c0 + (m >> 1) * 8 + lane % 8", "c0 + (m & 1) * 8 + lane % 8", DType::BF16, true, false, 64, true, false},
    {"sm_90a TMA backward: a masked pair's dS^T not selected (a NaN in V at a masked key)", "bwd_sm80.cuh",
     "      s[j][x] = masked ? 0.0f : pr * (f * dp[j][x] - delta[col]);", "      s[j][x] = pr * (f * dp[j][x] - delta[col]);",
     DType::BF16, true, false, 64, true, true, false, false, false, false, KernelConfig{}, true},
    {"sm_90a TMA backward: the producer refills a stage without waiting for its release", "bwd_sm90_tma.cuh",
     "    if (use > 0) aj_mbarrier_wait(&sh.empty[s], (aj_u32)((use - 1) & 1));", "", DType::BF16, true, false, 64, true},
    {"sm_90a TMA backward: the second warpgroup takes the first one's key rows", "bwd_sm90_tma.cuh",
     "const int kr0 = wg * 64 + warp * 16 + g", "const int kr0 = warp * 16 + g", DType::BF16, true, false, 64, true},
    {"sm_90a TMA backward: the second warpgroup's S^T and dP^T read the first one's K and V rows", "bwd_sm90_tma.cuh",
     "aj_smem_addr(sh.k + wg * 64 * AJ_SW), 16", "aj_smem_addr(sh.k), 16", DType::BF16, true, false, 64, true},
    {"sm_90a TMA backward, head dim 64: both warpgroups' dQ over the first one's keys", "bwd_sm90_tma.cuh",
     "AJ_BWDT_DQ_BY_COLUMNS ? 0 : wg * 64", "0", DType::BF16, true, false, 64, true},
    {"sm_90a TMA backward, head dim 128: both warpgroups' dQ in the first column block", "bwd_sm90_tma.cuh",
     "AJ_BWDT_DQ_BY_COLUMNS ? wg * AJ_COLS : 0", "0", DType::BF16, true, false, 128, true},
    {"sm_90a TMA backward: the next entry's statistics written over this entry's", "bwd_sm90_tma.cuh",
     "(wg == 0 ? sh.lse2(buf ^ 1) : sh.delta(buf ^ 1))", "(wg == 0 ? sh.lse2(buf) : sh.delta(buf))", DType::BF16, true, false, 64,
     true},
    {"sm_90a TMA backward: dQ's exact block sums over the other warpgroup's keys", "bwd_sm90_tma.cuh",
     "dq_c0, dq_k0, dq_k0 + DQ_KEYS < ki.keys_count", "dq_c0, 64 - dq_k0, dq_k0 + DQ_KEYS < ki.keys_count", DType::BF16, true,
     false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 'k'},
    {"sm_90a TMA backward: the query tiles' maps take the key stride's rows per box", "fwd_sm90_tma.cuh",
     "      for (int r0 = 0; r0 < ROWS; r0 += rows)\n        box5(", "      for (int r0 = 0; r0 < ROWS; r0 += 2 * rows)\n        box5(",
     DType::BF16, true, false, 64, true, true, false, false, false, true},
    {"sm_90a TMA backward: dQ's staging rows rewritten before the last entry's bulk reduce read them", "bwd_sm90_tma.cuh",
     "      if (lt < AJ_TILE_Q) aj_bulk_wait_read<0>();\n", "", DType::BF16, true, false, 64, true},
    {"sm_90a TMA backward: the bulk reduce reads dQ's staging rows with no proxy fence after their stores", "bwd_sm90_tma.cuh",
     "      aj_fence_proxy_async();  // the generic stores, then the bulk copies that read them\n", "", DType::BF16, true, false, 64,
     true},
    {"sm_90a TMA backward: a row's bulk reduce issued before the warpgroup has written the block", "bwd_sm90_tma.cuh",
     "the bulk copies that read them\n      aj_named_sync(2 + wg, 128);\n", "the bulk copies that read them\n", DType::BF16, true,
     false, 64, true},
    {"sm_90a TMA backward: the entry after next read one entry early", "bwd_sm90_tma.cuh",
     "qe_far = bp.query_entries[e + 2];", "qe_far = bp.query_entries[e + 1];", DType::BF16, true, false, 64, true},
    {"sm_90a TMA backward: the next entry's rows past its count take a row's LSE, not +inf", "bwd_sm90_tma.cuh",
     "aj_bwdt_stat_finish(next_raw, tid % 128 < qe_next.rows_count, wg)", "aj_bwdt_stat_finish(next_raw, true, wg)", DType::BF16, true,
     false, 64, true, true, true},
    {"sm_90a TMA backward: dQ's staging pairs stored two columns late", "bwd_sm90_tma.cuh", "aj_st_f32x2(row + n * 8,",
     "aj_st_f32x2(row + n * 8 + 2,", DType::BF16, true, false, 128, true},
    {"sm_90a TMA backward: bulk reduces of the rows past the entry's count", "bwd_sm90_tma.cuh", "      if (lt < qe.rows_count) {",
     "      if (lt < AJ_TILE_Q) {", DType::BF16, true, false, 64, true},
    {"persistent TMA backward: the consumers' entry count restarting at each item", "bwd_sm90_tma.cuh",
     "    it = aj_bwdt_consume(bp, sh, ki, b, it, tid);", "    aj_bwdt_consume(bp, sh, ki, b, 0, tid);", DType::BF16, true, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"persistent TMA backward: the producer's entry count restarting at each item", "bwd_sm90_tma.cuh",
     "it = aj_bwdt_produce(maps, sh, bp, ki, u % bp.batch, it);", "aj_bwdt_produce(maps, sh, bp, ki, u % bp.batch, 0);", DType::BF16, true, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"persistent TMA backward: K and V overwritten before every consumer is done with the last item's", "bwd_sm90_tma.cuh",
     "    aj_named_sync(AJ_BWDT_ITEM_BARRIER, AJ_BWDT_CONSUMERS);  // every consumer is done", "    // every consumer is done", DType::BF16, true, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"persistent TMA backward: an item's K and V read before every consumer's copies have landed", "bwd_sm90_tma.cuh",
     "    aj_bwdt_load_item(bp, sh, ki, b, it & 1, tid);\n    aj_named_sync(AJ_BWDT_ITEM_BARRIER, AJ_BWDT_CONSUMERS);\n",
     "    aj_bwdt_load_item(bp, sh, ki, b, it & 1, tid);\n", DType::BF16, true, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"persistent TMA backward: an item's first statistics in the first buffer whatever the entry count", "bwd_sm90_tma.cuh",
     "aj_bwdt_load_item(bp, sh, ki, b, it & 1, tid);", "aj_bwdt_load_item(bp, sh, ki, b, 0, tid);", DType::BF16, true, false, 64, true, true, false, false, false, true, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"persistent TMA backward: every block's units stepped by twice the grid", "bwd_sm90_tma.cuh",
     "for (aj_i64 u = first; u < end; u += step) {\n        const AjKeyItem ki", "for (aj_i64 u = first; u < end; u += 2 * step) {\n        const AjKeyItem ki",
     DType::BF16, true, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, false, 1},
    {"sm_90a dQ kernel: warpgroup 1's sums not added to warpgroup 0's", "bwd_sm90_dq.cuh", "dq[j][e] += part[",
     "dq[j][e] += 0.0f * part[", DType::BF16, true, true, 64, true, true},
    {"sm_90a dQ kernel: warpgroup 1's sums read before the barrier after their stores", "bwd_sm90_dq.cuh",
     "  aj_syncthreads();\n  if (wg == 1) return;", "  if (wg == 1) return;", DType::BF16, true, true, 64, true, false},
    {"sm_90a dQ kernel, head dim 128: both warpgroups over the first half of each tile's keys", "bwd_sm90_dq.cuh",
     "const int c0 = wg * AJ_BWDQ_KEYS;", "const int c0 = 0;", DType::BF16, true, true, 128, true, true},
    {"sm_90a dQ kernel: dQ's B operand (K) read K-major", "bwd_sm90_dq.cuh", "aj_wgmma_rs<AJ_HEAD_DIM, AJ_WGMMA_TYPE, 1>",
     "aj_wgmma_rs<AJ_HEAD_DIM, AJ_WGMMA_TYPE, 0>", DType::BF16, true, true, 64, true, true},
    {"sm_90a dQ kernel: a stage reloaded while dQ's wgmma may still read its K (no wait)", "bwd_sm90_dq.cuh",
     "      aj_wgmma_wait<0>();  // K's stage is read", "      // K's stage is read", DType::BF16, true, true, 64, true, false},
    {"sm_90a dQ kernel: warpgroup 1's dP reads warpgroup 0's V rows", "bwd_sm90_dq.cuh", "aj_smem_addr(sh.v + c0 * AJ_SW)",
     "aj_smem_addr(sh.v)", DType::BF16, true, true, 64, true, true},
    {"sm_90a dQ kernel: S and dP read before their wgmmas are waited for", "bwd_sm90_dq.cuh",
     "        aj_wgmma_wait<0>();  // S and dP, and the previous", "        // S and dP, and the previous",
     DType::BF16, true, true, 64, true, true},
    {"sm_90a dQ kernel, head dim 128: every sub-block's S over the first sub-block's keys", "bwd_sm90_dq.cuh",
     "kd + (((ks / 4) * AJ_TILE_K * AJ_SW + sb * AJ_SW + (ks % 4) * 32) >> 4)", "kd + (((ks / 4) * AJ_TILE_K * AJ_SW + (ks % 4) * 32) >> 4)",
     DType::BF16, true, true, 128, true, true},
    {"sm_90a dQ kernel, head dim 128: every sub-block's dS times the first sub-block's K rows", "bwd_sm90_dq.cuh",
     "kn + (((sb + kk * 16) * AJ_SW) >> 4)", "kn + (((kk * 16) * AJ_SW) >> 4)", DType::BF16, true, true, 128, true, true},
    {"sm_90a dQ kernel: a tile's copies read by wgmma without the proxy fence", "bwd_sm90_dq.cuh",
     "    aj_fence_proxy_async();  // the copies this thread waited for", "    // the copies this thread waited for", DType::BF16, true,
     true, 64, true, true},
    {"sm_90a TMA backward: threads exit with their last bulk reduce not waited for", "bwd_sm90_tma.cuh",
     "  if (bp.dq_acc != nullptr && tid % 128 < AJ_TILE_Q) aj_bulk_wait<0>();", "", DType::BF16, true, false, 64, true},
    {"backward: _cvt converts the untouched fp32 workspaces over the dK and dV _dkdv stored", "bwd_common.cuh",
     " + (bp.plain_add == 2 ? n_dk + rows * AJ_HEAD_DIM_V : 0);", ";", DType::BF16, true, false, 64, false, true, false, false, false,
     false, KernelConfig{}, false, false, 0, true},
    {"backward: dK and dV stored with dK's row for both of a thread's key rows", "bwd_sm80.cuh",
     "    const aj_i64 j = ki.keys_start + (aj_i64)kr * ki.keys_stride;\n    float* dka",
     "    const aj_i64 j = ki.keys_start + (aj_i64)kr0 * ki.keys_stride;\n    float* dka", DType::BF16, true, false, 64, false, true,
     false, false, false, false, KernelConfig{}, false, false, 0, true},
    {"sm_90a TMA backward: dK and dV stored with dK's row for both of a thread's key rows", "bwd_sm80.cuh",
     "    const aj_i64 j = ki.keys_start + (aj_i64)kr * ki.keys_stride;\n    float* dka",
     "    const aj_i64 j = ki.keys_start + (aj_i64)kr0 * ki.keys_stride;\n    float* dka", DType::BF16, true, false, 128, true, true,
     false, false, false, false, KernelConfig{}, false, false, 0, true},
    {"backward, SIMT: dV stored into dK's place", "bwd_simt.cuh",
     "    for (int x = 0; x < AJ_VD; ++x) aj_store(dvs + lane + AJ_SIMT_LANES * x, dv[x]);",
     "    for (int x = 0; x < AJ_VD; ++x) aj_store(dks + lane + AJ_SIMT_LANES * x, dv[x]);", DType::F32, true, false, 64, false,
     true, false, false, false, false, KernelConfig{}, false, false, 0, true},
    {"lazy rescale: O never rescaled", "fwd_sm80.cuh", "  if (c[0] == 1.0f && c[1] == 1.0f) return;", "  return;", DType::BF16, false,
     false, 64, false, true, false, false, false, false, KernelConfig{}, false, true, 0, false, true},
    {"sm_90a, TMA, lazy rescale: O never rescaled", "fwd_sm80.cuh", "  if (c[0] == 1.0f && c[1] == 1.0f) return;", "  return;",
     DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, true, 0, false, true},
    {"lazy rescale: the maximum set by the first tile only", "fwd_sm80.cuh", "mx[h] > m[h] + AJ_LAZY_RESCALE ? mx[h] : m[h]",
     "m[h] == AJ_NEG_INF ? mx[h] : m[h]", DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, false,
     true, 0, false, true},
    {"FMA-pipe exponentials: 2^n put one binade too high", "blocks/math.cuh", "(aj_float_as_uint(t) << 23)",
     "((aj_float_as_uint(t) + 1u) << 23)", DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{},
     false, false, 0, false, false, true},
    {"sm_90a, TMA, FMA-pipe exponentials: the cubic's linear term dropped", "blocks/math.cuh", ", f, 0.69511571f), f, 1.0f)",
     ", f, 0.0f), f, 1.0f)", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0,
     false, false, true},
    {"backward, two-pass dQ: the exact sum weighs the keys a row masks too", "fwd_sm80.cuh", "att[h] = want[h] && (t.full || ",
     "att[h] = want[h] && (true || ", DType::BF16, true, true, 64, false, true, false, false, false, false, KernelConfig{}, false,
     false, 'k'},
    {"packed plan: a weighted key's P weighted, its row sum not", "fwd_sm80.cuh", "    l[0] = aj_fma(s[j][1], e.y, l[0]), ", "    ", DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, true},
    {"packed plan: the extras read one key late", "fwd_sm80.cuh", "(p.key_extra + t.weight + quad * 2);",
     "(p.key_extra + t.weight + quad * 2 + 2);", DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, true},
    {"packed plan: the tile slot drops the weights' offset", "fwd_sm80.cuh", "    a.w = (aj_u32)t.weight;", "    a.w = 0xFFFFFFFFu;", DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, true},
    {"packed plan: every tile of a span reads the weights of its first", "common.cuh",
     "out.weight = s.weight_begin >= 0 ? s.weight_begin + from : -1;", "out.weight = s.weight_begin;", DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, true},
    {"packed plan, sm_90a TMA: the loop's probabilities unweighted", "fwd_sm90.cuh", "  aj_tc_weigh(s, l, p, t, quad);  // P(j)'s registers",
     "  // P(j)'s registers", DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, true},
    {"packed plan, SIMT: a weighted key counted once", "fwd_simt.cuh", "      pr = aj_fma(pr, aj_key_extra(p, t, c), pr);", "", DType::F32, false, false, 64, false, true, false, false, false, false, KernelConfig{}, false, false, 0, false, false, false, true},
    {"packed plan: the exact sum after a masked non-finite V counts each key once", "fwd_sm80.cuh",
     "        pr[h] = aj_fma(pr[h], extra, pr[h]);", "", DType::BF16, false, false, 64, false, true, false, false, false, false, KernelConfig{}, true, false, 0, false, false, false, true},
};

}  // namespace

TEST_CASE("the unmutated kernels pass the check the mutations must fail", "[emu][mutation]") {
  const auto embedded = std::make_shared<const TemplateSet>(TemplateSet::embedded());
  CHECK(check_kernel(embedded, DType::BF16, true) == "");
  CHECK(check_kernel(embedded, DType::F32, true) == "");
  CHECK(check_kernel(embedded, DType::F32, true, true) == "");
  CHECK(check_kernel(embedded, DType::BF16, true, true) == "");
  CHECK(check_kernel(embedded, DType::BF16, false, false, 128) == "");  // Q over the last V stage
  CHECK(check_kernel(embedded, DType::BF16, true, false, 128) == "");   // the single pass, two row blocks an entry
  CHECK(check_kernel(embedded, DType::BF16, true, false, 64, false, true, true) == "");  // scores far below zero
  CHECK(check_kernel(embedded, DType::BF16, true, true, 64, false, true, true) == "");   // ... in the two-pass form
  CHECK(check_kernel(embedded, DType::BF16, true, false, 64, false, true, false, true) == "");  // a table read in place
  CHECK(check_kernel(embedded, DType::BF16, true, false, 64, false, true, false, false, true) == "");  // random in the kernels
  CHECK(check_kernel(embedded, DType::F32, true, false, 64, false, true, false, false, true) == "");
  for (bool tma : {true, false}) {
    INFO("sm_90a, " << (tma ? "TMA" : "cp.async"));
    CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, tma) == "");   // sm_90a
    CHECK(check_kernel(embedded, DType::BF16, false, false, 128, true, tma) == "");  // sm_90a, two column blocks
    CHECK(check_kernel(embedded, DType::BF16, false, false, 256, true, tma) == "");  // sm_90a, 64-key tiles
  }
  // Dilation 12: the TMA kernel's folded maps.
  CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, true, false, false, false, true) == "");
  // FlashAttention-2's tile at head dim 128: two row groups a warp, Q read from shared memory.
  CHECK(check_kernel(embedded, DType::BF16, false, false, 128, false, true, false, false, false, false, KernelConfig{128, 64, 2, 4}) == "");
  // ... and with its single K and V buffers.
  CHECK(check_kernel(embedded, DType::BF16, false, false, 128, false, true, false, false, false, false, KernelConfig{128, 64, 1, 4}) == "");
  // Past head dim 128 (dK and dV by column slices, two of 128 and uneven ones at 208), with a NaN
  // in Q and dO or in K (in the second slice's columns) that masked pairs must keep from the others.
  for (int d : {256, 208}) {
    INFO("head dim " << d);
    CHECK(check_kernel(embedded, DType::BF16, true, false, d) == "");
  }
  for (char in : {'q', 'k'}) {
    INFO("head dim 256, a NaN in " << in);
    CHECK(check_kernel(embedded, DType::BF16, true, false, 256, false, true, false, false, false, false, {}, false, false, in) == "");
  }
  // A NaN and an inf in V at keys some rows mask (forward and backward), and extreme scores.
  for (const DType dt : {DType::BF16, DType::F32}) {
    INFO("non-finite V, " << to_string(dt));
    CHECK(check_kernel(embedded, dt, true, false, 64, false, true, false, false, false, false, {}, true) == "");
    CHECK(check_kernel(embedded, dt, true, true, 64, false, true, false, false, false, false, {}, true) == "");  // two-pass
    for (const char in : {'q', 'k', 'v'}) {
      INFO("a NaN in " << (in == 'q' ? "Q and dO" : in == 'k' ? "K" : "V"));
      CHECK(check_kernel(embedded, dt, true, false, 64, false, true, false, false, false, false, {}, false, false, in) == "");
      CHECK(check_kernel(embedded, dt, true, true, 64, false, true, false, false, false, false, {}, false, false, in) == "");
    }
  }
  CHECK(check_kernel(embedded, DType::BF16, false, false, 64, false, true, false, false, false, false, {}, false, true) == "");
  CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, true, false, false, false, false, {}, true) == "");
  CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, true, false, false, false, false, {}, false, true) == "");
  // The Hopper backward (wgmma dK/dV, the TMA kernel and the cp.async one): single pass and
  // two-pass form, two column blocks of dQ at head dim 128, non-finite Q, dO and K at masked pairs,
  // scores far below zero.
  for (bool tma : {true, false}) {
    INFO("sm_90a backward, " << (tma ? "TMA" : "cp.async"));
    CHECK(check_kernel(embedded, DType::BF16, true, false, 64, true, tma) == "");
    CHECK(check_kernel(embedded, DType::BF16, true, true, 64, true, tma) == "");
    CHECK(check_kernel(embedded, DType::BF16, true, true, 128, true, tma) == "");  // the two-pass form's dQ kernel at 128
    CHECK(check_kernel(embedded, DType::BF16, true, false, 128, true, tma) == "");
    CHECK(check_kernel(embedded, DType::BF16, true, false, 64, true, tma, true) == "");
    CHECK(check_kernel(embedded, DType::BF16, true, false, 64, true, tma, false, false, false, false, {}, true) == "");  // NaN, inf in V
    for (const char in : {'q', 'k'}) {
      INFO("a NaN in " << (in == 'q' ? "Q and dO" : "K"));
      CHECK(check_kernel(embedded, DType::BF16, true, false, 64, true, tma, false, false, false, false, {}, false, false, in) == "");
      CHECK(check_kernel(embedded, DType::BF16, true, true, 64, true, tma, false, false, false, false, {}, false, false, in) == "");
    }
  }
  // One causal branch: dK and dV stored by _dkdv (every key in one key tile), on every path.
  for (const DType dt : {DType::BF16, DType::F32}) {
    INFO("causal, dK and dV stored directly, " << to_string(dt));
    CHECK(check_kernel(embedded, dt, true, false, 64, false, true, false, false, false, false, {}, false, false, 0, true) == "");
    CHECK(check_kernel(embedded, dt, true, true, 64, false, true, false, false, false, false, {}, false, false, 0, true) == "");
  }
  for (bool tma : {true, false}) {
    INFO("causal, dK and dV stored directly, sm_90a " << (tma ? "TMA" : "cp.async"));
    CHECK(check_kernel(embedded, DType::BF16, true, false, 128, true, tma, false, false, false, false, {}, false, false, 0, true) == "");
  }
  // The lazy rescale, extreme scores (every growth moves the maximum), on the sm_80 and both Hopper
  // forwards.
  for (const auto& [sm90a, tma] : {std::pair<bool, bool>{false, true}, {true, true}, {true, false}}) {
    INFO("lazy rescale, extreme scores, " << (sm90a ? (tma ? "sm_90a TMA" : "sm_90a cp.async") : "sm_80"));
    CHECK(check_kernel(embedded, DType::BF16, false, false, 64, sm90a, tma, false, false, false, false, {}, false, true, 0, false, true) == "");
  }
  // Exponentials on the FMA pipe (with extreme scores, and with the lazy rescale) on the sm_80 and
  // the Hopper TMA forward.
  for (const bool sm90a : {false, true}) {
    INFO("FMA-pipe exponentials, " << (sm90a ? "sm_90a TMA" : "sm_80"));
    CHECK(check_kernel(embedded, DType::BF16, false, false, 64, sm90a, true, false, false, false, false, {}, false, false, 0, false, false, true) == "");
    CHECK(check_kernel(embedded, DType::BF16, false, false, 64, sm90a, true, false, false, false, false, {}, false, true, 0, false, true, true) == "");
  }
  // Dilation 12: the TMA backward's folded query maps.
  CHECK(check_kernel(embedded, DType::BF16, true, false, 64, true, true, false, false, false, true) == "");
  // A packed plan (a causal LongNet): forward and backward on every forward path, and the exact
  // sums after a masked non-finite V with weighted keys.
  for (const auto& [dt, sm90a, tma] : {std::tuple<DType, bool, bool>{DType::BF16, false, true}, {DType::F32, false, true},
                                        {DType::BF16, true, true}, {DType::BF16, true, false}}) {
    INFO("packed plan, " << to_string(dt) << (sm90a ? (tma ? ", sm_90a TMA" : ", sm_90a cp.async") : ""));
    CHECK(check_kernel(embedded, dt, true, false, 64, sm90a, tma, false, false, false, false, {}, false, false, 0, false, false, false,
                       true) == "");
  }
  CHECK(check_kernel(embedded, DType::BF16, false, false, 64, false, true, false, false, false, false, {}, true, false, 0, false, false,
                     false, true) == "");
  // Persistent blocks in the TMA forward: one block for every item, two, three consumer warpgroups.
  for (const int blocks : {1, 2}) {
    INFO("sm_90a TMA, " << blocks << " persistent blocks");
    CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, true, false, false, false, false, {}, false, false, 0, false, false,
                       false, false, blocks) == "");
  }
  CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, true, false, false, false, false, KernelConfig{192, 128, 2}, false,
                     false, 0, false, false, false, false, 2) == "");
  CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, true, false, false, false, false, {}, false, false, 0, true, false,
                     false, false, 1) == "");  // causal: items whose three warpgroups all read Q
  // ... at head dim 128 (two Q buffers; O staged and stored by TMA, by both warpgroups on the causal
  // branch's 128-row items) and 256 (one Q buffer, O stored from registers).
  for (const auto& [d, causal] : {std::pair<int64_t, bool>{128, false}, {128, true}, {256, false}}) {
    INFO("sm_90a TMA, one persistent block, head dim " << d << (causal ? ", causal" : ""));
    CHECK(check_kernel(embedded, DType::BF16, false, false, d, true, true, false, false, false, false, {}, false, false, 0, causal, false,
                       false, false, 1) == "");
  }
  // Persistent blocks in the TMA backward: one block for every key item, two (single pass), two in
  // the deterministic mode (a launch per layer).
  for (const auto& [blocks, deterministic] : {std::pair<int, bool>{1, false}, {2, false}, {2, true}}) {
    INFO("sm_90a TMA backward, " << blocks << " persistent blocks" << (deterministic ? ", deterministic" : ""));
    CHECK(check_kernel(embedded, DType::BF16, true, deterministic, 64, true, true, false, false, false, false, {}, false, false, 0, false,
                       false, false, false, blocks) == "");
  }
  // ... and one block over the folded strides' key items (their query entries: odd counts too).
  CHECK(check_kernel(embedded, DType::BF16, true, false, 64, true, true, false, false, false, true, {}, false, false, 0, false, false, false,
                     false, 1) == "");
  // 192-row tiles: three consumer warpgroups in the TMA kernel, twelve warps in the cp.async one.
  for (bool tma : {true, false}) {
    INFO("sm_90a, 192x128, " << (tma ? "TMA" : "cp.async"));
    CHECK(check_kernel(embedded, DType::BF16, false, false, 64, true, tma, false, false, false, false, KernelConfig{192, 128, 2}) == "");
  }
  // 176-key tiles at head dim 128 (the mutation below breaks them only there).
  for (bool tma : {true, false}) {
    INFO("sm_90a, 128x176, " << (tma ? "TMA" : "cp.async"));
    CHECK(check_kernel(embedded, DType::BF16, false, false, 128, true, tma, false, false, false, false, KernelConfig{128, 176, 2}) == "");
  }
}

TEST_CASE("every deliberately broken kernel fails in the emulator", "[emu][mutation]") {
  // ATTNJIT_MUTATIONS=<text>: only the mutations whose name contains it (while changing a kernel).
  const char* only = std::getenv("ATTNJIT_MUTATIONS");
  if (only && *only) WARN("ATTNJIT_MUTATIONS is set: only the mutations whose name contains \"" << only << "\" run");
  for (const Mutation& m : kMutations) {
    if (only && *only && std::string(m.name).find(only) == std::string::npos) continue;
    INFO("mutation: " << m.name);
    const auto t = testing::mutated_templates(m.file, m.from, m.to);
    REQUIRE(t);  // the template changed: update the mutation
    const std::string outcome =
        check_kernel(t, m.dtype, m.backward, m.deterministic, m.head_dim, m.sm90a, m.tma, m.far_below, m.device_table,
                     m.random_in_kernel, m.folded, m.config, m.nonfinite_v, m.extreme, m.nonfinite_in, m.causal, m.lazy, m.poly,
                     m.packed, m.persistent);
    INFO("outcome: " << outcome);
    CHECK(!outcome.empty());
  }
}

// The kernel ABI is declared once (templates/kernel_abi.h) and its layout checked field by field
// where the kernels' text is compiled: a kernel built from a header whose fields moved does not
// build (here two int fields swapped, the sizes unchanged), and the error names the field.
TEST_CASE("a kernel ABI field moved in the kernels' text fails to build, naming the field", "[emu][mutation]") {
  const auto t = testing::mutated_templates("kernel_abi.h", "  int rows_count;\n  int head;\n", "  int head;\n  int rows_count;\n");
  REQUIRE(t);
  CHECK_THROWS_WITH(check_kernel(t, DType::BF16), Catch::Contains("kernel ABI: AjItem::rows_count moved"));
}
