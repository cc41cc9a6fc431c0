/* The kernel ABI: the argument blocks and plan tables every generated kernel takes, declared once.
 * The host includes this file (compiler/plan/device_plan.hpp packs the tables and fills the
 * argument blocks) and the code generator embeds it in every kernel's source (after
 * templates/blocks/base.cuh, which defines aj_i64 and aj_u64), so NVRTC, the emulator's host
 * compiler and the host's compiler all read the same declarations. Every field's offset and every
 * size is checked below (NVRTC: the sizes): a reordered or resized field fails to compile on
 * whichever side lays it out differently. C declarations (typedef'd structs of scalars and pointers, no
 * includes) read by three C++ compilers; the includer defines aj_i64 and aj_u64 (64-bit integers). */
#ifndef AJ_KERNEL_ABI_H
#define AJ_KERNEL_ABI_H

/* Mask coordinates (codegen_mask.cpp's 32-bit comparisons): a key's offset from its tile's first
   position, in units of its stride, lies in [0, AJ_CS_LIMIT). */
#define AJ_CS_LIMIT (1 << 30)

/* ---- the forward plan's tables (compiler/plan/device_plan.cpp packs them) and the forward's
   argument block ---------------------------------------------------------------------------- */

typedef struct AjItem {         // one query tile of one head
  aj_i64 rows_start;    // local query rows start + k * rows_stride, k < rows_count
  aj_i64 rows_stride;
  int rows_count;
  int head;
  int span_begin;       // key spans [span_begin, span_end) in AjParams::spans
  int span_end;
} AjItem;

typedef struct AjSpan {         // the keys one branch offers the item, cut into tiles of AJ_TILE_K
  aj_i64 keys_start;
  aj_i64 keys_stride;
  int keys_count;
  int branch;
  int tile_begin, tile_end;    // range form: visited tiles
  int full_begin, full_end;    // range form: tiles needing no mask
  int entry_begin, entry_end;  // list form when entry_begin >= 0: entries[e] = tile << 1 | full
  int weight_begin;            // a packed plan's weighted span (range form): key c's probability
                               // times 1 + AjParams::key_extra[weight_begin + c]; -1: no weights
} AjSpan;

typedef struct AjParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // may be null
  aj_i64 q_batch_stride, q_row_stride, q_head_stride;  // in elements
  aj_i64 k_batch_stride, k_row_stride, k_head_stride;
  aj_i64 v_batch_stride, v_row_stride, v_head_stride;
  aj_i64 o_batch_stride, o_row_stride, o_head_stride;
  aj_i64 lse_batch_stride, lse_head_stride;  // lse[b, h, i] at b*batch + h*head + i
  aj_i64 q_offset, k_offset;                 // global positions of row 0
  int heads_per_kv;                          // heads_q / heads_kv
  int num_items;
  float scale_log2;                          // softmax scale * log2(e): scores live in the exp2 domain
  float output_scale;                        // 1, or 1 / groups under head_groups "mean"
  const AjItem* items;
  const AjSpan* spans;
  const int* entries;
  const aj_i64* dyn_row_offsets;             // dynamic layout CSR (null when the pattern has none)
  const int* dyn_cols;
  aj_i64 dyn_q_blocks;
  int dyn_heads;
  int batch;                                 // blocks past it (in the last slice of grid z) do nothing
  const aj_i64* doc_base;                    // packed documents: where each row's document starts (null: none)
  aj_i64 doc_rows;                           // rows of doc_base
  aj_i64 dyn_entries;                        // entries of dyn_cols (row offsets are clamped to it)
  aj_i64 dyn_k_blocks;                       // key blocks in range (the table check's bound)
  int* dyn_errors;                           // the table check counts problems here (null: no check)
  aj_u64 seek_branches;                      // bit b: branch b's layout is decided here, not by the plan (aj_layout_seek)
  const float* key_extra;                    // a packed plan's key weights less one: the branches beyond the
                                             // first that a key stands for (AjSpan::weight_begin); null: none
  const float* q_descale;                    // FP8 inputs (AJ_DTYPE 3): the factors of (batch b, kv head h) at
  const float* k_descale;                    // b * descale_strides[2 t] + h * descale_strides[2 t + 1], t = 0,
  const float* v_descale;                    // 1, 2 for q, k, v (ForwardOptions::q_descale); null otherwise
  aj_i64 descale_strides[6];
} AjParams;

