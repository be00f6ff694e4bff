# Locate LibTorch and define the imported target MLTorch::libtorch.
#
# Why not just find_package(Torch)?  The TorchConfig.cmake shipped in the
# PyPI torch wheels for Linux is the CUDA build's: it runs
# find_package(CUDAToolkit REQUIRED) and stops with a FATAL_ERROR on a
# machine without a CUDA toolkit (or with a toolkit whose version differs
# from the wheel's), even though the CPU libraries we link need none of it.
# So by default we read the installation layout ourselves (include dirs,
# libtorch/libtorch_cpu/libc10 and, when present, the CUDA libraries, which
# are resolved at run time through the wheel's own RUNPATH).  Users who want
# the official config (e.g. a CUDA LibTorch with a matching toolkit) can set
# -DML_TORCH_USE_TORCH_CONFIG=ON.
#
# Inputs:  Torch_DIR, CMAKE_PREFIX_PATH, or ML_TORCH_PYTHON (a python with torch)
# Outputs: MLTorch::libtorch, ML_TORCH_LIBTORCH_VERSION, ML_TORCH_LIBTORCH_PREFIX

option(ML_TORCH_USE_TORCH_CONFIG "Use LibTorch's own TorchConfig.cmake (needs a CUDA toolkit for CUDA builds)" OFF)
set(ML_TORCH_PYTHON "" CACHE FILEPATH "Python interpreter with the torch wheel, used to locate LibTorch if Torch_DIR is not set")

if(ML_TORCH_USE_TORCH_CONFIG)
  find_package(Torch REQUIRED)
  if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
    message(FATAL_ERROR "LibTorch at ${Torch_DIR} uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0), which "
                        "would have to be imposed on all of LAMMPS; use a LibTorch with the C++11 ABI")
  endif()
  add_library(MLTorch::libtorch INTERFACE IMPORTED)
  target_link_libraries(MLTorch::libtorch INTERFACE torch)
  get_filename_component(ML_TORCH_LIBTORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
else()
  set(_torch_hints)
  if(Torch_DIR)
    list(APPEND _torch_hints "${Torch_DIR}/../../..")
  endif()
  if(ML_TORCH_PYTHON)
    execute_process(COMMAND ${ML_TORCH_PYTHON} -c "import torch, os; print(os.path.dirname(torch.__file__))"
                    OUTPUT_VARIABLE _torch_pydir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
    if(_rc EQUAL 0)
      list(APPEND _torch_hints "${_torch_pydir}")
    endif()
  endif()
  find_path(ML_TORCH_LIBTORCH_PREFIX NAMES share/cmake/Torch/TorchConfig.cmake
            HINTS ${_torch_hints} PATH_SUFFIXES "" libtorch torch
            DOC "LibTorch installation prefix (the folder holding include/, lib/, share/cmake/Torch)")
  if(NOT ML_TORCH_LIBTORCH_PREFIX)
    message(FATAL_ERROR "LibTorch not found. Pass -DTorch_DIR=<libtorch>/share/cmake/Torch, "
                        "-DCMAKE_PREFIX_PATH=<libtorch prefix>, or -DML_TORCH_PYTHON=<python with torch>.")
  endif()
  set(_p "${ML_TORCH_LIBTORCH_PREFIX}")
  find_library(ML_TORCH_LIB_TORCH torch PATHS "${_p}/lib" NO_DEFAULT_PATH)
  find_library(ML_TORCH_LIB_TORCH_CPU torch_cpu PATHS "${_p}/lib" NO_DEFAULT_PATH)
  find_library(ML_TORCH_LIB_C10 c10 PATHS "${_p}/lib" NO_DEFAULT_PATH)
  find_library(ML_TORCH_LIB_TORCH_CUDA torch_cuda PATHS "${_p}/lib" NO_DEFAULT_PATH)
  find_library(ML_TORCH_LIB_C10_CUDA c10_cuda PATHS "${_p}/lib" NO_DEFAULT_PATH)
  mark_as_advanced(ML_TORCH_LIB_TORCH ML_TORCH_LIB_TORCH_CPU ML_TORCH_LIB_C10 ML_TORCH_LIB_TORCH_CUDA ML_TORCH_LIB_C10_CUDA)
  if(NOT (ML_TORCH_LIB_TORCH AND ML_TORCH_LIB_TORCH_CPU AND ML_TORCH_LIB_C10))
    message(FATAL_ERROR "LibTorch at ${_p} lacks libtorch, libtorch_cpu or libc10")
  endif()
  add_library(MLTorch::libtorch INTERFACE IMPORTED)
  target_include_directories(MLTorch::libtorch SYSTEM INTERFACE "${_p}/include" "${_p}/include/torch/csrc/api/include")
  set(_libs ${ML_TORCH_LIB_TORCH} ${ML_TORCH_LIB_TORCH_CPU} ${ML_TORCH_LIB_C10})
  if(ML_TORCH_LIB_TORCH_CUDA)
    # keep the CUDA kernels registered even though no symbol of them is
    # referenced. One linker option: a compiler driver may regroup separate
    # ones (Kokkos's nvcc_wrapper passes every -Wl, option before every
    # library, so "-Wl,--no-as-needed lib.so -Wl,--as-needed" left
    # libtorch_cuda out of a CUDA build's liblammps.so)
    set(_libs "-Wl,--push-state,--no-as-needed,${ML_TORCH_LIB_TORCH_CUDA},${ML_TORCH_LIB_C10_CUDA},--pop-state" ${_libs})
    set(ML_TORCH_LIBTORCH_CUDA ON)
  else()
    set(ML_TORCH_LIBTORCH_CUDA OFF)
  endif()
  target_link_libraries(MLTorch::libtorch INTERFACE ${_libs})
  # A LibTorch built with the pre-C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=0,
  # the "pre-cxx11" downloads and wheels before torch 2.7) would need that
  # flag on every file that includes its headers, and the ML-TORCH core
  # passes std::string to LAMMPS code: the flag would have to spread over all
  # of LAMMPS and into plugins loaded next to other C++ libraries. Refuse it.
  file(READ "${_p}/share/cmake/Torch/TorchConfig.cmake" _cfg)
  if(_cfg MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
    message(FATAL_ERROR "LibTorch at ${_p} uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0), which "
                        "would have to be imposed on all of LAMMPS. Use a LibTorch with the C++11 ABI: "
                        "the 'cxx11 ABI' LibTorch download, or a torch wheel >= 2.7 via -DML_TORCH_PYTHON.")
  endif()
  set_property(TARGET MLTorch::libtorch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath,${_p}/lib")
endif()

set(ML_TORCH_LIBTORCH_VERSION "unknown")
foreach(_vh "${ML_TORCH_LIBTORCH_PREFIX}/include/torch/headeronly/version.h"
            "${ML_TORCH_LIBTORCH_PREFIX}/include/torch/csrc/api/include/torch/version.h")
  if(EXISTS "${_vh}" AND ML_TORCH_LIBTORCH_VERSION STREQUAL "unknown")
    file(STRINGS "${_vh}" _vlines REGEX "define TORCH_VERSION_(MAJOR|MINOR|PATCH) [0-9]+")
    if(_vlines MATCHES "MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+)")
      set(ML_TORCH_LIBTORCH_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
    endif()
  endif()
endforeach()
