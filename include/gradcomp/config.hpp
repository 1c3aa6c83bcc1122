/// \file config.hpp
/// Version, portability macros and feature detection for gradcomp.
#pragma once

#define GRADCOMP_VERSION_MAJOR 0
#define GRADCOMP_VERSION_MINOR 1
#define GRADCOMP_VERSION_PATCH 0
/// Single integer for preprocessor comparisons: major * 10000 + minor * 100 + patch.
#define GRADCOMP_VERSION (GRADCOMP_VERSION_MAJOR * 10000 + GRADCOMP_VERSION_MINOR * 100 + GRADCOMP_VERSION_PATCH)

// Functions that policies run inside device kernels are marked with this macro;
// it is empty for a plain host compiler so every .hpp builds with g++ alone.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define GRADCOMP_HOST_DEVICE __host__ __device__
#else
#define GRADCOMP_HOST_DEVICE
#endif

#if defined(_OPENMP)
#define GRADCOMP_HAS_OPENMP 1
#else
#define GRADCOMP_HAS_OPENMP 0
#endif

#if defined(__CUDACC__)
#define GRADCOMP_HAS_CUDA 1
#else
#define GRADCOMP_HAS_CUDA 0
#endif

#if defined(KOKKOS_VERSION) || defined(KOKKOS_MACROS_HPP)
#define GRADCOMP_HAS_KOKKOS 1
#else
#define GRADCOMP_HAS_KOKKOS 0
#endif

#if defined(OMPI_MPI_H) || defined(MPI_VERSION)
#define GRADCOMP_HAS_MPI 1
#else
#define GRADCOMP_HAS_MPI 0
#endif

// The versioned inline namespace lets two incompatible gradcomp builds coexist in one
// program without ODR violations while users keep writing gradcomp::compressor.
#define GRADCOMP_NAMESPACE_BEGIN \
  namespace gradcomp {           \
  inline namespace v0 {
#define GRADCOMP_NAMESPACE_END \
  }                            \
  }