/* ---- the backward: the key-major plan's tables and the argument block of its kernels -------- */

typedef struct AjKeyItem {      // one key tile of one kv head 
  aj_i64 keys_start, keys_stride;
  int keys_count, kv_head;
  int entry_begin, entry_end;  // AjBwdParams::query_entries
} AjKeyItem;

typedef struct AjQueryEntry {   // one query tile that attends it
  aj_i64 rows_start, rows_stride;
  int rows_count, head, branch, full;
} AjQueryEntry;

typedef struct AjBwdParams {
  AjParams fwd;                           // q, k, v, o, lse (required), their strides, the forward plan
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* delta;                           // [batch, heads_q, seq_q]: D
  float* dk_acc;                          // [batch, seq_k, heads_kv, head_dim], zeroed (or the caller's)
  float* dv_acc;                          // [batch, seq_k, heads_kv, head_dim_v], zeroed (or the caller's)
  float* dq_acc;                          // [batch, seq_q, heads_q, head_dim], zeroed: the single pass's
                                          // dQ (scaled), added by _dkdv; null in the two-pass form. In a
                                          // _dq launch: set when dQ is added into it instead of stored
                                          // (Attention::backward_add)
  const float* dlse;                      // the gradient of lse (lse's layout), or null: D -= dlse
  aj_i64 dlse_batch_stride, dlse_head_stride;
  const AjKeyItem* key_items;
  const AjQueryEntry* query_entries;
  aj_i64 do_batch_stride, do_row_stride, do_head_stride;
  aj_i64 dq_batch_stride, dq_row_stride, dq_head_stride;
  aj_i64 dk_batch_stride, dk_row_stride, dk_head_stride;
  aj_i64 dv_batch_stride, dv_row_stride, dv_head_stride;
  aj_i64 batch, seq_q, seq_k;
  int heads_q, heads_kv;
  float scale;                            // softmax scale (fwd.scale_log2 = scale * log2 e)
  int num_key_items;
  int key_item_base;                      // _dkdv: block x runs key_items[key_item_base + x]
  int plain_add;                          // _dkdv: 0 atomic adds into dk_acc/dv_acc; 1 no two blocks of this
                                          // launch share a key row: plain adds; 2 each key row is written by
                                          // one block of the one launch: stored into dk/dv (and _cvt then
                                          // converts dQ alone)
  int key_item_count;                     // _dkdv: the launch's key items (a persistent launch's blocks
                                          // take key_items[key_item_base ..] in turn)
} AjBwdParams;

/* ---- the paged forward (templates/fwd_paged.cuh): queries packed across requests, K and V in a
   paged cache; the tables are the requests' plans concatenated (compiler/plan/paged_plan.hpp) -- */

