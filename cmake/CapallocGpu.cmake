# GPU toolkits: for each toolkit found, the portable split-K kernel
# (gemm/split_k_device.cu, built by nvcc or hipcc) and the DeviceRuntime
# (runtime/cuda_runtime.cpp or hip_runtime.cpp, plain C++ built by
# the host compiler against the toolkit's runtime headers), each into objects
# the capalloc libraries take in. CAPALLOC_WITH_CUDA / CAPALLOC_WITH_HIP: AUTO
# builds what is found, ON requires it, OFF skips it. Neither needs a GPU to
# build; kernels and runtimes run only on a GPU machine ("auto" picks the host
# runtime elsewhere).
set(CAPALLOC_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures of the kernels")
set(CAPALLOC_HIP_ARCHITECTURES "gfx90a;gfx940" CACHE STRING
    "HIP offload architectures of the kernels (Debian's HIP 5.2 knows no gfx942; gfx940 is its CDNA3 target)")

set(CAPALLOC_BACKENDS "")

# capalloc_backend(<kind> <runtime source> <device objects or sources>...): the
# backend plugin libcapalloc_backend_<kind>.so, built next to libcapalloc and
# installed beside it. It carries its own copy of the logger (common/log.cpp,
# and common/config.cpp, through which it reads its level); the logger finds
# libcapalloc's through spdlog's registry. The caller adds the toolkit's
# includes, definitions and runtime library.
function(capalloc_backend kind runtime_source)
  set(target capalloc_backend_${kind})
  add_library(${target} MODULE ${runtime_source} common/log.cpp common/config.cpp ${ARGN})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR})
  target_compile_definitions(${target} PRIVATE CAPALLOC_BUILDING_LIBRARY
    CAPALLOC_VERSION="${PROJECT_VERSION}")
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
  target_link_libraries(${target} PRIVATE absl::status absl::statusor absl::flat_hash_map
    absl::strings absl::str_format spdlog::spdlog)
  target_link_options(${target} PRIVATE LINKER:--no-undefined)
  capalloc_set_warnings(${target})
  install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  set(CAPALLOC_BACKENDS ${CAPALLOC_BACKENDS} ${target} PARENT_SCOPE)
endfunction()

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
    capalloc_backend(cuda runtime/cuda_runtime.cpp gemm/split_k_device.cu)
    set_target_properties(capalloc_backend_cuda PROPERTIES
      CUDA_ARCHITECTURES "${CAPALLOC_CUDA_ARCHITECTURES}"
      CUDA_STANDARD 17 CUDA_VISIBILITY_PRESET hidden CUDA_RUNTIME_LIBRARY Shared)
    set_source_files_properties(gemm/split_k_device.cu PROPERTIES
      COMPILE_DEFINITIONS CAPALLOC_DEVICE_API_CUDA)
    # The cuda runtime: CUDA::cudart's headers come in as system includes.
    target_link_libraries(capalloc_backend_cuda PRIVATE CUDA::cudart)
    set(CAPALLOC_HAVE_CUDA ON)
    message(STATUS "capalloc: CUDA runtime and kernels for ${CAPALLOC_CUDA_ARCHITECTURES} (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
  elseif(CAPALLOC_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CAPALLOC_WITH_CUDA=ON but no CUDA compiler was found")
  else()
    message(STATUS "capalloc: no CUDA toolkit found; building without CUDA")
  endif()
endif()

# --- HIP -----------------------------------------------------------------------
# capalloc_hipcc_object(<out_var> <name> <source.cu> [<header>...]): compiles a
# portable kernel source with hipcc for CAPALLOC_HIP_ARCHITECTURES into
# <binary dir>/<name>.o and sets <out_var> to its path.
function(capalloc_hipcc_object out_var name source)
  set(object ${CMAKE_CURRENT_BINARY_DIR}/${name}.o)
  set(arch_flags "")
  foreach(arch IN LISTS CAPALLOC_HIP_ARCHITECTURES)
    list(APPEND arch_flags --offload-arch=${arch})
  endforeach()
  set(depends ${PROJECT_SOURCE_DIR}/${source})
  foreach(header IN LISTS ARGN)
    list(APPEND depends ${PROJECT_SOURCE_DIR}/${header})
  endforeach()
  add_custom_command(OUTPUT ${object}
    COMMAND ${CAPALLOC_HIPCC} -x hip -std=c++17 -O2 -fPIC -fvisibility=hidden ${arch_flags}
            -DCAPALLOC_DEVICE_API_HIP -I${PROJECT_SOURCE_DIR}
            -c ${PROJECT_SOURCE_DIR}/${source} -o ${object}
    DEPENDS ${depends}
    COMMENT "hipcc: ${source} for ${CAPALLOC_HIP_ARCHITECTURES}"
    VERBATIM)
  set(${out_var} ${object} PARENT_SCOPE)
endfunction()

# Built with hipcc directly: Debian's HIP packages ship no CMake language
# support that works without ROCm's own layout.
if(NOT CAPALLOC_WITH_HIP STREQUAL "OFF")
  find_program(CAPALLOC_HIPCC hipcc)
  find_library(CAPALLOC_AMDHIP64 amdhip64)
  find_path(CAPALLOC_HIP_INCLUDE_DIR hip/hip_runtime_api.h PATHS /opt/rocm/include)
  if(CAPALLOC_HIPCC AND CAPALLOC_AMDHIP64 AND CAPALLOC_HIP_INCLUDE_DIR)
    capalloc_hipcc_object(hip_object gemm_split_k_hip gemm/split_k_device.cu gemm/split_k_kernel.cuh)
    # The hip runtime: the HIP runtime API header works from the host
    # compiler once the platform is named; system include, so its own
    # warnings stay out of ours.
    capalloc_backend(hip runtime/hip_runtime.cpp ${hip_object})
    set_source_files_properties(${hip_object} PROPERTIES EXTERNAL_OBJECT ON GENERATED ON)
    target_compile_definitions(capalloc_backend_hip PRIVATE __HIP_PLATFORM_AMD__)
    target_include_directories(capalloc_backend_hip SYSTEM PRIVATE ${CAPALLOC_HIP_INCLUDE_DIR})
    target_link_libraries(capalloc_backend_hip PRIVATE ${CAPALLOC_AMDHIP64})
    set(CAPALLOC_HAVE_HIP ON)
    message(STATUS "capalloc: HIP runtime and kernels for ${CAPALLOC_HIP_ARCHITECTURES} (${CAPALLOC_HIPCC})")
  elseif(CAPALLOC_WITH_HIP STREQUAL "ON")
    message(FATAL_ERROR "CAPALLOC_WITH_HIP=ON but hipcc, libamdhip64 or hip/hip_runtime_api.h was not found")
  else()
    message(STATUS "capalloc: no HIP toolkit found; building without HIP")
  endif()
endif()
