#!/usr/bin/env bash
# Stages the header-only dependencies into .deps/ (git-ignored), a CMake prefix for machines that
# lack the Debian packages and have no network (the GPU machine: tests/device/device_check.sh). The
# project's CMakeLists.txt already puts ${CMAKE_SOURCE_DIR}/.deps first on CMAKE_PREFIX_PATH.
#
#   .deps/include/{nlohmann,CLI,catch2,eigen3}/     the headers, copied from this machine
#   .deps/lib/cmake/{nlohmann_json,CLI11,Catch2,Eigen3}/  package configs written here: INTERFACE IMPORTED
#                                                   targets whose include dir is relative to the
#                                                   config file, so .deps can be moved anywhere
#
# The Debian configs are not copied: they hard-code /usr (Catch2's compares its own path with
# /usr/lib/cmake/Catch2 and imports /usr/lib/libCatch2WithMain.a). Only the version files (no
# paths) and Catch2's Catch.cmake / CatchAddTests.cmake / ParseAndAddCatchTests.cmake (paths
# relative to themselves) are copied. Afterwards the script proves it: no staged CMake file names
# /usr, and a throwaway project configured against a *moved* copy of .deps, with CMake's system
# paths switched off, finds all three packages there and compiles against its headers only.
#
# Usage: scripts/stage_deps.sh [DEST]   (DEST defaults to <repo>/.deps; needs nlohmann-json3-dev,
#        libcli11-dev, catch2 and libeigen3-dev installed: scripts/setup_deps.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/.deps}"
src_inc="${SRC_INCLUDE:-/usr/include}"
json_cfg="${NLOHMANN_CMAKE_DIR:-/usr/share/cmake/nlohmann_json}"
cli_cfg="${CLI11_CMAKE_DIR:-/usr/share/cmake/CLI11}"
catch_cfg="${CATCH2_CMAKE_DIR:-/usr/lib/cmake/Catch2}"
eigen_cfg="${EIGEN3_CMAKE_DIR:-/usr/share/eigen3/cmake}"

die() { echo "stage_deps: $*" >&2; exit 1; }
for d in "$src_inc/nlohmann" "$src_inc/CLI" "$src_inc/catch2" "$src_inc/eigen3/Eigen" "$json_cfg" "$cli_cfg" "$catch_cfg" "$eigen_cfg"; do
  [ -d "$d" ] || die "$d is missing; install the packages first (scripts/setup_deps.sh)"
done
for f in "$catch_cfg/Catch.cmake" "$catch_cfg/CatchAddTests.cmake" "$json_cfg/nlohmann_jsonConfigVersion.cmake" \
         "$cli_cfg/CLI11ConfigVersion.cmake" "$catch_cfg/Catch2ConfigVersion.cmake" "$eigen_cfg/Eigen3ConfigVersion.cmake"; do
  [ -f "$f" ] || die "$f is missing"
done

rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib/cmake/nlohmann_json" "$dest/lib/cmake/CLI11" "$dest/lib/cmake/Catch2" "$dest/lib/cmake/Eigen3"
cp -a "$src_inc/nlohmann" "$src_inc/CLI" "$src_inc/catch2" "$dest/include/"
mkdir -p "$dest/include/eigen3"
cp -a "$src_inc/eigen3/Eigen" "$src_inc/eigen3/signature_of_eigen3_matrix_library" "$dest/include/eigen3/"
cp "$eigen_cfg/Eigen3ConfigVersion.cmake" "$dest/lib/cmake/Eigen3/"
cp "$json_cfg/nlohmann_jsonConfigVersion.cmake" "$dest/lib/cmake/nlohmann_json/"
cp "$cli_cfg/CLI11ConfigVersion.cmake" "$dest/lib/cmake/CLI11/"
cp "$catch_cfg/Catch2ConfigVersion.cmake" "$catch_cfg/Catch.cmake" "$catch_cfg/CatchAddTests.cmake" "$dest/lib/cmake/Catch2/"
[ -f "$catch_cfg/ParseAndAddCatchTests.cmake" ] && cp "$catch_cfg/ParseAndAddCatchTests.cmake" "$dest/lib/cmake/Catch2/"

