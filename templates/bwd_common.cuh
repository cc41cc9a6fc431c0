// What every backward kernel shares, whatever the path: the key-major plan's tables, the argument
// block (AjBwdParams, = KernelBwdParams in compiler/plan/device_plan.hpp) and the two element-wise
// launches of the pass:
//   _pre   D = rowsum(dO * O) - dlse per query row (before the gradient kernels; dlse, the
//          gradient of the lse output, where given);
//   _cvt   the fp32 dK, dV workspaces to dK, dV in the storage type (after them), and in the
//          single pass the fp32 dQ accumulator to dQ.
// The gradient kernels themselves (_dq, _dkdv) are in bwd_simt.cuh and bwd_sm80.cuh.

// AjKeyItem, AjQueryEntry and AjBwdParams are in kernel_abi.h (shared with the host).

#define AJ_LOG2E 1.4426950408889634f
#define AJ_BWD_THREADS 128  // threads of _pre and _cvt blocks

// The natural-log LSE of a row in the exp2 domain; -inf for a row that attends nothing.
__device__ __forceinline__ float aj_bwd_lse2(const AjParams& p, aj_i64 b, int h, aj_i64 i) {
  return p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] * AJ_LOG2E;
}

// Whether a key item's query entry is computed, and whether it is full: the plan's flag, narrowed
// by the layout for a branch the kernel seeks through (the plan then lists every pair of tiles
// the band allows).
__device__ __forceinline__ bool aj_bwd_entry_visit(const AjParams& p, const AjKeyItem& ki, const AjQueryEntry& qe, bool& full) {
  full = qe.full != 0;
#ifdef AJ_KERNEL_SEEK
  if (aj_seeks(p, qe.branch)) {
    const aj_i64 doc = aj_doc_start(p, ki.keys_start);  // a key item lies in one document, as its queries do
    const aj_i64 q_lo = p.q_offset + qe.rows_start - doc, k_lo = p.k_offset + ki.keys_start - doc;
    bool whole;
    const bool any = aj_layout_pair(p, qe.branch, qe.head, q_lo, q_lo + (aj_i64)(qe.rows_count - 1) * qe.rows_stride, k_lo,
                                     k_lo + (aj_i64)(ki.keys_count - 1) * ki.keys_stride, whole);
    full = full && whole;
    return any;
  }
#else
  (void)p; (void)ki;
#endif
  return true;
}

// A key tile that no query tile attends adds nothing to dK, dV: its block returns at once unless
// it is the one writer of its rows (plain_add 2 stores zeros there). One step of ring attention
// then costs the key tiles with work, not the whole chunk.
__device__ __forceinline__ bool aj_bwd_adds_nothing(const AjBwdParams& bp, const AjKeyItem& ki) {
  return ki.entry_begin == ki.entry_end && bp.plain_add != 2;
}

// ---- _pre: D = rowsum(dO * O) --------------------------------------------------------------

__device__ __forceinline__ void aj_bwd_pre(const AjBwdParams& bp) {
  const AjParams& p = bp.fwd;
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const aj_i64 x = (aj_i64)aj_block_idx_x() * AJ_BWD_THREADS + aj_thread_idx();
  if (x >= bp.seq_q * bp.heads_q) return;
  const int h = (int)(x / bp.seq_q);
  const aj_i64 i = x % bp.seq_q;
  const aj_elem* o = (const aj_elem*)p.o + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
  const aj_elem* d = (const aj_elem*)bp.dout + b * bp.do_batch_stride + i * bp.do_row_stride + h * bp.do_head_stride;
  float sum = 0.0f;
  for (int c = 0; c < AJ_HEAD_DIM_V; ++c) sum += aj_load(o + c) * aj_load(d + c);
  // The lse output's gradient: dS = P (f dP - D + dlse), so it joins D.
  // A row that attends nothing (lse -inf) takes none of it, whatever dlse holds there.
  if (bp.dlse && p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] != AJ_NEG_INF)
    sum -= bp.dlse[b * bp.dlse_batch_stride + h * bp.dlse_head_stride + i];
  bp.delta[(b * bp.heads_q + h) * bp.seq_q + i] = sum;
}

// ---- _cvt: the workspaces to dK, dV (and dQ) in the storage type ---------------------------

__device__ __forceinline__ void aj_bwd_cvt(const AjBwdParams& bp) {
  const aj_i64 rows = bp.batch * bp.seq_k * bp.heads_kv;
  const aj_i64 n_dk = rows * AJ_HEAD_DIM;
  // With dK and dV stored by _dkdv (plain_add 2) only dQ is left: the launch covers it alone.
  const aj_i64 x = (aj_i64)aj_block_idx_x() * AJ_BWD_THREADS + aj_thread_idx() + (bp.plain_add == 2 ? n_dk + rows * AJ_HEAD_DIM_V : 0);
  if (x < n_dk) {
    const aj_i64 row = x / AJ_HEAD_DIM, d = x % AJ_HEAD_DIM;
    const aj_i64 b = row / (bp.seq_k * bp.heads_kv), j = row / bp.heads_kv % bp.seq_k, h = row % bp.heads_kv;
    aj_store((aj_elem*)bp.dk + b * bp.dk_batch_stride + j * bp.dk_row_stride + h * bp.dk_head_stride + d, bp.dk_acc[x]);
  } else if (x < n_dk + rows * AJ_HEAD_DIM_V) {
    const aj_i64 y = x - n_dk, row = y / AJ_HEAD_DIM_V, d = y % AJ_HEAD_DIM_V;
    const aj_i64 b = row / (bp.seq_k * bp.heads_kv), j = row / bp.heads_kv % bp.seq_k, h = row % bp.heads_kv;
    aj_store((aj_elem*)bp.dv + b * bp.dv_batch_stride + j * bp.dv_row_stride + h * bp.dv_head_stride + d, bp.dv_acc[y]);
  } else if (bp.dq_acc) {
    const aj_i64 y = x - n_dk - rows * AJ_HEAD_DIM_V, row = y / AJ_HEAD_DIM, d = y % AJ_HEAD_DIM;
    if (row >= bp.batch * bp.seq_q * bp.heads_q) return;
    const aj_i64 b = row / (bp.seq_q * bp.heads_q), i = row / bp.heads_q % bp.seq_q, h = row % bp.heads_q;
    aj_store((aj_elem*)bp.dq + b * bp.dq_batch_stride + i * bp.dq_row_stride + h * bp.dq_head_stride + d, bp.dq_acc[y]);
  }
}
