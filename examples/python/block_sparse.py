"""Block-sparse attention with attnjit: a layout as a boolean block matrix, and the same pattern
as a spec, checked against dense PyTorch attention with the block mask.

    python3 examples/python/block_sparse.py        (after `pip install .`)"""
import numpy as np
import torch

import attnjit
import attnjit.nn

block, blocks = 64, 8
layout = np.eye(blocks, dtype=bool) | np.eye(blocks, k=-1, dtype=bool)  # each block and its left neighbour
layout[:, 0] = True                                                        # a global first block
attn = attnjit.nn.BlockSparseAttention(layout, block=block)

device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
q, k, v = (torch.randn(1, blocks * block, 4, 64, device=device, dtype=dtype) for _ in range(3))
o = attn(q, k, v)

# The same with PyTorch's dense attention and the expanded mask.
mask = torch.from_numpy(np.kron(layout, np.ones((block, block), dtype=bool))).to(device)
ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       attn_mask=mask).transpose(1, 2)
err = (o.float() - ref.float()).norm() / ref.float().norm()
print(f"density {layout.mean():.3f}, relative error against dense SDPA: {err.item():.2e}")
assert err < 2e-2
