"""Serving a tiny LongNet model from a paged KV cache (attnjit.serving), checked against recomputing
the whole sequence at every step.

Two requests of different prompt lengths share one cache of shuffled 8-token pages. The prompts are
prefilled in one call (several queries per request, cu_seqlens_q), then each step appends the new
token's K/V (append_kv) and decodes one query per request twice: with paged_attention (planned on
the host) and through a GraphWorkspace planned on the device from a lengths tensor updated in place
(on a GPU that run() is what a CUDA graph captures once and replays every step). Every step's
attention output is compared with attnjit.attention over the request's whole sequence so far, and
the greedy tokens with those the recomputation picks.

    PYTHONPATH=build/python python3 examples/python/serve_decode.py
"""
import torch

import attnjit
from attnjit import serving

torch.manual_seed(0)
VOCAB, MODEL, HEADS, KV_HEADS, HEAD_DIM, PAGE = 64, 64, 4, 2, 16, 8
PATTERN = attnjit.Pattern.from_json({
    "attnjit": 1, "causal": True, "combine": "softmax",
    "branches": [{"segment": 8, "dilation": 1}, {"segment": 32, "dilation": 4}, {"segment": 128, "dilation": 16}]})

embed = torch.randn(VOCAB, MODEL) / MODEL ** 0.5
w_q = torch.randn(MODEL, HEADS * HEAD_DIM) / MODEL ** 0.5
w_k = torch.randn(MODEL, KV_HEADS * HEAD_DIM) / MODEL ** 0.5
w_v = torch.randn(MODEL, KV_HEADS * HEAD_DIM) / MODEL ** 0.5
w_o = torch.randn(HEADS * HEAD_DIM, VOCAB) / (HEADS * HEAD_DIM) ** 0.5


def project(tokens):
    x = embed[tokens]
    return (x @ w_q).view(-1, HEADS, HEAD_DIM), (x @ w_k).view(-1, KV_HEADS, HEAD_DIM), (x @ w_v).view(-1, KV_HEADS, HEAD_DIM)


def full_attention(tokens):
    """attnjit.attention over the whole sequence: what each step must reproduce for its last row."""
    q, k, v = project(tokens)
    return attnjit.attention(q[None], k[None], v[None], PATTERN)[0]


prompts = [torch.randint(0, VOCAB, (37,)), torch.randint(0, VOCAB, (5,))]
steps = 24
num_pages = 2 * (-(-(37 + steps) // PAGE)) + 4
k_cache = torch.zeros(num_pages, PAGE, KV_HEADS, HEAD_DIM)
v_cache = torch.zeros(num_pages, PAGE, KV_HEADS, HEAD_DIM)
order = torch.randperm(num_pages).to(torch.int32)  # pages in any order
width = num_pages // 2
block_table = torch.stack([order[:width], order[width:2 * width]])
kv_lens = torch.zeros(2, dtype=torch.int32)

# Prefill: every prompt token's K/V appended, then all prompt queries in one call.
qs, ks, vs = zip(*(project(p) for p in prompts))
cu = torch.tensor([0, len(prompts[0]), len(prompts[0]) + len(prompts[1])])
kv_lens = serving.append_kv(k_cache, v_cache, block_table, kv_lens, torch.cat(ks), torch.cat(vs), cu_seqlens_new=cu)
o = serving.paged_attention(torch.cat(qs), k_cache, v_cache, block_table, kv_lens, PATTERN, cu_seqlens_q=cu)
worst = max(float((o[cu[b]:cu[b + 1]] - full_attention(prompts[b])).abs().max()) for b in range(2))
sequences = [p.tolist() for p in prompts]
last = [o[cu[1] - 1], o[cu[2] - 1]]

# Decode: one token per request per step. The workspace planned on the device reads its lengths
# from `lens` (the same tensor every step, as a replayed graph would) and needs no plan().
lens = kv_lens.clone()
q_step, out = torch.zeros(2, HEADS, HEAD_DIM), torch.zeros(2, HEADS, HEAD_DIM)
capacity = serving.paged_capacity(q_step, k_cache, v_cache, block_table, lens, PATTERN, plan_on_device=True)
graph_ws = serving.GraphWorkspace(q_step, k_cache, v_cache, PATTERN, capacity)
for step in range(steps):
    new = [int(((last[b].reshape(-1)) @ w_o).argmax()) for b in range(2)]
    for b in range(2):
        sequences[b].append(new[b])
    q, k, v = project(torch.tensor(new))
    kv_lens = serving.append_kv(k_cache, v_cache, block_table, kv_lens, k, v)
    o = serving.paged_attention(q, k_cache, v_cache, block_table, kv_lens, PATTERN)
    lens.copy_(kv_lens)
    q_step.copy_(q)
    graph_ws.run(q_step, k_cache, v_cache, block_table, lens, out, plan_on_device=True)
    for b in range(2):
        want = full_attention(torch.tensor(sequences[b]))[-1]
        worst = max(worst, float((o[b] - want).abs().max()), float((out[b] - want).abs().max()))
    last = [o[0], o[1]]

# The recomputation's own greedy choices, token by token, must be the ones served.
for b in range(2):
    seq = sequences[b]
    for t in range(len(prompts[b]), len(seq)):
        recomputed = int((full_attention(torch.tensor(seq[:t]))[-1].reshape(-1) @ w_o).argmax())
        assert recomputed == seq[t], f"request {b}: token {t} served {seq[t]}, recomputation picks {recomputed}"

print(f"served 2 requests x {steps} tokens from {num_pages} pages of {PAGE}; lengths now {kv_lens.tolist()}")
print(f"largest difference from recomputing the whole sequence: {worst:.2e}")
assert worst <= 1e-5, worst
print("ok")
