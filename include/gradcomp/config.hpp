/// \file config.hpp
/// Version, portability macros and feature detection for gradcomp.
#pragma once

#define GRADCOMP_VERSION_MAJOR 0  ///< incompatible API changes
#define GRADCOMP_VERSION_MINOR 1  ///< added functionality
#define GRADCOMP_VERSION_PATCH 0  ///< fixes
/// Single integer for preprocessor comparisons: major * 10000 + minor * 100 + patch.
#define GRADCOMP_VERSION (GRADCOMP_VERSION_MAJOR * 10000 + GRADCOMP_VERSION_MINOR * 100 + GRADCOMP_VERSION_PATCH)

/// \def GRADCOMP_HOST_DEVICE
/// Marks the functions that policies run inside device kernels: `__host__ __device__`
/// under nvcc, empty for a plain host compiler, so every .hpp builds with g++ alone.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define GRADCOMP_HOST_DEVICE __host__ __device__
#else
#define GRADCOMP_HOST_DEVICE
#endif

/// \def GRADCOMP_HAS_OPENMP
/// 1 when compiled with OpenMP (backend::host then runs threads), else 0.
#if defined(_OPENMP)
#define GRADCOMP_HAS_OPENMP 1
#else
#define GRADCOMP_HAS_OPENMP 0
#endif

/// \def GRADCOMP_HAS_CUDA
/// 1 when compiled by nvcc (backend::cuda is available), else 0.
#if defined(__CUDACC__)
#define GRADCOMP_HAS_CUDA 1
#else
#define GRADCOMP_HAS_CUDA 0
#endif

/// \def GRADCOMP_HAS_KOKKOS
/// 1 when Kokkos was included before gradcomp, else 0.
#if defined(KOKKOS_VERSION) || defined(KOKKOS_MACROS_HPP)
#define GRADCOMP_HAS_KOKKOS 1
#else
#define GRADCOMP_HAS_KOKKOS 0
#endif

/// \def GRADCOMP_HAS_MPI
/// 1 when MPI was included before gradcomp, else 0.
#if defined(OMPI_MPI_H) || defined(MPI_VERSION)
#define GRADCOMP_HAS_MPI 1
#else
#define GRADCOMP_HAS_MPI 0
#endif

/// Opens gradcomp's namespace: the versioned inline namespace lets two incompatible
/// gradcomp builds coexist in one program without ODR violations while users keep
/// writing gradcomp::compressor.
#define GRADCOMP_NAMESPACE_BEGIN \
  namespace gradcomp {           \
  inline namespace v0 {
/// Closes what GRADCOMP_NAMESPACE_BEGIN opened.
#define GRADCOMP_NAMESPACE_END \
  }                            \
  }
