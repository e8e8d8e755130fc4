# GPU toolkits: the portable split-K kernel (gemm/split_k_device.cu) built by
# nvcc and by hipcc, each into an object library the capalloc libraries take
# in. CAPALLOC_WITH_CUDA / CAPALLOC_WITH_HIP: AUTO builds what is found, ON
# requires it, OFF skips it. Neither needs a GPU to build; kernels run only on
# a GPU machine.
set(CAPALLOC_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures of the kernels")
set(CAPALLOC_HIP_ARCHITECTURES "gfx90a;gfx940" CACHE STRING
    "HIP offload architectures of the kernels (Debian's HIP 5.2 knows no gfx942; gfx940 is its CDNA3 target)")

set(CAPALLOC_GPU_OBJECTS "")
set(CAPALLOC_GPU_LIBRARIES "")
set(CAPALLOC_GPU_DEFINITIONS "")

# --- CUDA ----------------------------------------------------------------------
if(NOT CAPALLOC_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The kernel is C++17; CMake 3.25 knows no CUDA20 dialect for nvcc.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    add_library(capalloc_gemm_cuda OBJECT gemm/split_k_device.cu)
    set_target_properties(capalloc_gemm_cuda PROPERTIES
      CUDA_ARCHITECTURES "${CAPALLOC_CUDA_ARCHITECTURES}"
      CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON CUDA_VISIBILITY_PRESET hidden)
    target_include_directories(capalloc_gemm_cuda PRIVATE ${PROJECT_SOURCE_DIR})
    target_compile_definitions(capalloc_gemm_cuda PRIVATE CAPALLOC_DEVICE_API_CUDA)
    list(APPEND CAPALLOC_GPU_OBJECTS $<TARGET_OBJECTS:capalloc_gemm_cuda>)
    list(APPEND CAPALLOC_GPU_LIBRARIES CUDA::cudart)
    list(APPEND CAPALLOC_GPU_DEFINITIONS CAPALLOC_HAVE_CUDA_KERNELS)
    set(CAPALLOC_HAVE_CUDA ON)
    message(STATUS "capalloc: CUDA kernels for ${CAPALLOC_CUDA_ARCHITECTURES} (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
  elseif(CAPALLOC_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CAPALLOC_WITH_CUDA=ON but no CUDA compiler was found")
  else()
    message(STATUS "capalloc: no CUDA toolkit found; building without CUDA")
  endif()
endif()

# --- HIP -----------------------------------------------------------------------
# Built with hipcc directly: Debian's HIP packages ship no CMake language
# support that works without ROCm's own layout.
if(NOT CAPALLOC_WITH_HIP STREQUAL "OFF")
  find_program(CAPALLOC_HIPCC hipcc)
  find_library(CAPALLOC_AMDHIP64 amdhip64)
  if(CAPALLOC_HIPCC AND CAPALLOC_AMDHIP64)
    set(hip_object ${CMAKE_CURRENT_BINARY_DIR}/gemm_split_k_hip.o)
    set(hip_arch_flags "")
    foreach(arch IN LISTS CAPALLOC_HIP_ARCHITECTURES)
      list(APPEND hip_arch_flags --offload-arch=${arch})
    endforeach()
    add_custom_command(OUTPUT ${hip_object}
      COMMAND ${CAPALLOC_HIPCC} -x hip -std=c++17 -O2 -fPIC -fvisibility=hidden ${hip_arch_flags}
              -DCAPALLOC_DEVICE_API_HIP -I${PROJECT_SOURCE_DIR}
              -c ${PROJECT_SOURCE_DIR}/gemm/split_k_device.cu -o ${hip_object}
      DEPENDS ${PROJECT_SOURCE_DIR}/gemm/split_k_device.cu ${PROJECT_SOURCE_DIR}/gemm/split_k_kernel.cuh
      COMMENT "hipcc: split-K kernel for ${CAPALLOC_HIP_ARCHITECTURES}"
      VERBATIM)
    add_custom_target(capalloc_gemm_hip DEPENDS ${hip_object})
    list(APPEND CAPALLOC_GPU_OBJECTS ${hip_object})
    list(APPEND CAPALLOC_GPU_LIBRARIES ${CAPALLOC_AMDHIP64})
    list(APPEND CAPALLOC_GPU_DEFINITIONS CAPALLOC_HAVE_HIP_KERNELS)
    set(CAPALLOC_HAVE_HIP ON)
    message(STATUS "capalloc: HIP kernels for ${CAPALLOC_HIP_ARCHITECTURES} (${CAPALLOC_HIPCC})")
  elseif(CAPALLOC_WITH_HIP STREQUAL "ON")
    message(FATAL_ERROR "CAPALLOC_WITH_HIP=ON but hipcc or libamdhip64 was not found")
  else()
    message(STATUS "capalloc: no HIP toolkit found; building without HIP")
  endif()
endif()