typedef struct AjPagedParams {
  AjParams fwd;                 // q [total_q, Hq, D] by q_row_stride/q_head_stride; k, v the caches
                                // [num_pages, page_size, Hkv, D]: *_batch_stride is the page stride,
                                // *_row_stride the token stride; o like q; lse [total_q, Hq] by
                                // lse_row_stride and lse_head_stride; the items, spans and entries
  const int* item_request;      // the request of each item
  const int* item_heads;        // heads of each item: heads item.head, item.head + 1, ... of one kv
                                // group, each with the item's rows (rows_count x heads <= AJ_TILE_Q)
  const aj_i64* q_start;        // per request: its first row of q (cu_seqlens_q)
  const aj_i64* q_pos;          // per request: the position of its first query (kv_len - queries)
  const int* block_table;       // [requests, table_stride] page indices
  float* part_o;                // splits > 1: [items, splits, AJ_TILE_Q, head_dim_v] normalised partial O
  float* part_lse;              // splits > 1: [items, splits, AJ_TILE_Q] partial LSE, log2 domain
  aj_i64 table_stride;
  aj_i64 num_pages;
  aj_i64 lse_row_stride;
  int page_size;
  int vec16;                    // 1: every cache row starts 16-byte aligned (rows load 16 bytes at a time)
  const float* k_scale;         // per kv head: K = stored value x k_scale[kv head] (null: 1; fp8 caches)
  const float* v_scale;         // likewise for V
  const int* header;            // {items, splits} of the plan in the tables' workspace: a grid may be
                                // larger (a CUDA graph's, sized to the workspace's capacity), and
                                // blocks past them return
  int* errors;                  // reads of a page outside the cache counted here, and those keys
                                // skipped (null: they read as NaN); with device planning, requests
                                // whose lengths are wrong too
  /* Device planning (_plan, templates/plan_paged.cuh): the step's lengths in device memory, the
     tables above written by one block on the device, so nothing of a step comes from the host. */
  const int* dev_kv_lens;       // per request (null: the host planned this call)
  const int* dev_cu_seqlens_q;  // [requests + 1] (null: one query per request)
  int requests, total_q;
  int cap_items, cap_splits;    // what the workspace holds
  int target_blocks;            // blocks that fill the device (automatic splits aim for them)
  int fixed_splits;             // the call's splits (0: automatic)
} AjPagedParams;

/* ---- the layout, field by field ------------------------------------------------------------ */
#define AJ_ABI_SIZE(T, bytes) static_assert(sizeof(T) == (bytes), "kernel ABI: the size of " #T " changed")
/* NVRTC has no offsetof without headers: there the sizes are checked, and the same text's
   compilation for the emulator (and the host's) checks every field. */
