"""Drop-in replacements for other LongNet implementations' modules: the same constructor and
forward signatures, parameter names (state-dict keys), initialisation and return values, computing
attnjit's LongNet answer. Where a peer departs from LongNet the answer is LongNet's; the departures
are listed, each with an input that shows it, in docs/longnet-compat.md.

- attnjit.compat.torchscale: DilatedAttention (torchscale/component/dilated_attention.py), and
  from_torchscale(module) -> attnjit.nn.MultiheadDilatedAttention with the same weights.
- attnjit.compat.dilated_attention_pytorch: DilatedAttention and MultiheadDilatedAttention
  (dilated-attention-pytorch 0.2.0), and from_dilated_attention_pytorch(module).
"""
from . import dilated_attention_pytorch, torchscale
from .dilated_attention_pytorch import from_dilated_attention_pytorch
from .torchscale import from_torchscale

__all__ = ["torchscale", "dilated_attention_pytorch", "from_torchscale", "from_dilated_attention_pytorch"]
