// The NVRTC libraries attnjit compiles with, found and loaded at run time (dlopen), never linked:
// the library, the CLI, the CPU device, the emulator and precompiled kernel caches work without
// any. Several can be present at once (the CUDA toolkit's, PyPI's nvidia-cuda-nvrtc and
// nvidia-cuda-nvrtc-cu12, paths in ATTNJIT_NVRTC); each arch is compiled by the newest one that
// targets it, so CUDA 12's NVRTC serves sm_60, sm_61 and sm_70, which CUDA 13 no longer targets.
//
// ATTNJIT_NVRTC, when set, names exactly the NVRTCs to use: files or folders separated by ':'
// ("none": no NVRTC at all). Otherwise attnjit looks in these places, in this order (the first
// place a version is found in wins a tie):
//   1. places registered by add_nvrtc_search_path() (the Python package registers the lib folders
//      of the nvidia.cu13 and nvidia.cuda_nvrtc packages its interpreter imports)
//   2. CUDA toolkits: $CUDA_HOME, $CUDA_PATH, the toolkit attnjit was built with, /usr/local/cuda,
//      /usr/local/cuda-* (lib64/, lib/, targets/<arch>-linux/lib/)
//   3. Python environments: nvidia/cu13/lib, nvidia/cu12/lib and nvidia/cuda_nvrtc/lib under the
//      site-packages of $VIRTUAL_ENV, $CONDA_PREFIX, the prefixes of the python3 programs on PATH,
//      pyenv's versions, ~/.local, /usr/local and /usr
//   4. the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig): libnvrtc.so.13, .12, libnvrtc.so
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace attnjit {

// The part of NVRTC's C API attnjit calls, resolved from one loaded library. Results are
// nvrtcResult values (0 = NVRTC_SUCCESS); programs are opaque handles.
struct NvrtcApi {
  using Program = void*;
  const char* (*get_error_string)(int result) = nullptr;
  int (*version)(int* major, int* minor) = nullptr;
  int (*get_num_supported_archs)(int* count) = nullptr;
  int (*get_supported_archs)(int* archs) = nullptr;
  int (*create_program)(Program* prog, const char* source, const char* name, int num_headers,
                        const char* const* headers, const char* const* include_names) = nullptr;
  int (*destroy_program)(Program* prog) = nullptr;
  int (*compile_program)(Program prog, int num_options, const char* const* options) = nullptr;
  int (*get_program_log_size)(Program prog, size_t* size) = nullptr;
  int (*get_program_log)(Program prog, char* log) = nullptr;
  int (*get_cubin_size)(Program prog, size_t* size) = nullptr;
  int (*get_cubin)(Program prog, char* cubin) = nullptr;
  int (*get_ptx_size)(Program prog, size_t* size) = nullptr;
  int (*get_ptx)(Program prog, char* ptx) = nullptr;
};

struct NvrtcLibrary {
  std::string path;        // the file loaded (symbolic links resolved)
  std::string found_by;    // the place that found it in this search: "ATTNJIT_NVRTC", "registered", "CUDA toolkit", ...
  std::string version;     // "12.9"
  int major = 0, minor = 0;
  std::vector<int> archs;  // the archs it targets, as nvrtcGetSupportedArchs lists them: 50, 52, ..., 121
  NvrtcApi api;

  bool targets(int arch) const;
  bool newer_than(const NvrtcLibrary& other) const { return major != other.major ? major > other.major : minor > other.minor; }
};

struct NvrtcSearch {
  std::vector<NvrtcLibrary> found;         // newest first; one per version
  std::vector<std::string> skipped;        // "path: why" for files that were not usable (or a version found twice)
  bool disabled = false;                   // ATTNJIT_NVRTC=none
};

// Searches `first` (files or folders, in order; found_by says `first_label`), then, when
// `standard_places` is true, the places 2-4 above. A library is loaded once per process and never
// dlclose()d, so the function pointers in every copy stay valid.
NvrtcSearch search_nvrtc(const std::vector<std::string>& first, const std::string& first_label, bool standard_places);

// The process's search (ATTNJIT_NVRTC's places only when it is set, else the registered and the
// standard places), done on first use and again after add_nvrtc_search_path(). Thread-safe.
NvrtcSearch nvrtc_search();

// The NVRTC that compiles for this arch number (90 for sm_90a): the newest that targets it, or
// nullopt when none found does. After prefer_nvrtc_for_driver(major), the newest whose major
// version is not above `major` comes first where one targets the arch: a CUBIN from a newer major
// NVRTC may not load on an older driver (a newer minor release does: CUDA's minor version
// compatibility). The CUDA device calls it with its driver's major version; 0 turns it off.
std::optional<NvrtcLibrary> nvrtc_for_arch(int arch);
void prefer_nvrtc_for_driver(int major);

// The archs `lib` compiles for in this search: those nvrtc_for_arch() gives it.
std::vector<int> archs_served(const NvrtcSearch& search, const NvrtcLibrary& lib);

// Registers a file or folder to search (place 2 above); the next nvrtc_search() looks again.
void add_nvrtc_search_path(const std::string& path);

// One paragraph for errors: what was found (version, path, archs), or that nothing was, and how
// to get an NVRTC (the toolkit, the PyPI wheels, ATTNJIT_NVRTC).
std::string describe_nvrtc_search(const NvrtcSearch& search);

// "to get one: install the CUDA toolkit, or `pip install ...`": the ways to get an NVRTC.
std::string how_to_get_nvrtc();

// "sm_50, sm_52, ..., sm_121".
std::string arch_list(const std::vector<int>& archs);

}  // namespace attnjit
