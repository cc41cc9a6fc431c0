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


def _register_nvrtc_wheels():
    # PyPI's NVRTC wheels (nvidia-cuda-nvrtc: nvidia/cu13/lib; nvidia-cuda-nvrtc-cu12:
    # nvidia/cuda_nvrtc/lib) wherever this interpreter imports them from, virtual environments
    # included; the library searches them next to the CUDA toolkit (compiler/nvrtc/nvrtc_library.hpp).
    import importlib.util

    for package in ("nvidia.cu13", "nvidia.cu12", "nvidia.cuda_nvrtc"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            lib = _os.path.join(folder, "lib")
            if _os.path.isdir(lib):
                _attnjit._add_nvrtc_search_path(lib)


_register_nvrtc_wheels()
__version__ = _attnjit.info()["version"]
__all__ = ["AttnjitError", "PatternError", "Pattern", "attention", "distributed", "dump", "fp8", "info", "nn", "precompile",
           "serving"]


def info():
    """The version, the NVRTCs found (each with its path, what found it, the archs it targets and
    the archs it serves: those no newer one targets), the kernel cache directory, the shipped
    tuning databases' folder, the CPU executor's instruction set, and the CUDA driver and GPUs seen."""
    return _attnjit.info()


def __getattr__(name):
    # attnjit.nn, attnjit.distributed, attnjit.serving and attnjit.fp8 need PyTorch: imported on
    # first use, so that `import attnjit` does not.
    if name in ("nn", "distributed", "serving", "fp8"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'attnjit' has no attribute {name!r}")
