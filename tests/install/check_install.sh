#!/usr/bin/env bash
# What an outside project sees of `cmake --install`: this build installed into a temporary prefix,
# each public header compiled alone, the shared library exporting attnjit's API only, and
# examples/consumer (a CMake project of its own) configured with find_package(attnjit CONFIG), built
# and run against the prefix; the installed CLI runs too.
# Usage: check_install.sh ROOT BUILD_DIR [CXX]
set -euo pipefail
root="$1"
build="$2"
cxx="${3:-c++}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
fail() { echo "check_install: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >/dev/null
lib=$(find "$prefix" -name "libattnjit.so.$version" -type f)
[[ -n "$lib" ]] || fail "no libattnjit.so.$version under $prefix: $(cd "$prefix" && find . -type f)"
for f in bin/attnjit include/attnjit/attnjit.hpp include/attnjit/reference.hpp; do
  [[ -f "$prefix/$f" ]] || fail "$f not installed"
done
config=$(find "$prefix" -name attnjitConfig.cmake)
[[ -n "$config" && -f "$(dirname "$config")/attnjitConfigVersion.cmake" ]] || fail "no CMake package (attnjitConfig.cmake and its version file)"

# Each header on its own, with nothing but the prefix on the include path; each marks its
# declarations exported (cmake/install.cmake).
headers=$(cd "$prefix/include" && find attnjit -name '*.hpp' | sort)
for h in $headers; do
  printf '#include <%s>\n' "$h" | "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I "$prefix/include" -x c++ - \
    || fail "$h does not compile on its own"
  grep -q 'pragma GCC visibility push(default)' "$prefix/include/$h" || fail "$h does not mark its declarations exported"
done

# The library exports attnjit's API and the standard library's instantiations it made, as any C++
# library does; never its JSON parser or Eigen, which would bind to a program's own copies.
exported=$(nm -D --defined-only "$lib" | c++filt | awk '{ $1 = $2 = ""; print substr($0, 3) }')
grep -q '^attnjit::Runtime::prepare(' <<<"$exported" || fail "libattnjit does not export attnjit::Runtime::prepare"
foreign=$(grep -v 'attnjit::\|std::\|__gnu_cxx::' <<<"$exported" | grep -vx '_init\|_fini' || true)
foreign+=$(grep -i 'nlohmann\|eigen' <<<"$exported" || true)
[[ -z "$foreign" ]] || fail "libattnjit exports what is not its API, e.g.: $(head -5 <<<"$foreign")"
# Nothing installed points back into the build tree.
runpaths=$(readelf -d "$lib" "$prefix/bin/attnjit" | grep -E 'R(UN)?PATH' || true)
[[ "$runpaths" != *"$build"* ]] || fail "an installed RUNPATH names the build tree: $runpaths"
# NVRTC is loaded at run time (compiler/nvrtc/nvrtc_library.hpp), never linked.
needed=$(readelf -d "$lib" "$prefix/bin/attnjit" | grep NEEDED)
[[ "$needed" != *nvrtc* ]] || fail "an installed binary links NVRTC: $(grep nvrtc <<<"$needed")"

# The consumer, found through CMAKE_PREFIX_PATH alone.
cmake -S "$root/examples/consumer" -B "$tmp/consumer" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF > "$tmp/configure.log" || { cat "$tmp/configure.log"; fail "configuring examples/consumer failed"; }
grep -qF -- "-- attnjit $version from $prefix/" "$tmp/configure.log" \
  || fail "examples/consumer did not find attnjit $version in $prefix: $(grep -- '-- attnjit' "$tmp/configure.log")"
cmake --build "$tmp/consumer" >/dev/null || { cmake --build "$tmp/consumer"; fail "building examples/consumer failed"; }
export ATTNJIT_CACHE_DIR="$tmp/cache"
"$tmp/consumer/attnjit_consumer" "$root/examples/longnet.json"
"$tmp/consumer/attnjit_consumer" "$root/examples/bigbird.json"
[[ "$("$prefix/bin/attnjit" --version)" == "attnjit $version" ]] || fail "the installed CLI says $("$prefix/bin/attnjit" --version)"
echo "check_install: $(cd "$prefix" && find . -type f | wc -l) files installed; headers: $(echo $headers)"
