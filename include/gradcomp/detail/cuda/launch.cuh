/// \file detail/cuda/launch.cuh
/// Grid sizing and the grid-stride loop that gradcomp's element-wise kernels share, the
/// small kernels that move a step's status along, and the threshold predicate of the
/// compactions. (An engine header cannot rely on another being complete when it is
/// read, since they reach each other through backend/cuda.cuh: what engines share
/// lives here.) Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::cuda_launch {

inline constexpr int block_threads = 256;

/// Enough blocks of a grid-stride loop over `n` items to fill the current device
/// several times over (at least one).
inline unsigned grid_for(std::size_t n) {
  int device = 0;
  int sms = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const std::size_t blocks = (n + block_threads - 1) / block_threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, static_cast<std::size_t>(sms) * 8));
}

/// Calls `body(i)` for every i in [0, n) of this thread's share of the grid.
template <class Body>
__device__ void grid_stride(std::uint64_t n, Body&& body) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    body(i);
  }
}

/// backend::cuda::for_each's kernel: `body(i)` for every i in [0, n).
template <class Body>
__global__ void for_each(std::uint64_t n, Body body) {
  grid_stride(n, [&](std::uint64_t i) { body(static_cast<std::size_t>(i)); });
}

/// Raises the step's non-finite flag once per thread that saw one.
__device__ inline void flag_non_finite(bool seen, step_status* status) {
  if (seen) atomicOr(&status->non_finite, 1u);
}

// Kernels that are not templates otherwise take an unused template parameter: a plain
// __global__ function defined in a header would be defined again by every translation
// unit that includes it, and nvcc ignores `inline` on kernels.

/// Whether |acc_i| >= the magnitude key `key` (keys order as the host's floats): the
/// predicate of cub::DeviceSelect::If over the index sequence.
struct at_least {
  const float* acc;
  std::uint32_t key;
  __device__ bool operator()(std::uint32_t i) const { return magnitude_key(acc[i]) >= key; }
};

/// Sets the count of a selection whose size the host knows.
template <class = void>
__global__ void set_count(step_status* status, std::uint32_t count) { status->count = count; }

}  // namespace detail::cuda_launch
GRADCOMP_NAMESPACE_END
