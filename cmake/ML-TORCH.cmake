# ML-TORCH as a package of LAMMPS's own CMake build (-D PKG_ML-TORCH=on).
#
# tools/install_into_lammps.sh puts it in a LAMMPS tree: the styles in
# src/ML-TORCH/ (which LAMMPS compiles into liblammps and whose styles it
# registers, as for any package), the LAMMPS-independent core in
# src/ML-TORCH/core, its MPI part in src/ML-TORCH/mpi, pair_style torch/kk in
# src/ML-TORCH/kokkos, and this file as cmake/Modules/Packages/ML-TORCH.cmake.
# Here: LibTorch (MLTorch::libtorch), the two libraries, and torch/kk with
# KOKKOS.
#
# LibTorch: -D Torch_DIR=<libtorch>/share/cmake/Torch, -D
# CMAKE_PREFIX_PATH=<libtorch>, or -D ML_TORCH_PYTHON=<python with torch>.

set(ML_TORCH_PACKAGE_DIR ${LAMMPS_SOURCE_DIR}/ML-TORCH)

# neighbor->add_request() and, with KOKKOS, the KK_FLOAT precision layer:
# LAMMPS >= 22 Jul 2025
file(STRINGS "${LAMMPS_SOURCE_DIR}/neighbor.h" _mltorch_add_request REGEX "add_request\\(")
if(NOT _mltorch_add_request)
  message(FATAL_ERROR "ML-TORCH needs LAMMPS >= 22 Jul 2025 (this tree has no neighbor->add_request())")
endif()

include(${ML_TORCH_PACKAGE_DIR}/cmake/MLTorchLibTorch.cmake)

# nlohmann/json: the copy LAMMPS bundles, in its own namespace nlohmann_lmp
# and behind json.h. The core is LAMMPS-independent and includes
# <nlohmann/json.hpp>: a header of that name here gives it LAMMPS's copy
set(ML_TORCH_JSON_SHIM ${CMAKE_CURRENT_BINARY_DIR}/mltorch-json)
file(WRITE ${ML_TORCH_JSON_SHIM}/nlohmann/json.hpp.in
  "// LAMMPS's bundled nlohmann/json for the ML-TORCH core (cmake/Modules/Packages/ML-TORCH.cmake)\n"
  "#ifndef MLTORCH_LAMMPS_JSON_HPP\n#define MLTORCH_LAMMPS_JSON_HPP\n"
  "#define LMP_JSON_H\n#include \"${LAMMPS_SOURCE_DIR}/nlohmann/json.hpp\"\n"
  "namespace nlohmann = nlohmann_lmp;\n#endif\n")
configure_file(${ML_TORCH_JSON_SHIM}/nlohmann/json.hpp.in ${ML_TORCH_JSON_SHIM}/nlohmann/json.hpp COPYONLY)

# the core: model loading, graph evaluation, training (LibTorch's headers
# need C++20; nothing of LAMMPS is compiled with it)
file(GLOB ML_TORCH_CORE_SOURCES CONFIGURE_DEPENDS ${ML_TORCH_PACKAGE_DIR}/core/[^.]*.cpp)
add_library(mltorch_core STATIC ${ML_TORCH_CORE_SOURCES})
target_include_directories(mltorch_core PUBLIC ${ML_TORCH_PACKAGE_DIR}/core PRIVATE ${ML_TORCH_JSON_SHIM})
target_link_libraries(mltorch_core PUBLIC MLTorch::libtorch)
set_target_properties(mltorch_core PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON
                                              POSITION_INDEPENDENT_CODE ON)

# what distributed training needs of MPI: the site's MPI, or LAMMPS's stubs
file(GLOB ML_TORCH_MPI_SOURCES CONFIGURE_DEPENDS ${ML_TORCH_PACKAGE_DIR}/mpi/[^.]*.cpp)
add_library(mltorch_mpi STATIC ${ML_TORCH_MPI_SOURCES})
target_include_directories(mltorch_mpi PUBLIC ${ML_TORCH_PACKAGE_DIR}/mpi)
set_target_properties(mltorch_mpi PROPERTIES POSITION_INDEPENDENT_CODE ON)
if(BUILD_MPI)
  target_link_libraries(mltorch_mpi PUBLIC mltorch_core MPI::MPI_CXX)
else()
  target_link_libraries(mltorch_mpi PUBLIC mltorch_core mpi_stubs)
endif()
target_link_libraries(lammps PRIVATE mltorch_core mltorch_mpi)

if(PKG_KOKKOS)
  file(STRINGS "${LAMMPS_SOURCE_DIR}/KOKKOS/kokkos_type.h" _mltorch_kk_float REGEX "typedef [a-z ]+ KK_FLOAT;")
  if(NOT _mltorch_kk_float)
    message(FATAL_ERROR "pair_style torch/kk needs the KOKKOS package of LAMMPS >= 22 Jul 2025 "
                        "(KK_FLOAT); configure without PKG_KOKKOS for pair_style torch alone")
  endif()
  file(GLOB ML_TORCH_KOKKOS_SOURCES CONFIGURE_DEPENDS ${ML_TORCH_PACKAGE_DIR}/kokkos/[^.]*.cpp)
  target_sources(lammps PRIVATE ${ML_TORCH_KOKKOS_SOURCES})
  target_include_directories(lammps PRIVATE ${ML_TORCH_PACKAGE_DIR}/kokkos)
  target_compile_definitions(lammps PRIVATE ML_TORCH_KOKKOS_PRECISION_LAYER)
  set_property(GLOBAL APPEND PROPERTY PAIR ${ML_TORCH_PACKAGE_DIR}/kokkos/pair_torch_kokkos.h)
endif()

message(STATUS "ML-TORCH: LibTorch ${ML_TORCH_LIBTORCH_VERSION} at ${ML_TORCH_LIBTORCH_PREFIX}; "
               "pair_style torch/kk: ${PKG_KOKKOS}")
