# Helpers shared by the per-folder CMakeLists.

# flowtrain_library(NAME SOURCES… [DEPS …]): a static library `flowtrain_<NAME>` with the repo
# root on its include path (includes read "models/dit/dit.h"), warnings on, and the shared
# precompiled LibTorch header.
function(flowtrain_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(flowtrain_${name} STATIC ${ARG_SOURCES})
  target_include_directories(flowtrain_${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(flowtrain_${name} PUBLIC ${ARG_DEPS})
  flowtrain_target_defaults(flowtrain_${name})
endfunction()

# flowtrain_optional_dependency(TARGET FOUND LIBRARY DEFINE MISSING): with FOUND true, links
# LIBRARY into TARGET and defines DEFINE=1 for it and its users; otherwise warns with MISSING
# (what will be an error at run time, and the package that provides it).
function(flowtrain_optional_dependency target found library define missing)
  if(found)
    target_link_libraries(${target} PUBLIC ${library})
    target_compile_definitions(${target} PUBLIC ${define}=1)
  else()
    message(WARNING "${missing}")
  endif()
endfunction()

# LibTorch's include directory carries its own fmt 12 headers, which would shadow Debian's fmt 9
# that spdlog 1.10 is built against (spdlog does not compile with fmt 12). A shim directory with
# only a `fmt` link to the system copy goes first on every include path, so all of flowtrain
# sees one fmt (9, linked from libfmt). LibTorch's own compiled fmt lives in another inline
# namespace (fmt::v12), so the two never meet at link time.
get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
list(GET _fmt_includes 0 _fmt_include)
set(FLOWTRAIN_FMT_SHIM ${PROJECT_BINARY_DIR}/fmt-shim)
file(MAKE_DIRECTORY ${FLOWTRAIN_FMT_SHIM})
file(CREATE_LINK ${_fmt_include}/fmt ${FLOWTRAIN_FMT_SHIM}/fmt SYMBOLIC)

function(flowtrain_target_defaults target)
  target_include_directories(${target} SYSTEM BEFORE PRIVATE ${FLOWTRAIN_FMT_SHIM})
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "EXECUTABLE")
    # The torch wheel's libtorch.so / libtorch_cpu.so export their own (older) copy of
    # std::filesystem, and the dynamic linker binds our calls to whichever library comes first
    # in DT_NEEDED order; their copy crashes in fs::remove_all. Naming libstdc++ before any other
    # library (link options precede the libraries on the link line) makes our calls bind to it.
    target_link_options(${target} PRIVATE "LINKER:--no-as-needed" "-lstdc++" "LINKER:--as-needed")
  endif()
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
  target_link_libraries(flowtrain_pch PUBLIC ${TORCH_LIBRARIES} fmt::fmt)
  target_include_directories(flowtrain_pch SYSTEM BEFORE PRIVATE ${FLOWTRAIN_FMT_SHIM})
  target_compile_options(flowtrain_pch PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_precompile_headers(flowtrain_pch PRIVATE
    <ATen/ATen.h> <torch/nn/module.h> <torch/nn/modules/linear.h>
    <string> <vector> <map> <memory> <functional> <stdexcept>)
endif()
