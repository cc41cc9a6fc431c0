"""attnjit: structured sparse attention (LongNet dilated attention, block-sparse layouts, causal and
window masks) compiled to fused kernels.

    import attnjit
    o = attnjit.attention(q, k, v, "examples/longnet.json")       # torch tensors [B, S, H, D]
    layer = attnjit.nn.MultiheadDilatedAttention(512, 8, [2048, 4096], [1, 2])

Importing needs no GPU, no CUDA driver and no PyTorch (numpy arrays work on the CPU); CUDA
tensors run the generated kernels, CPU tensors the plan executor, float64 CPU tensors the exact
float64 reference.
"""
from ._attnjit import AttnjitError, PatternError
from ._pattern import Pattern
from ._attention import attention
from ._tools import dump, precompile
from . import _attnjit

__version__ = _attnjit.info()["version"]
__all__ = ["AttnjitError", "PatternError", "Pattern", "attention", "dump", "info", "nn", "precompile"]


def info():
    """The version, the NVRTC version, the kernel cache directory and the CUDA driver and GPUs seen."""
    return _attnjit.info()


def __getattr__(name):
    # attnjit.nn needs PyTorch: imported on first use, so that `import attnjit` does not.
    if name == "nn":
        import importlib

        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'attnjit' has no attribute {name!r}")
