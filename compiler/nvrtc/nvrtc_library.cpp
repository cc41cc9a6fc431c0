#include "compiler/nvrtc/nvrtc_library.hpp"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <type_traits>

#include "compiler/support/knobs.hpp"

namespace attnjit {
namespace {

namespace fs = std::filesystem;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);  // not a knob: the places other tools define (CUDA_HOME, PATH, ...)
  return v ? v : "";
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(sep, start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;
}

// libnvrtc.so, libnvrtc.so.13, libnvrtc.so.12.9: not the builtins, not the .alt builds.
bool is_nvrtc_file_name(const std::string& name) {
  static const std::regex re(R"(libnvrtc\.so(\.\d+)*)");
  return std::regex_match(name, re);
}

// The candidate files of one place: the file itself, or the NVRTC files in a folder (newest
// soname first, so the plain libnvrtc.so link is the last tried).
std::vector<std::string> nvrtc_files_in(const std::string& place) {
  std::error_code ec;
  if (!fs::is_directory(place, ec)) return {place};
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(place, ec)) {
    if (is_nvrtc_file_name(e.path().filename().string())) files.push_back(e.path().string());
  }
  std::sort(files.rbegin(), files.rend());
  return files;
}

// The CUDA toolkits' library folders.
std::vector<std::string> toolkit_places() {
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (std::string v = env_or_empty(var); !v.empty()) roots.push_back(v);
  }
#ifdef ATTNJIT_CUDA_TOOLKIT_LIB_DIR
  std::vector<std::string> places{ATTNJIT_CUDA_TOOLKIT_LIB_DIR};
#else
  std::vector<std::string> places;
#endif
  roots.push_back("/usr/local/cuda");
  std::vector<std::string> versioned = glob_paths("/usr/local/cuda-*");
  std::sort(versioned.rbegin(), versioned.rend());
  roots.insert(roots.end(), versioned.begin(), versioned.end());
  for (const std::string& root : roots) {
    for (const char* sub : {"/lib64", "/lib", "/targets/x86_64-linux/lib", "/targets/sbsa-linux/lib"}) {
      places.push_back(root + sub);
    }
  }
  return places;
}

// The lib folders of PyPI's NVRTC wheels under the Python environments this process can see.
std::vector<std::string> python_places() {
  std::vector<std::string> prefixes;
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (std::string v = env_or_empty(var); !v.empty()) prefixes.push_back(v);
  }
  for (const std::string& dir : split(env_or_empty("PATH"), ':')) {
    if (!glob_paths(dir + "/python3*").empty()) prefixes.push_back(dir + "/..");
  }
  std::string pyenv = env_or_empty("PYENV_ROOT");
  const std::string home = env_or_empty("HOME");
  if (pyenv.empty() && !home.empty()) pyenv = home + "/.pyenv";
  if (!pyenv.empty()) {
    for (const std::string& v : glob_paths(pyenv + "/versions/*")) prefixes.push_back(v);
  }
  if (!home.empty()) prefixes.push_back(home + "/.local");
  prefixes.push_back("/usr/local");
  prefixes.push_back("/usr");
  std::vector<std::string> places;
  for (const std::string& prefix : prefixes) {
    for (const char* site : {"site-packages", "dist-packages"}) {
      for (const char* package : {"cu13", "cu12", "cuda_nvrtc"}) {
        const auto found = glob_paths(prefix + "/lib/python3*/" + site + "/nvidia/" + package + "/lib");
        places.insert(places.end(), found.begin(), found.end());
      }
    }
  }
  return places;
}

// Every library ever loaded, by resolved path; never freed (the library is never dlclose()d).
struct Loaded {
  std::unique_ptr<NvrtcLibrary> library;  // null when the file was not a usable NVRTC
  std::string why_not;
};

std::mutex& loaded_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, Loaded>& loaded_by_path() {
  static std::map<std::string, Loaded> loaded;
  return loaded;
}

