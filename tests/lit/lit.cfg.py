# lit configuration for attnjit's CLI tests (run by the ctest entry "lit", see tests/CMakeLists.txt):
#   python3 lit.py -sv --param attnjit=BUILD/attnjit --param llvm_tools=/usr/lib/llvm-19/bin \
#       --param examples=SRC/examples tests/lit
#
#   errors/    one spec error per file: the input inline (split-file), the JSON pointer and the fix
#   examples/  `attnjit validate` on each file in examples/, one test per example, named after it
#   validate/  canonical form and hash equality, statistics, a missing spec
#   mask/ run/ dynamic/ cli/   the other subcommands, dynamic layout tables, option parsing
#   info.test  versions and driver (passes with and without a GPU)
import os
import sys
import tempfile

import lit.formats

config.name = "attnjit"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.test_source_root = os.path.dirname(__file__)


def required_param(name, example):
    value = lit_config.params.get(name)
    if not value:
        lit_config.fatal("missing --param %s=... (e.g. --param %s=%s); see tests/CMakeLists.txt for how "
                         "ctest runs this suite" % (name, name, example))
    return os.path.abspath(value)


attnjit = required_param("attnjit", "build/attnjit")
llvm_tools = required_param("llvm_tools", "/usr/lib/llvm-19/bin")
examples = required_param("examples", "examples")

if not os.access(attnjit, os.X_OK):
    lit_config.fatal("--param attnjit=%s is not an executable; build it first "
                     "(cmake --build build --target attnjit)" % attnjit)
for tool in ("FileCheck", "not", "split-file"):
    if not os.access(os.path.join(llvm_tools, tool), os.X_OK):
        lit_config.fatal("%s not found in --param llvm_tools=%s; install Debian's llvm-19-tools "
                         "or point llvm_tools at the directory that holds it" % (tool, llvm_tools))
if not os.path.isdir(examples):
    lit_config.fatal("--param examples=%s is not a directory" % examples)

# Tests write only under %t: put those files next to the binary (the build tree), never in the
# source tree, or in a fresh temporary directory if the binary's directory is read-only.
build_dir = os.path.dirname(attnjit)
if os.access(build_dir, os.W_OK):
    config.test_exec_root = os.path.join(build_dir, "lit-output")
else:
    config.test_exec_root = tempfile.mkdtemp(prefix="attnjit-lit-")

# %attnjit_path: the binary's path as a plain argument (readelf), never a command.
config.substitutions.append(("%attnjit_path", attnjit))

# NVRTCs the nvrtc/ tests choose between with ATTNJIT_NVRTC: the CUDA toolkit's (feature
# nvrtc-toolkit) and CUDA 12's from PyPI, nvidia-cuda-nvrtc-cu12 (feature nvrtc12), which
# scripts/setup_deps.sh installs. A test that needs one that is missing is reported UNSUPPORTED.
import glob
import subprocess

toolkit_nvrtc = None
for root in [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]:
    if root and glob.glob(os.path.join(root, "lib64", "libnvrtc.so.*")):
        toolkit_nvrtc = os.path.join(root, "lib64")
        break
if toolkit_nvrtc:
    config.available_features.add("nvrtc-toolkit")
    config.substitutions.append(("%nvrtc_toolkit", toolkit_nvrtc))
found = subprocess.run([sys.executable, "-c", "import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))"],
                       capture_output=True, text=True)
if found.returncode == 0 and glob.glob(os.path.join(found.stdout.strip(), "libnvrtc.so.12")):
    config.available_features.add("nvrtc12")
    config.substitutions.append(("%nvrtc12", found.stdout.strip()))

# %examples first: lit applies substitutions in order. The tool names are replaced only as whole
# words, never inside a path or a longer name (%t/attnjit.npy, attnjit-pattern).
config.substitutions.append(("%examples", examples))
# %python: the interpreter running lit (with numpy), for tests that check .npy outputs.
config.substitutions.append(("%python", sys.executable))
for tool, path in [("attnjit", attnjit)] + [(t, os.path.join(llvm_tools, t)) for t in ("FileCheck", "not", "split-file")]:
    config.substitutions.append((r"(?<![-_./%%\w])%s(?![-_./\w])" % tool, path))

# Some tests are about a machine without a GPU (the errors users see there).
if not os.path.exists("/dev/nvidia0") and not os.path.exists("/dev/nvidiactl"):
    config.available_features.add("no-gpu")

# The tests must not depend on the caller's locale or attnjit settings.
config.environment["LC_ALL"] = "C"
for name in list(config.environment):
    if name.startswith("ATTNJIT_"):
        del config.environment[name]
# Nor on what tuning databases the repository ships (tests that want them name the folder).
config.environment["ATTNJIT_SHIPPED_DB_DIR"] = "none"
config.substitutions.append(("%autotune_db", os.path.join(os.path.dirname(os.path.abspath(examples)), "autotune_db")))
