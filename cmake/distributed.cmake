# ckpt_distributed (ckpt::distributed): <ckpt/distributed.h>, data-parallel training on c10d.
# Needs a LibTorch built with c10d and Gloo (USE_DISTRIBUTED, USE_C10D_GLOO on its torch_cpu
# target, as in the pytorch.org archives, the torch wheel and Debian's libtorch-dev) and Gloo's
# headers, which LibTorch does not ship (Debian: libgloo-dev). NCCL is added where LibTorch's
# torch_cuda has USE_C10D_NCCL and nccl.h is found (the torch wheel's nvidia-nccl package).
# Sets CKPT_HAS_DISTRIBUTED.
set(CKPT_HAS_DISTRIBUTED OFF)
set(_ckpt_c10d_defines "")
if(TARGET torch_cpu)
  get_target_property(_ckpt_c10d_defines torch_cpu INTERFACE_COMPILE_DEFINITIONS)
endif()
find_path(CKPT_GLOO_INCLUDE_DIR gloo/context.h
          DOC "Gloo's headers (Debian: libgloo-dev), for ckpt::distributed")
if(NOT "USE_C10D_GLOO" IN_LIST _ckpt_c10d_defines)
  message(STATUS "ckpt: ckpt::distributed is not built: this LibTorch has no c10d with Gloo "
                 "(USE_C10D_GLOO is not among torch_cpu's compile definitions)")
elseif(NOT CKPT_GLOO_INCLUDE_DIR)
  message(STATUS "ckpt: ckpt::distributed is not built: Gloo's headers (gloo/context.h) were not "
                 "found. Install them (Debian: apt-get install libgloo-dev) or set "
                 "CKPT_GLOO_INCLUDE_DIR")
else()
  set(CKPT_HAS_DISTRIBUTED ON)
endif()

if(CKPT_HAS_DISTRIBUTED)
  add_library(ckpt_distributed
    src/compat/c10d_compat.cpp
    src/distributed/bounded_wait.cpp
    src/distributed/data_parallel.cpp
    src/distributed/process_group.cpp
  )
  add_library(ckpt::distributed ALIAS ckpt_distributed)
  target_include_directories(ckpt_distributed PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  # Gloo's headers are needed by the c10d headers ckpt includes, never by its users.
  target_include_directories(ckpt_distributed PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_include_directories(ckpt_distributed SYSTEM PRIVATE ${CKPT_GLOO_INCLUDE_DIR})
  target_link_libraries(ckpt_distributed PUBLIC ckpt Threads::Threads)
  set_target_properties(ckpt_distributed PROPERTIES EXPORT_NAME distributed)
  ckpt_set_warnings(ckpt_distributed)
  # Debian's libtorch-dev 1.13 lacks a header that its c10d reducer.hpp includes: a stand-in.
  set(_ckpt_context_found OFF)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/torch/csrc/distributed/autograd/context/context.h")
      set(_ckpt_context_found ON)
    endif()
  endforeach()
  if(NOT _ckpt_context_found)
    target_include_directories(ckpt_distributed SYSTEM PRIVATE
                               ${PROJECT_SOURCE_DIR}/src/compat/missing_headers)
  endif()

  set(_ckpt_nccl_defines "")
  if(TARGET torch_cuda)
    get_target_property(_ckpt_nccl_defines torch_cuda INTERFACE_COMPILE_DEFINITIONS)
  endif()
  if("USE_C10D_NCCL" IN_LIST _ckpt_nccl_defines)
    find_path(CKPT_NCCL_INCLUDE_DIR nccl.h
              HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include"
              DOC "NCCL's headers, for ckpt::distributed's NCCL backend")
    if(CKPT_NCCL_INCLUDE_DIR)
      target_compile_definitions(ckpt_distributed PRIVATE CKPT_HAVE_NCCL=1 USE_C10D_NCCL)
      target_include_directories(ckpt_distributed SYSTEM PRIVATE ${CKPT_NCCL_INCLUDE_DIR})
      message(STATUS "ckpt: ckpt::distributed with Gloo and NCCL")
    else()
      message(STATUS "ckpt: ckpt::distributed with Gloo only: nccl.h was not found (set "
                     "CKPT_NCCL_INCLUDE_DIR)")
    endif()
  else()
    message(STATUS "ckpt: ckpt::distributed with Gloo (this LibTorch has no NCCL)")
  endif()
endif()
