/// \file detail/cuda/compaction.cuh
/// The kernels of backend::cuda's ordered expansion (expand: a count per item, CUB's
/// exclusive scan of the counts, a write per item) and of its ordered compaction
/// (compact: the indices of [0, n) that a predicate keeps, ascending, and their count),
/// which marks the kept indices as bits, a warp's ballot per 32 indices, then expands
/// the n / 32 words: one pass over n that reads what the predicate reads and writes a
/// word and a count per 32 indices, where cub::DeviceSelect::If's over the index
/// sequence took about twice the read of n (H200, 2026-11-27). Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::cuda_launch {

/// Runs of 32 consecutive indices that a warp of the marking pass tests per round,
/// each lane testing one index of each before the warp ballots any: that many loads in
/// flight per thread.
inline constexpr int marked_runs = 8;

/// backend::cuda::compact's first kernel: words[w] holds keep(i) of i in [32w, 32w + 32)
/// as bit i % 32 (the bits past n zero), each word one warp's ballot, stored by one lane
/// with its count of bits in counts[w] (the expansion's counts: no pass of their own).
template <class Keep>
__global__ void __launch_bounds__(block_threads)
    mark_kept(std::uint64_t n, Keep keep, std::uint32_t* words, std::uint32_t* counts) {
  constexpr std::uint64_t run_items = 32 * marked_runs;
  const std::uint32_t lane = threadIdx.x % 32;
  const std::uint64_t word_count = (n + 31) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * (block_threads / 32);
  for (std::uint64_t round = static_cast<std::uint64_t>(blockIdx.x) * (block_threads / 32) + threadIdx.x / 32;
       round * run_items < n; round += warps) {  // the same for every lane of the warp
    const std::uint64_t first = round * run_items;
    bool kept[marked_runs];
#pragma unroll
    for (int u = 0; u < marked_runs; ++u) {
      const std::uint64_t i = first + static_cast<std::uint64_t>(u) * 32 + lane;
      kept[u] = i < n && keep(static_cast<std::uint32_t>(i));
    }
    std::uint32_t word = 0;
#pragma unroll
    for (int u = 0; u < marked_runs; ++u) {
      const std::uint32_t bits = __ballot_sync(0xFFFFFFFFu, kept[u]);
      if (lane == static_cast<std::uint32_t>(u)) word = bits;
    }
    const std::uint64_t w = first / 32 + lane;
    if (lane < static_cast<std::uint32_t>(marked_runs) && w < word_count) {
      words[w] = word;
      counts[w] = static_cast<std::uint32_t>(__popc(word));
    }
  }
}

/// The expansion body over marked words (mark_kept's, chunk_local's): word w makes the
/// indices of its set bits, ascending.
struct set_bits_of {
  const std::uint32_t* words;
  __device__ std::size_t operator()(std::size_t w, std::uint32_t* at) const {
    std::uint32_t bits = words[w];
    if (at == nullptr) return static_cast<std::size_t>(__popc(bits));
    std::size_t count = 0;
    for (; bits != 0; bits &= bits - 1) at[count++] = static_cast<std::uint32_t>(w * 32 + (__ffs(bits) - 1));
    return count;
  }
};

/// backend::cuda::expand's first kernel: counts[b] = body(b, nullptr).
template <class Body>
__global__ void expand_counts(std::uint64_t m, Body body, std::uint32_t* counts) {
  const std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < m) counts[b] = static_cast<std::uint32_t>(body(static_cast<std::size_t>(b), nullptr));
}

/// backend::cuda::expand's last kernel: item b writes from out + offsets[b]; the last
/// item stores the total.
template <class Body>
__global__ void expand_write(std::uint64_t m, Body body, const std::uint32_t* counts, const std::uint32_t* offsets,
                             std::uint32_t* out, std::uint32_t* count) {
  const std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= m) return;
  body(static_cast<std::size_t>(b), out + offsets[b]);
  if (b + 1 == m) *count = offsets[b] + counts[b];
}

/// Bytes of workspace for backend::cuda::expand of m items: m counts, m offsets, and
/// cub::DeviceScan::ExclusiveSum's scratch after them.
inline std::size_t expand_scratch(std::size_t m, cudaStream_t stream) {
  std::size_t bytes = 0;
  cuda_check(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const std::uint32_t*>(nullptr),
                                           static_cast<std::uint32_t*>(nullptr), static_cast<std::int64_t>(m), stream),
             "cub::DeviceScan::ExclusiveSum (scratch size)");
  return 2 * m * sizeof(std::uint32_t) + std::max<std::size_t>(bytes, 1);
}

}  // namespace detail::cuda_launch
GRADCOMP_NAMESPACE_END
