# The CUDA backend (static library sdcuda), configured at the top
# directory's scope: enable_language(CUDA) must run in the directory common
# to every target that links CUDA code (tools/, tests/, bench/).
#
# SDTK_CUDA=AUTO builds it when nvcc, cuBLAS and cuDNN are found, ON makes
# their absence an error, OFF never builds it (the CPU-only build). Targets
# that link sdcuda get SDTK_HAVE_CUDA defined.
set(SDTK_HAVE_CUDA OFF)
if(SDTK_CUDA STREQUAL "OFF")
  message(STATUS "CUDA backend: not built (SDTK_CUDA=OFF)")
else()
  include(CheckLanguage)
  check_language(CUDA)
  set(sdtk_cuda_why "")
  if(NOT CMAKE_CUDA_COMPILER OR NOT EXISTS "${CMAKE_CUDA_COMPILER}")
    set(sdtk_cuda_why "no CUDA compiler (nvcc) found")
  else()
    find_package(CUDAToolkit QUIET)
    find_library(SDTK_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
    find_path(SDTK_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublas)
      set(sdtk_cuda_why "the CUDA toolkit (cudart, cuBLAS) was not found")
    elseif(NOT SDTK_CUDNN_LIBRARY OR NOT SDTK_CUDNN_INCLUDE_DIR)
      set(sdtk_cuda_why "cuDNN (libcudnn, cudnn.h) was not found")
    endif()
  endif()
  if(sdtk_cuda_why AND SDTK_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SDTK_CUDA=ON but ${sdtk_cuda_why}")
  elseif(sdtk_cuda_why)
    message(STATUS "CUDA backend: not built, ${sdtk_cuda_why} (CPU-only build)")
  else()
    set(SDTK_HAVE_CUDA ON)
  endif()
endif()

if(SDTK_HAVE_CUDA)
  # Ampere (A100 80, A10/RTX 30xx 86), Ada (L4/L40/RTX 40xx 89), Hopper (H100 90):
  # machine code for each, plus compute_90 PTX that newer GPUs compile at load.
  # Nothing for Volta/Turing (7.x): sd_cuda_create refuses them with the list below
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80-real;86-real;89-real;90" CACHE STRING "CUDA architectures of the sdcuda kernels")
  endif()
  enable_language(CUDA)
  message(STATUS "CUDA backend: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
                 "cuDNN ${SDTK_CUDNN_LIBRARY}")
  set(sdtk_cuda_dir ${CMAKE_CURRENT_LIST_DIR})
  add_library(sdcuda STATIC
    ${sdtk_cuda_dir}/cuda_ctx.c ${sdtk_cuda_dir}/cuda_conv.c ${sdtk_cuda_dir}/cuda_linear.c
    ${sdtk_cuda_dir}/cuda_attn_gemm.c ${sdtk_cuda_dir}/cuda_backend.c
    ${sdtk_cuda_dir}/cuda_elem.cu ${sdtk_cuda_dir}/cuda_norm.cu ${sdtk_cuda_dir}/cuda_attn.cu
    ${sdtk_cuda_dir}/cuda_scores.cu ${sdtk_cuda_dir}/cuda_optim.cu ${sdtk_cuda_dir}/cuda_half.cu
    ${sdtk_cuda_dir}/cuda_optim8.cu ${sdtk_cuda_dir}/cuda_adafactor.cu ${sdtk_cuda_dir}/cuda_bf16w.cu
    ${sdtk_cuda_dir}/cuda_probe.cu)
  target_include_directories(sdcuda PUBLIC ${sdtk_cuda_dir})
  target_include_directories(sdcuda SYSTEM PRIVATE ${SDTK_CUDNN_INCLUDE_DIR})
  target_link_libraries(sdcuda PUBLIC sdengine CUDA::cudart CUDA::cublas ${SDTK_CUDNN_LIBRARY})
  target_compile_definitions(sdcuda PUBLIC SDTK_HAVE_CUDA)
  # the architectures, for sd_cuda_create's message on a GPU it cannot serve
  string(REPLACE ";" " " sdtk_cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")
  set_source_files_properties(${sdtk_cuda_dir}/cuda_ctx.c PROPERTIES
    COMPILE_DEFINITIONS "SDTK_CUDA_ARCHS=\"${sdtk_cuda_archs}\"")
  # one CUDA runtime in the process: the shared one cuBLAS and cuDNN use
  set_target_properties(sdcuda PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  # nvcc: kernels stay C-like C++17; host side of .cu files warns like C
  target_compile_options(sdcuda PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow>")
  if(SDTK_WERROR)
    target_compile_options(sdcuda PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings;-Xcompiler=-Werror>")
  endif()
endif()
