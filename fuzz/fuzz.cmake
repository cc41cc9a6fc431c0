# libFuzzer targets for attnjit's readers (docs/testing.md, "Fuzzing"; scripts/fuzz.sh). Included by the top-level
# CMakeLists.txt only with -DATTNJIT_FUZZ=ON and clang; the normal g++ build never sees them.
# Included rather than added as a subdirectory: the embedded templates are a custom command's output,
# which only targets of the same directory can build.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "ATTNJIT_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh does)")
endif()

set(ATTNJIT_FUZZ_SANITIZERS "address,undefined" CACHE STRING "Sanitizers the fuzz targets run under")
set(ATTNJIT_FUZZ_FLAGS -fsanitize=${ATTNJIT_FUZZ_SANITIZERS} -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer -gline-tables-only -O1)

# The readers and what they link: the compiler's sources (the layers' own lists, ATTNJIT_COMPILER_SOURCES,
# so a new file there is not forgotten here), the .npy reader and the CLI's dynamic-layout reader
# (with the emulator's bank profile, which the CLI's device options switch, and which needs nothing
# else). Instrumented for coverage too (fuzzer-no-link); only the objects a target needs are linked.
add_library(attnjit_fuzz_core STATIC ${ATTNJIT_COMPILER_SOURCES} runtime/npy.cpp ${ATTNJIT_TEMPLATES_CPP} tools/cli_common.cpp
                                     emulator/bank_profile.cpp)
target_include_directories(attnjit_fuzz_core PUBLIC ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(attnjit_fuzz_core PUBLIC nlohmann_json::nlohmann_json CLI11::CLI11 Threads::Threads ${CMAKE_DL_LIBS})
# Nothing fuzzed compiles a kernel, so no NVRTC is ever loaded.
target_compile_definitions(attnjit_fuzz_core PUBLIC ATTNJIT_VERSION="${PROJECT_VERSION}"
                           ATTNJIT_AUTOTUNE_DB_DIR="${CMAKE_SOURCE_DIR}/autotune_db")
target_compile_options(attnjit_fuzz_core PUBLIC ${ATTNJIT_FUZZ_FLAGS} PRIVATE -fsanitize=fuzzer-no-link)

set(ATTNJIT_FUZZ_TARGETS spec npy kernel_cache tuning_db dynamic_layout)
add_custom_target(attnjit_fuzz_all)
foreach(t IN LISTS ATTNJIT_FUZZ_TARGETS)
  add_executable(fuzz_${t} fuzz/fuzz_${t}.cpp)
  target_link_libraries(fuzz_${t} PRIVATE attnjit_fuzz_core)
  target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer,${ATTNJIT_FUZZ_SANITIZERS})
  set_target_properties(fuzz_${t} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
  add_dependencies(attnjit_fuzz_all fuzz_${t})
endforeach()