# write_config PACKAGE TARGET [EXTRA] [SUBDIR]: <dest>/lib/cmake/PACKAGE/PACKAGEConfig.cmake defining
# TARGET, whose include dir is <prefix>/include[/SUBDIR].
write_config() {
  local pkg="$1" target="$2" extra="${3:-}" sub="${4:+/$4}"
  cat > "$dest/lib/cmake/$pkg/${pkg}Config.cmake" <<EOF
# Staged by scripts/stage_deps.sh: header-only $pkg from <this prefix>/include. No absolute paths:
# the prefix is found from this file's own location, so the folder can be moved or carried.
get_filename_component(_attnjit_deps_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET $target)
  add_library($target INTERFACE IMPORTED)
  set_target_properties($target PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "\${_attnjit_deps_prefix}/include$sub"
    INTERFACE_COMPILE_FEATURES "cxx_std_11")
endif()
set(${pkg}_INCLUDE_DIRS "\${_attnjit_deps_prefix}/include$sub")
$extra
unset(_attnjit_deps_prefix)
EOF
}
write_config nlohmann_json nlohmann_json::nlohmann_json
write_config CLI11 CLI11::CLI11
write_config Catch2 Catch2::Catch2 '# include(Catch) finds Catch.cmake and CatchAddTests.cmake next to this file.
list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")'
write_config Eigen3 Eigen3::Eigen "" eigen3
{
  echo "staged by scripts/stage_deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(hostname)"
  dpkg-query -W -f='${Package} ${Version}\n' nlohmann-json3-dev libcli11-dev catch2 libeigen3-dev 2>/dev/null || true
} > "$dest/STAGED.txt"

# ---- proof 1: no staged CMake file hard-codes a system path -------------------------------------
if grep -nE '(^|[^A-Za-z_])/usr(/|[^A-Za-z_]|$)' -r "$dest/lib/cmake"; then
  die "a staged CMake file above names /usr"
fi

# ---- proof 2: a moved copy, system paths off, finds and compiles against .deps only -------------
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -a "$dest" "$work/moved-deps"
mkdir -p "$work/proj"
cat > "$work/proj/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(depcheck CXX)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Catch2 2 REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
include(Catch)
if(NOT COMMAND catch_discover_tests)
  message(FATAL_ERROR "include(Catch) did not define catch_discover_tests")
endif()
foreach(t nlohmann_json::nlohmann_json CLI11::CLI11 Catch2::Catch2 Eigen3::Eigen)
  get_target_property(inc ${t} INTERFACE_INCLUDE_DIRECTORIES)
  message(STATUS "DEPCHECK ${t} include=${inc}")
endforeach()
message(STATUS "DEPCHECK dirs ${nlohmann_json_DIR} ${CLI11_DIR} ${Catch2_DIR} ${Eigen3_DIR}")
add_executable(depcheck main.cpp)
target_link_libraries(depcheck PRIVATE nlohmann_json::nlohmann_json CLI11::CLI11 Catch2::Catch2 Eigen3::Eigen)
EOF
cat > "$work/proj/main.cpp" <<'EOF'
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <Eigen/Core>
TEST_CASE("deps") { CHECK(nlohmann::json::parse("[1]").size() == 1); CLI::App app; CHECK(app.get_name().empty());
                    CHECK((Eigen::Matrix2f::Identity() * 2.0f).sum() == 4.0f); }
EOF
cmake -S "$work/proj" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/moved-deps" \
  -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF -DCMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH=OFF \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
  -DCMAKE_MAKE_PROGRAM="$(command -v make)" -DCMAKE_CXX_COMPILER="$(command -v g++)" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; die "configure failed"; }
found=$(grep DEPCHECK "$work/configure.log")
echo "$found" | sed 's/^-- /stage_deps: /'
if echo "$found" | grep -q '/usr/'; then die "a package resolved outside the moved .deps"; fi
[ "$(echo "$found" | grep -c "$work/moved-deps")" -eq 5 ] || die "not every package resolved inside the moved .deps"
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; die "the check program did not build"; }
"$work/build/depcheck" > /dev/null || die "the check program failed"
# Which headers the compiler actually opened: every dependency header must come from the copy.
g++ -std=c++20 -isystem "$work/moved-deps/include" -isystem "$work/moved-deps/include/eigen3" -M "$work/proj/main.cpp" > "$work/deps.txt"
for h in catch2/catch.hpp CLI/CLI.hpp nlohmann/json.hpp eigen3/Eigen/Core; do
  grep -q "$work/moved-deps/include/$h" "$work/deps.txt" || die "$h did not come from the staged copy"
done
if grep -qE '/usr/include/(nlohmann|CLI|catch2|eigen3)/' "$work/deps.txt"; then die "a system copy of a dependency header was used"; fi
echo "stage_deps: staged $(du -sh "$dest" | cut -f1) into $dest; a moved copy configures and compiles with no system paths"
