# One layering check (tests/CMakeLists.txt, "layers_*"): a source in layer LAYER that includes
# HEADER, a header of a layer above it, must fail to compile, and fail because the header is not
# in the layer's include tree, not for any other reason.
#   cmake -DCXX=<compiler> -DLAYERS=<build>/layers -DSOURCE_ROOT=<repo> -DLAYER=<layer>
#         -DHEADER=<path of the header, from the repository root> -DWORK=<scratch dir> -P up_include.cmake
foreach(var CXX LAYERS SOURCE_ROOT LAYER HEADER WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "up_include.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXISTS ${SOURCE_ROOT}/${HEADER})
  message(FATAL_ERROR "${HEADER} does not exist in the source tree: the check would pass for the wrong reason")
endif()
if(NOT IS_DIRECTORY ${LAYERS}/${LAYER})
  message(FATAL_ERROR "no include tree for layer '${LAYER}' at ${LAYERS}/${LAYER}")
endif()
file(MAKE_DIRECTORY ${WORK})
string(MAKE_C_IDENTIFIER "${LAYER}_${HEADER}" probe)
set(source ${WORK}/${probe}.cpp)
file(WRITE ${source} "#include \"${HEADER}\"\n")
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${LAYERS}/${LAYER} ${source}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "layer '${LAYER}' can include ${HEADER}, a header of a layer above it")
endif()
string(FIND "${err}" "${HEADER}: No such file" found)
if(found EQUAL -1)
  message(FATAL_ERROR "layer '${LAYER}' including ${HEADER} failed, but not for a missing header:\n${err}")
endif()
message(STATUS "layer '${LAYER}' cannot include ${HEADER}, as it must not")