Loaded load_nvrtc(const std::string& path, void* handle) {
  Loaded out;
  auto lib = std::make_unique<NvrtcLibrary>();
  lib->path = path;
  std::string missing;
  auto resolve = [&](auto& fn, const char* symbol) {
    if (void* p = dlsym(handle, symbol)) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    } else {
      missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    }
  };
  NvrtcApi& a = lib->api;
  resolve(a.get_error_string, "nvrtcGetErrorString");
  resolve(a.version, "nvrtcVersion");
  resolve(a.get_num_supported_archs, "nvrtcGetNumSupportedArchs");
  resolve(a.get_supported_archs, "nvrtcGetSupportedArchs");
  resolve(a.create_program, "nvrtcCreateProgram");
  resolve(a.destroy_program, "nvrtcDestroyProgram");
  resolve(a.compile_program, "nvrtcCompileProgram");
  resolve(a.get_program_log_size, "nvrtcGetProgramLogSize");
  resolve(a.get_program_log, "nvrtcGetProgramLog");
  resolve(a.get_cubin_size, "nvrtcGetCUBINSize");
  resolve(a.get_cubin, "nvrtcGetCUBIN");
  resolve(a.get_ptx_size, "nvrtcGetPTXSize");
  resolve(a.get_ptx, "nvrtcGetPTX");
  if (!missing.empty()) {
    out.why_not = "not an NVRTC attnjit can use (CUDA 11.2 or newer); it lacks " + missing;
    return out;
  }
  int count = 0;
  if (a.version(&lib->major, &lib->minor) != 0 || a.get_num_supported_archs(&count) != 0 || count <= 0 ||
      count > 1000) {
    out.why_not = "nvrtcVersion or nvrtcGetNumSupportedArchs failed";
    return out;
  }
  lib->archs.resize(static_cast<size_t>(count));
  if (a.get_supported_archs(lib->archs.data()) != 0) {
    out.why_not = "nvrtcGetSupportedArchs failed";
    return out;
  }
  std::sort(lib->archs.begin(), lib->archs.end());
  lib->version = std::to_string(lib->major) + "." + std::to_string(lib->minor);
  out.library = std::move(lib);
  return out;
}

// Opens `file` (a path, or a bare soname for the dynamic loader's search) once per process.
const Loaded* open_once(const std::string& file, bool by_soname, std::string& resolved) {
  std::error_code ec;
  if (!by_soname) {
    resolved = fs::canonical(file, ec).string();
    if (ec) return nullptr;  // no such file: nothing to report
    if (auto it = loaded_by_path().find(resolved); it != loaded_by_path().end()) return &it->second;
  }
  void* handle = dlopen(by_soname ? file.c_str() : resolved.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    if (by_soname) return nullptr;  // the loader knows no such library
    const char* why = dlerror();
    resolved = resolved.empty() ? file : resolved;
    return &loaded_by_path().emplace(resolved, Loaded{nullptr, std::string("cannot be loaded: ") + (why ? why : "?")}).first->second;
  }
  if (by_soname) {
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name) return nullptr;
    resolved = fs::canonical(map->l_name, ec).string();
    if (ec) resolved = map->l_name;
    if (auto it = loaded_by_path().find(resolved); it != loaded_by_path().end()) return &it->second;
  }
  return &loaded_by_path().emplace(resolved, load_nvrtc(resolved, handle)).first->second;
}

std::vector<std::string>& registered_places() {
  static std::vector<std::string> places;
  return places;
}

}  // namespace

bool NvrtcLibrary::targets(int arch) const { return std::binary_search(archs.begin(), archs.end(), arch); }

NvrtcSearch search_nvrtc(const std::vector<std::string>& first, const std::string& first_label, bool standard_places) {
  struct Place {
    std::string path, label;
    bool by_soname = false;
  };
  std::vector<Place> places;
  for (const std::string& p : first) places.push_back({p, first_label});
  if (standard_places) {
    for (const std::string& p : toolkit_places()) places.push_back({p, "CUDA toolkit"});
    for (const std::string& p : python_places()) places.push_back({p, "Python package"});
    for (const char* soname : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
      places.push_back({soname, "dynamic loader", true});
    }
  }
  NvrtcSearch search;
  std::set<std::string> seen_paths;
  std::map<std::string, std::string> by_version;  // version -> path
  std::lock_guard<std::mutex> lock(loaded_mutex());
  for (size_t p = 0; p < places.size(); ++p) {
    const Place& place = places[p];
    const std::vector<std::string> files = place.by_soname ? std::vector<std::string>{place.path} : nvrtc_files_in(place.path);
    std::error_code ec;
    if (p < first.size() && (files.empty() || !fs::exists(files.front(), ec))) {
      search.skipped.push_back(place.path + ": " + (files.empty() ? "no libnvrtc.so* in this folder" : "no such file or folder"));
      continue;
    }
    for (const std::string& file : files) {
      std::string resolved;
      const Loaded* l = open_once(file, place.by_soname, resolved);
      if (!l || !seen_paths.insert(resolved).second) continue;
      if (!l->library) {
        search.skipped.push_back(resolved + ": " + l->why_not);
        continue;
      }
      const NvrtcLibrary& lib = *l->library;
      if (auto it = by_version.find(lib.version); it != by_version.end()) {
        search.skipped.push_back(resolved + ": NVRTC " + lib.version + " again (using " + it->second + ")");
        continue;
      }
      by_version.emplace(lib.version, lib.path);
      search.found.push_back(lib);
      search.found.back().found_by = place.label;
    }
  }
  std::stable_sort(search.found.begin(), search.found.end(),
                   [](const NvrtcLibrary& a, const NvrtcLibrary& b) { return a.newer_than(b); });
  return search;
}

