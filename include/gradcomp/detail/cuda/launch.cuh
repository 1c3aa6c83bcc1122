/// \file detail/cuda/launch.cuh
/// Grid sizing and the grid-stride loop that gradcomp's element-wise kernels share, the
/// kernels of backend::cuda's primitives, and the small kernels that move a step's
/// status along. (An engine header cannot rely on another being complete when it is
/// read, since they reach each other through backend/cuda.cuh: what engines share
/// lives here.) Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>

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

/// backend::cuda::reduce_or's kernel: ORs body(i) over [0, n) into *bits, one atomic
/// per thread that saw a nonzero result.
template <class Body>
__global__ void reduce_or(std::uint64_t n, Body body, std::uint32_t* bits) {
  std::uint32_t seen = 0;
  grid_stride(n, [&](std::uint64_t i) { seen |= body(static_cast<std::size_t>(i)); });
  if (seen != 0) atomicOr(bits, seen);
}

/// backend::cuda::reduce_max's kernel: the largest body(i) over [0, n) into *word, one
/// atomic per thread that saw more than 0.
template <class Body>
__global__ void reduce_max(std::uint64_t n, Body body, std::uint32_t* word) {
  std::uint32_t largest = 0;
  grid_stride(n, [&](std::uint64_t i) { largest = max(largest, body(static_cast<std::size_t>(i))); });
  if (largest != 0) atomicMax(word, largest);
}

/// backend::cuda::histogram's kernel: counts[bin_of(i)] += 1 for every i in [0, n).
template <class BinOf>
__global__ void histogram(std::uint64_t n, BinOf bin_of, std::uint32_t* counts) {
  grid_stride(n, [&](std::uint64_t i) {
    const std::size_t bin = bin_of(static_cast<std::size_t>(i));
    if (bin != no_bin) atomicAdd(counts + bin, 1u);
  });
}

/// Threads of tile_sums for n terms: eight per tile.
inline unsigned tile_sum_blocks(std::size_t n) {
  return static_cast<unsigned>((tile_count(n) * 8 + block_threads - 1) / block_threads);
}

/// The tile sums of backend::cuda::sum in the order of fixed_order_sum.hpp: thread
/// 8c + l adds lane l of tile c, and the tile's first thread combines the lanes.
template <class Term>
__global__ void tile_sums(std::uint64_t n, Term term, double* tile) {
  const std::uint64_t tiles = tile_count(n);
  const std::uint64_t thread = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t c = thread / 8;
  const unsigned lane = static_cast<unsigned>(thread % 8);
  double part = 0.0;
  if (c < tiles) {
    const std::uint64_t begin = c * host_tile;
    const std::uint64_t end = begin + host_tile < n ? begin + host_tile : n;
    for (std::uint64_t i = begin + lane; i < end; i += 8) part = add_rn(part, term(static_cast<std::size_t>(i)));
  }
  // Lanes 8c..8c+7 sit in one warp (blocks are multiples of 32 threads).
  const unsigned base = threadIdx.x & ~7u;
  double lanes[8];
  for (unsigned l = 0; l < 8; ++l) lanes[l] = __shfl_sync(0xFFFFFFFFu, part, static_cast<int>((base + l) % 32));
  if (c < tiles && lane == 0) tile[c] = combine_lanes(lanes);
}

// Kernels that are not templates otherwise take an unused template parameter: a plain
// __global__ function defined in a header would be defined again by every translation
// unit that includes it, and nvcc ignores `inline` on kernels.

/// The tile sums added in tile order, by one thread.
template <class = void>
__global__ void sum_of_tiles(const double* tile, std::uint64_t tiles, double* total) {
  *total = detail::sum_of_tiles(tile, tiles);
}

}  // namespace detail::cuda_launch
GRADCOMP_NAMESPACE_END
