# `cmake --install`: the shared libattnjit, its public headers, the CLI and a CMake package, so an
# outside project writes find_package(attnjit CONFIG REQUIRED) and links attnjit::attnjit (docs/cpp-api.md,
# "Using attnjit from another CMake project"; tests/install/check_install.sh builds
# examples/consumer/ against it). Included by the top-level CMakeLists.txt after the CLI's target;
# never in the Python build, whose wheel holds the extension alone.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public headers: what <attnjit/attnjit.hpp> includes, and the float64 reference. Each marks its
# declarations exported (#pragma GCC visibility push(default)) and includes the others by paths
# that hold both in the tree and installed. Installed as include/attnjit/attnjit.hpp,
# include/attnjit/reference.hpp and include/attnjit/compiler/<stage>/*.hpp (the source tree's stage
# folders, mirrored).
set(ATTNJIT_PUBLIC_HEADERS include/attnjit/attnjit.hpp include/attnjit/reference.hpp)
set(ATTNJIT_PUBLIC_COMPILER_HEADERS compiler/pattern/pattern.hpp compiler/pattern/spec_json.hpp
    compiler/pattern/mask.hpp compiler/pattern/head_slice.hpp compiler/codegen/codegen.hpp compiler/codegen/templates.hpp
    compiler/support/error.hpp compiler/support/types.hpp)

# The same objects as attnjit_core (the layers', compiled once: position-independent, hidden unless a public
# header says otherwise), so the JSON parser, Eigen and the library's internals never bind to a
# program's own copies. What it links stays private: its headers need the standard library only.
add_library(attnjit_shared SHARED ${ATTNJIT_LAYER_OBJECTS} ${ATTNJIT_CPU_OBJECTS})
target_link_libraries(attnjit_shared PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  target_link_options(attnjit_shared PRIVATE -Wl,--no-undefined)  # a missing dependency fails here, not in a user's link
endif()
target_include_directories(attnjit_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(attnjit_shared INTERFACE cxx_std_20)
# While the major version is 0 a minor release may change the API, so the soname and the
# package's compatibility follow major.minor.
set_target_properties(attnjit_shared PROPERTIES OUTPUT_NAME attnjit EXPORT_NAME attnjit
                      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})

set(ATTNJIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/attnjit)
install(TARGETS attnjit_shared EXPORT attnjitTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS attnjit RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${ATTNJIT_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnjit)
foreach(header IN LISTS ATTNJIT_PUBLIC_COMPILER_HEADERS)
  get_filename_component(header_dir ${header} DIRECTORY)  # compiler/<stage>
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnjit/${header_dir})
endforeach()
# The shipped tuning databases; the library's compiled-in default is still the source tree's
# autotune_db/, so an installed copy is used through ATTNJIT_SHIPPED_DB_DIR (docs/kernels-cache-knobs.md).
install(DIRECTORY ${CMAKE_SOURCE_DIR}/autotune_db/ DESTINATION ${CMAKE_INSTALL_DATADIR}/attnjit/autotune_db
        FILES_MATCHING PATTERN "*.json")
install(EXPORT attnjitTargets NAMESPACE attnjit:: DESTINATION ${ATTNJIT_CMAKE_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/attnjitConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/attnjitConfig.cmake INSTALL_DESTINATION ${ATTNJIT_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/attnjitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/attnjitConfig.cmake ${CMAKE_BINARY_DIR}/attnjitConfigVersion.cmake
        DESTINATION ${ATTNJIT_CMAKE_DIR})