#ifdef __CUDACC_RTC__
#define AJ_ABI_FIELD(T, f, at)
#else
#define AJ_ABI_FIELD(T, f, at) static_assert(__builtin_offsetof(T, f) == (at), "kernel ABI: " #T "::" #f " moved")
#endif
AJ_ABI_SIZE(AjItem, 32);
AJ_ABI_FIELD(AjItem, rows_start, 0);
AJ_ABI_FIELD(AjItem, rows_stride, 8);
AJ_ABI_FIELD(AjItem, rows_count, 16);
AJ_ABI_FIELD(AjItem, head, 20);
AJ_ABI_FIELD(AjItem, span_begin, 24);
AJ_ABI_FIELD(AjItem, span_end, 28);
AJ_ABI_SIZE(AjSpan, 56);
AJ_ABI_FIELD(AjSpan, keys_start, 0);
AJ_ABI_FIELD(AjSpan, keys_stride, 8);
AJ_ABI_FIELD(AjSpan, keys_count, 16);
AJ_ABI_FIELD(AjSpan, branch, 20);
AJ_ABI_FIELD(AjSpan, tile_begin, 24);
AJ_ABI_FIELD(AjSpan, tile_end, 28);
AJ_ABI_FIELD(AjSpan, full_begin, 32);
AJ_ABI_FIELD(AjSpan, full_end, 36);
AJ_ABI_FIELD(AjSpan, entry_begin, 40);
AJ_ABI_FIELD(AjSpan, entry_end, 44);
AJ_ABI_FIELD(AjSpan, weight_begin, 48);
AJ_ABI_SIZE(AjParams, 368);
AJ_ABI_FIELD(AjParams, q, 0);
AJ_ABI_FIELD(AjParams, k, 8);
AJ_ABI_FIELD(AjParams, v, 16);
AJ_ABI_FIELD(AjParams, o, 24);
AJ_ABI_FIELD(AjParams, lse, 32);
AJ_ABI_FIELD(AjParams, q_batch_stride, 40);
AJ_ABI_FIELD(AjParams, q_row_stride, 48);
AJ_ABI_FIELD(AjParams, q_head_stride, 56);
AJ_ABI_FIELD(AjParams, k_batch_stride, 64);
AJ_ABI_FIELD(AjParams, k_row_stride, 72);
AJ_ABI_FIELD(AjParams, k_head_stride, 80);
AJ_ABI_FIELD(AjParams, v_batch_stride, 88);
AJ_ABI_FIELD(AjParams, v_row_stride, 96);
AJ_ABI_FIELD(AjParams, v_head_stride, 104);
AJ_ABI_FIELD(AjParams, o_batch_stride, 112);
AJ_ABI_FIELD(AjParams, o_row_stride, 120);
AJ_ABI_FIELD(AjParams, o_head_stride, 128);
AJ_ABI_FIELD(AjParams, lse_batch_stride, 136);
AJ_ABI_FIELD(AjParams, lse_head_stride, 144);
AJ_ABI_FIELD(AjParams, q_offset, 152);
AJ_ABI_FIELD(AjParams, k_offset, 160);
AJ_ABI_FIELD(AjParams, heads_per_kv, 168);
AJ_ABI_FIELD(AjParams, num_items, 172);
AJ_ABI_FIELD(AjParams, scale_log2, 176);
AJ_ABI_FIELD(AjParams, output_scale, 180);
AJ_ABI_FIELD(AjParams, items, 184);
AJ_ABI_FIELD(AjParams, spans, 192);
AJ_ABI_FIELD(AjParams, entries, 200);
AJ_ABI_FIELD(AjParams, dyn_row_offsets, 208);
AJ_ABI_FIELD(AjParams, dyn_cols, 216);
AJ_ABI_FIELD(AjParams, dyn_q_blocks, 224);
AJ_ABI_FIELD(AjParams, dyn_heads, 232);
AJ_ABI_FIELD(AjParams, batch, 236);
AJ_ABI_FIELD(AjParams, doc_base, 240);
AJ_ABI_FIELD(AjParams, doc_rows, 248);
AJ_ABI_FIELD(AjParams, dyn_entries, 256);
AJ_ABI_FIELD(AjParams, dyn_k_blocks, 264);
AJ_ABI_FIELD(AjParams, dyn_errors, 272);
AJ_ABI_FIELD(AjParams, seek_branches, 280);
AJ_ABI_FIELD(AjParams, key_extra, 288);
AJ_ABI_FIELD(AjParams, q_descale, 296);
AJ_ABI_FIELD(AjParams, k_descale, 304);
AJ_ABI_FIELD(AjParams, v_descale, 312);
AJ_ABI_FIELD(AjParams, descale_strides, 320);
AJ_ABI_SIZE(AjKeyItem, 32);
AJ_ABI_FIELD(AjKeyItem, keys_start, 0);
AJ_ABI_FIELD(AjKeyItem, keys_stride, 8);
AJ_ABI_FIELD(AjKeyItem, keys_count, 16);
AJ_ABI_FIELD(AjKeyItem, kv_head, 20);
AJ_ABI_FIELD(AjKeyItem, entry_begin, 24);
AJ_ABI_FIELD(AjKeyItem, entry_end, 28);
AJ_ABI_SIZE(AjQueryEntry, 32);
AJ_ABI_FIELD(AjQueryEntry, rows_start, 0);
AJ_ABI_FIELD(AjQueryEntry, rows_stride, 8);
AJ_ABI_FIELD(AjQueryEntry, rows_count, 16);
AJ_ABI_FIELD(AjQueryEntry, head, 20);
AJ_ABI_FIELD(AjQueryEntry, branch, 24);
AJ_ABI_FIELD(AjQueryEntry, full, 28);
AJ_ABI_SIZE(AjBwdParams, 624);
AJ_ABI_FIELD(AjBwdParams, fwd, 0);
AJ_ABI_FIELD(AjBwdParams, dout, 368);
AJ_ABI_FIELD(AjBwdParams, dq, 376);
AJ_ABI_FIELD(AjBwdParams, dk, 384);
AJ_ABI_FIELD(AjBwdParams, dv, 392);
AJ_ABI_FIELD(AjBwdParams, delta, 400);
AJ_ABI_FIELD(AjBwdParams, dk_acc, 408);
AJ_ABI_FIELD(AjBwdParams, dv_acc, 416);
AJ_ABI_FIELD(AjBwdParams, dq_acc, 424);
AJ_ABI_FIELD(AjBwdParams, dlse, 432);
AJ_ABI_FIELD(AjBwdParams, dlse_batch_stride, 440);
AJ_ABI_FIELD(AjBwdParams, dlse_head_stride, 448);
AJ_ABI_FIELD(AjBwdParams, key_items, 456);
AJ_ABI_FIELD(AjBwdParams, query_entries, 464);
AJ_ABI_FIELD(AjBwdParams, do_batch_stride, 472);
AJ_ABI_FIELD(AjBwdParams, do_row_stride, 480);
AJ_ABI_FIELD(AjBwdParams, do_head_stride, 488);
AJ_ABI_FIELD(AjBwdParams, dq_batch_stride, 496);
AJ_ABI_FIELD(AjBwdParams, dq_row_stride, 504);
AJ_ABI_FIELD(AjBwdParams, dq_head_stride, 512);
AJ_ABI_FIELD(AjBwdParams, dk_batch_stride, 520);
AJ_ABI_FIELD(AjBwdParams, dk_row_stride, 528);
AJ_ABI_FIELD(AjBwdParams, dk_head_stride, 536);
AJ_ABI_FIELD(AjBwdParams, dv_batch_stride, 544);
AJ_ABI_FIELD(AjBwdParams, dv_row_stride, 552);
AJ_ABI_FIELD(AjBwdParams, dv_head_stride, 560);
AJ_ABI_FIELD(AjBwdParams, batch, 568);
AJ_ABI_FIELD(AjBwdParams, seq_q, 576);
AJ_ABI_FIELD(AjBwdParams, seq_k, 584);
AJ_ABI_FIELD(AjBwdParams, heads_q, 592);
AJ_ABI_FIELD(AjBwdParams, heads_kv, 596);
AJ_ABI_FIELD(AjBwdParams, scale, 600);
AJ_ABI_FIELD(AjBwdParams, num_key_items, 604);
AJ_ABI_FIELD(AjBwdParams, key_item_base, 608);
AJ_ABI_FIELD(AjBwdParams, plain_add, 612);
AJ_ABI_FIELD(AjBwdParams, key_item_count, 616);
AJ_ABI_SIZE(AjPagedParams, 528);
AJ_ABI_FIELD(AjPagedParams, item_request, 368);
AJ_ABI_FIELD(AjPagedParams, item_heads, 376);
AJ_ABI_FIELD(AjPagedParams, q_start, 384);
AJ_ABI_FIELD(AjPagedParams, q_pos, 392);
AJ_ABI_FIELD(AjPagedParams, block_table, 400);
AJ_ABI_FIELD(AjPagedParams, part_o, 408);
AJ_ABI_FIELD(AjPagedParams, part_lse, 416);
AJ_ABI_FIELD(AjPagedParams, table_stride, 424);
AJ_ABI_FIELD(AjPagedParams, num_pages, 432);
AJ_ABI_FIELD(AjPagedParams, lse_row_stride, 440);
AJ_ABI_FIELD(AjPagedParams, page_size, 448);
AJ_ABI_FIELD(AjPagedParams, vec16, 452);
AJ_ABI_FIELD(AjPagedParams, k_scale, 456);
AJ_ABI_FIELD(AjPagedParams, v_scale, 464);
AJ_ABI_FIELD(AjPagedParams, header, 472);
AJ_ABI_FIELD(AjPagedParams, errors, 480);
AJ_ABI_FIELD(AjPagedParams, dev_kv_lens, 488);
AJ_ABI_FIELD(AjPagedParams, dev_cu_seqlens_q, 496);
AJ_ABI_FIELD(AjPagedParams, requests, 504);
AJ_ABI_FIELD(AjPagedParams, total_q, 508);
AJ_ABI_FIELD(AjPagedParams, cap_items, 512);
AJ_ABI_FIELD(AjPagedParams, cap_splits, 516);
AJ_ABI_FIELD(AjPagedParams, target_blocks, 520);
AJ_ABI_FIELD(AjPagedParams, fixed_splits, 524);
#undef AJ_ABI_SIZE
#undef AJ_ABI_FIELD

#endif
