"""attnjit: structured sparse attention (LongNet dilated attention, block-sparse layouts, causal and
window masks) compiled to fused kernels.

    import attnjit
    o = attnjit.attention(q, k, v, "examples/longnet.json")       # torch tensors [B, S, H, D]
    layer = attnjit.nn.MultiheadDilatedAttention(512, 8, [2048, 4096], [1, 2])

Importing needs no GPU, no CUDA driver and no PyTorch (numpy arrays work on the CPU); CUDA
tensors run the generated kernels, CPU tensors the plan executor, float64 CPU tensors the exact
float64 reference.
"""
import os as _os

# A wheel carries the shipped tuning databases in attnjit/autotune_db/; the folder compiled into
# the extension is the build's source tree, which an installed package no longer has. Set before
# the extension first reads its knobs; an explicit ATTNJIT_SHIPPED_DB_DIR wins.
_shipped = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "autotune_db")
if not _os.environ.get("ATTNJIT_SHIPPED_DB_DIR") and _os.path.isdir(_shipped):
    _os.environ["ATTNJIT_SHIPPED_DB_DIR"] = _shipped

from ._attnjit import AttnjitError, PatternError  # noqa: E402
from ._pattern import Pattern  # noqa: E402
from ._attention import attention  # noqa: E402
from ._tools import dump, precompile  # noqa: E402
from . import _attnjit  # noqa: E402

__version__ = _attnjit.info()["version"]
__all__ = ["AttnjitError", "PatternError", "Pattern", "attention", "dump", "info", "nn", "precompile"]


def info():
    """The version, the NVRTC version, the kernel cache directory, the shipped tuning databases'
    folder, the CPU executor's instruction set, and the CUDA driver and GPUs seen."""
    return _attnjit.info()


def __getattr__(name):
    # attnjit.nn needs PyTorch: imported on first use, so that `import attnjit` does not.
    if name == "nn":
        import importlib

        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'attnjit' has no attribute {name!r}")
