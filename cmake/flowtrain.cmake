# Helpers shared by the per-folder CMakeLists.

# flowtrain_library(NAME SOURCES… [DEPS …]): a static library `flowtrain_<NAME>` with the repo
# root on its include path (includes read "models/dit.h"), warnings on, and the shared
# precompiled LibTorch header.
function(flowtrain_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(flowtrain_${name} STATIC ${ARG_SOURCES})
  target_include_directories(flowtrain_${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(flowtrain_${name} PUBLIC ${ARG_DEPS})
  flowtrain_target_defaults(flowtrain_${name})
endfunction()

function(flowtrain_target_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(FLOWTRAIN_PCH)
    # One PCH for every target (reused, not rebuilt): the LibTorch headers dominate compile time.
    if(TARGET flowtrain_pch)
      target_precompile_headers(${target} REUSE_FROM flowtrain_pch)
    endif()
  endif()
endfunction()

# The PCH carrier: an object library that only exists to build the precompiled header once.
if(FLOWTRAIN_PCH AND NOT TARGET flowtrain_pch)
  add_library(flowtrain_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
  target_link_libraries(flowtrain_pch PUBLIC ${TORCH_LIBRARIES})
  target_compile_options(flowtrain_pch PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_precompile_headers(flowtrain_pch PRIVATE
    <ATen/ATen.h> <torch/nn/module.h> <torch/nn/modules/linear.h>
    <string> <vector> <map> <memory> <functional> <stdexcept>)
endif()
