"""A LongNet attention layer with attnjit: a few training steps on random data.

    python3 examples/python/longnet_layer.py        (after `pip install .`)

CUDA tensors when a GPU is present (bf16), else CPU tensors (fp32, the plan executor)."""
import torch

import attnjit
import attnjit.nn

device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
torch.manual_seed(0)
layer = attnjit.nn.MultiheadDilatedAttention(
    embed_dim=256, num_heads=8, segment_lengths=[256, 512, 1024], dilation_rates=[1, 2, 4], device=device, dtype=dtype)
x = torch.randn(2, 1024, 256, device=device, dtype=dtype)
target = torch.randn_like(x)
opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
for step in range(5):
    opt.zero_grad()
    out, _ = layer(x, x, x, is_causal=True)
    loss = torch.nn.functional.mse_loss(out.float(), target.float())
    loss.backward()
    opt.step()
    print(f"step {step}: loss {loss.item():.4f}")
print("pattern", layer.attention.pattern.hash, layer.attention.pattern.stats(1024, 8))