namespace {

std::mutex& search_mutex() {
  static std::mutex mu;
  return mu;
}

// The process's search, redone when a place is registered.
std::unique_ptr<NvrtcSearch>& current_search() {
  static std::unique_ptr<NvrtcSearch> search;
  return search;
}

}  // namespace

NvrtcSearch nvrtc_search() {
  std::lock_guard<std::mutex> lock(search_mutex());
  std::unique_ptr<NvrtcSearch>& s = current_search();
  if (!s) {
    const std::string knob = knobs().nvrtc;
    if (knob == "none") {
      s = std::make_unique<NvrtcSearch>();
      s->disabled = true;
    } else if (!knob.empty()) {
      s = std::make_unique<NvrtcSearch>(search_nvrtc(split(knob, ':'), "ATTNJIT_NVRTC", false));
    } else {
      s = std::make_unique<NvrtcSearch>(search_nvrtc(registered_places(), "registered", true));
    }
  }
  return *s;
}

namespace {

std::atomic<int>& driver_major() {
  static std::atomic<int> major{0};
  return major;
}

// The NVRTC in `search` that compiles `arch`: the newest that targets it; with a driver known,
// the newest whose major version is not above the driver's, if one targets it.
const NvrtcLibrary* choose(const NvrtcSearch& search, int arch) {
  const int limit = driver_major();
  const NvrtcLibrary* newest = nullptr;
  for (const NvrtcLibrary& lib : search.found) {  // newest first
    if (!lib.targets(arch)) continue;
    if (limit <= 0 || lib.major <= limit) return &lib;
    if (!newest) newest = &lib;
  }
  return newest;
}

}  // namespace

void prefer_nvrtc_for_driver(int major) { driver_major() = major; }

std::optional<NvrtcLibrary> nvrtc_for_arch(int arch) {
  const NvrtcSearch search = nvrtc_search();
  if (const NvrtcLibrary* lib = choose(search, arch)) return *lib;
  return std::nullopt;
}

std::vector<int> archs_served(const NvrtcSearch& search, const NvrtcLibrary& lib) {
  std::vector<int> out;
  for (int arch : lib.archs) {
    const NvrtcLibrary* chosen = choose(search, arch);
    if (chosen && chosen->path == lib.path) out.push_back(arch);
  }
  return out;
}

void add_nvrtc_search_path(const std::string& path) {
  std::lock_guard<std::mutex> lock(search_mutex());
  std::vector<std::string>& places = registered_places();
  if (std::find(places.begin(), places.end(), path) != places.end()) return;
  places.push_back(path);
  current_search().reset();
}

std::string arch_list(const std::vector<int>& archs) {
  std::string out;
  for (int a : archs) out += (out.empty() ? "sm_" : ", sm_") + std::to_string(a);
  return out;
}

std::string describe_nvrtc_search(const NvrtcSearch& search) {
  std::string out;
  if (search.disabled) {
    out = "no NVRTC: ATTNJIT_NVRTC=none turns the search off";
  } else if (search.found.empty()) {
    out = "no NVRTC was found (searched ATTNJIT_NVRTC, CUDA toolkits, Python environments and the dynamic "
          "loader's path)";
  } else {
    out = "NVRTCs found:";
    for (const NvrtcLibrary& lib : search.found) {
      const std::vector<int> served = archs_served(search, lib);
      out += "\n  NVRTC " + lib.version + " at " + lib.path + " (" + lib.found_by + "): compiles for " +
             (served.empty() ? std::string("nothing a newer one does not") : arch_list(served));
    }
  }
  return out + "\n" + how_to_get_nvrtc();
}

std::string how_to_get_nvrtc() {
  return "to get one: install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc` (CUDA 13: sm_75 and newer), "
         "or `pip install nvidia-cuda-nvrtc-cu12` (CUDA 12: also sm_50 to sm_72), or point ATTNJIT_NVRTC at "
         "a libnvrtc.so file or its folder";
}

}  // namespace attnjit
