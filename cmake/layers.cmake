# The library's layers, one CMake object library each, bottom to top (docs/architecture.md):
#
#   support -> pattern -> plan -> codegen -> {nvrtc, cache} -> jit -> tune -> driver
#                                       \-> emulator (beside the JIT: it runs codegen's text on the CPU)
#   runtime (the API and its cpu/, cuda/, emu/ devices) sits on all of them; the CLI (tools/), the
#   Python extension, the tests, benches and examples sit on the runtime.
#
# A layer sees only its own folders and those of the layers below it: its sources compile against
# an include tree of symbolic links (build/layers/<layer>/) that holds exactly those folders, never
# the source root. An #include that points up the pipeline therefore fails to compile, naming the
# header ("compiler/tune/autotune.hpp: No such file or directory"), and tests/layers/ checks that it
# does. Same-folder includes ("pattern.hpp") resolve beside the including file, as always; an
# include through ".." (which would leave the tree through its links) is checked by
# tests/layers/relative_includes.cmake against the same table.

set(ATTNJIT_LAYERS_DIR ${CMAKE_BINARY_DIR}/layers)

# attnjit_layer(NAME <layer> PATHS <folders or files of this layer> DEPENDS <layers below>
#               SOURCES <.cpp files>)
function(attnjit_layer)
  cmake_parse_arguments(L "" "NAME" "PATHS;DEPENDS;SOURCES" ${ARGN})
  set(visible ${L_PATHS})
  foreach(dep IN LISTS L_DEPENDS)
    get_property(dep_visible GLOBAL PROPERTY ATTNJIT_LAYER_VISIBLE_${dep})
    if(NOT dep_visible)
      message(FATAL_ERROR "layer ${L_NAME}: layer ${dep} is not defined yet (define the layers bottom to top)")
    endif()
    list(APPEND visible ${dep_visible})
  endforeach()
  list(REMOVE_DUPLICATES visible)
  set_property(GLOBAL PROPERTY ATTNJIT_LAYER_VISIBLE_${L_NAME} ${visible})

  # For tests/layers/relative_includes.cmake: the layer's own paths and all it may see.
  file(WRITE ${ATTNJIT_LAYERS_DIR}/${L_NAME}.own "${L_PATHS}")
  file(WRITE ${ATTNJIT_LAYERS_DIR}/${L_NAME}.visible "${visible}")
  set_property(GLOBAL APPEND PROPERTY ATTNJIT_LAYER_NAMES ${L_NAME})

  set(tree ${ATTNJIT_LAYERS_DIR}/${L_NAME})
  file(REMOVE_RECURSE ${tree})  # a path dropped from a layer must disappear from its tree
  foreach(path IN LISTS visible)
    get_filename_component(parent ${tree}/${path} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${path} ${tree}/${path} SYMBOLIC)
  endforeach()

  add_library(attnjit_${L_NAME} OBJECT ${L_SOURCES})
  target_include_directories(attnjit_${L_NAME} PRIVATE ${tree})
  foreach(dep IN LISTS L_DEPENDS)
    target_link_libraries(attnjit_${L_NAME} PUBLIC attnjit_${dep})  # usage requirements only
  endforeach()
  set_target_properties(attnjit_${L_NAME} PROPERTIES POSITION_INDEPENDENT_CODE ON
                        CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  set_property(GLOBAL APPEND PROPERTY ATTNJIT_LAYER_TARGETS attnjit_${L_NAME})
endfunction()
