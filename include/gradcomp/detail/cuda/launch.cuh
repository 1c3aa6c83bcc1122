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
#include <type_traits>

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

/// Queues `kernel(args...)` on `stream` over `grid` blocks of `threads` threads with
/// `shared` bytes of dynamic shared memory, and throws gradcomp::error naming `what` if
/// the launch fails. Every kernel of gradcomp is launched here: the CUDA tests also run
/// them on the CPU (tests/emulated_cuda, which defines GRADCOMP_EMULATED_CUDA and runs
/// each block's threads as fibers), where nothing else differs.
template <class... Params, class... Args>
void launch(const char* what, void (*kernel)(Params...), unsigned grid, unsigned threads, std::size_t shared,
            cudaStream_t stream, const Args&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch: one argument per parameter of the kernel");
#if defined(GRADCOMP_EMULATED_CUDA)
  emulated_cuda::check_arguments(what, args...);
  emulated_cuda::launch(grid, threads, shared, stream, [=] { kernel(args...); });
#else
  kernel<<<grid, threads, shared, stream>>>(args...);
#endif
  cuda_check(cudaGetLastError(), what);
}

/// The block's dynamic shared memory (a launch's `shared` bytes), as words.
__device__ inline std::uint32_t* dynamic_shared_words() {
#if defined(GRADCOMP_EMULATED_CUDA)
  return static_cast<std::uint32_t*>(emulated_cuda::dynamic_shared());
#else
  extern __shared__ std::uint32_t words[];
  return words;
#endif
}

/// Calls `body(i)` for every i in [0, n) of this thread's share of the grid.
template <class Body>
__device__ void grid_stride(std::uint64_t n, Body&& body) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    body(i);
  }
}

/// The items of a pass over n that can do work: n, or fewer where the body knows from
/// device memory how many are live (`live_items()`: the step's count of a pass over the
/// selection's capacity). Each thread reads it once, so a pass bounded by the capacity
/// (n for threshold) costs what its live items cost, with no read-back to size it.
template <class Body>
__device__ std::uint64_t live_bound(std::uint64_t n, const Body& body) {
  if constexpr (requires { body.live_items(); }) {
    const auto live = static_cast<std::uint64_t>(body.live_items());
    return live < n ? live : n;
  } else {
    return n;
  }
}

/// backend::cuda::for_each's kernel: `body(i)` for every i in [0, n) (its live items).
template <class Body>
__global__ void for_each(std::uint64_t n, Body body) {
  grid_stride(live_bound(n, body), [&](std::uint64_t i) { body(static_cast<std::size_t>(i)); });
}

/// backend::cuda::reduce_or's kernel: ORs body(i) over [0, n) into *bits, one atomic
/// per thread that saw a nonzero result.
template <class Body>
__global__ void reduce_or(std::uint64_t n, Body body, std::uint32_t* bits) {
  std::uint32_t seen = 0;
  grid_stride(live_bound(n, body), [&](std::uint64_t i) { seen |= body(static_cast<std::size_t>(i)); });
  if (seen != 0) atomicOr(bits, seen);
}

/// backend::cuda::reduce_max's kernel: the largest body(i) over [0, n) into *word, one
/// atomic per thread that saw more than 0.
template <class Body>
__global__ void reduce_max(std::uint64_t n, Body body, std::uint32_t* word) {
  std::uint32_t largest = 0;
  grid_stride(live_bound(n, body), [&](std::uint64_t i) { largest = max(largest, body(static_cast<std::size_t>(i))); });
  if (largest != 0) atomicMax(word, largest);
}

/// acc_i as the corrector's pass writes it, for a selector's first pass that computes
/// acc as it reads it (correction::update_pass: `update.read(i)` reads the committed
/// state and g_i, `update.written_acc(i, read)` writes the step's state and acc at i and
/// returns acc_i), in its two halves, so that a thread has the reads of all its entries
/// in flight before it writes any: a load cannot pass a store it might alias, and one
/// entry's reads at a time leave the memory waiting.
template <class Update>
struct updated_acc {
  Update update;
  using inputs = typename Update::inputs;
  __device__ inputs read(std::uint64_t i) const { return update.read(static_cast<std::size_t>(i)); }
  __device__ float written(std::uint64_t i, const inputs& in) const {
    return update.written_acc(static_cast<std::size_t>(i), in);
  }
};

/// The most bins a histogram counts in shared memory (16 KB of it).
inline constexpr std::size_t shared_histogram_bins = 4096;

/// Whether this block is the last of the grid to get here, every thread of the block
/// calling it: the threadFenceReduction pattern, so that what every block wrote before
/// the call (its atomics included) is visible to every thread of the last block after
/// it. `finished` counts the blocks in device memory, zero before; the last block resets
/// it. Each block's fence before its count releases what it wrote; the fence after the
/// count is the counting thread's, before the barrier, so that it acquires what the
/// counts it read released and the barrier passes that on to the block's other threads
/// (a fence of theirs after the barrier would acquire nothing: they read no count).
__device__ inline bool last_block_to_finish(std::uint32_t* finished) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(finished, 1u) == gridDim.x - 1;
    if (last) {
      __threadfence();
      *finished = 0;  // every block has counted itself
    }
  }
  __syncthreads();
  return last;
}

/// No one-item body after a histogram.
struct no_then {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {}
};

/// backend::cuda::histogram's kernel: counts[bin_of(i)] += 1 for every i in [0, n) (its
/// live items). Bins below `bins` (at most shared_histogram_bins; 0 where the body does
/// not say how many it has) are counted per block in shared memory (dynamic, bins words)
/// and each block adds its nonzero ones, so that items crowding a few bins (magnitudes
/// share their top digits) contend within a block, not across the device; any other bin
/// with an atomic in `counts`. With a `then` (not no_then), the last block to finish
/// (last_block_to_finish, counting in *finished) runs then(0) on the finished counts,
/// then clears the first `cleared` counts, so that the next histogram_then on them
/// needs no clear of its own.
template <class BinOf, class Then>
__global__ void __launch_bounds__(block_threads)
    histogram(std::uint64_t n, BinOf bin_of, std::uint32_t* counts, std::uint32_t bins, Then then,
              std::uint32_t* finished, std::uint32_t cleared) {
  std::uint32_t* const local = dynamic_shared_words();
  for (std::uint32_t b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  grid_stride(live_bound(n, bin_of), [&](std::uint64_t i) {
    const std::size_t bin = bin_of(static_cast<std::size_t>(i));
    if (bin < bins) {
      atomicAdd(local + bin, 1u);
    } else if (bin != no_bin) {
      atomicAdd(counts + bin, 1u);
    }
  });
  __syncthreads();
  for (std::uint32_t b = threadIdx.x; b < bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(counts + b, local[b]);
  }
  if constexpr (!std::is_same_v<Then, no_then>) {
    if (last_block_to_finish(finished)) {  // the same for every thread of the block
      if (threadIdx.x == 0) then(0);
      __syncthreads();  // then has read the counts
      for (std::uint32_t b = threadIdx.x; b < cleared; b += blockDim.x) counts[b] = 0;
    }
  }
}

/// Items per chunk that staged_lane_sums holds in shared memory (a multiple of 8, so an
/// item's lane is the same in every chunk).
inline constexpr unsigned sum_chunk = 2048;

/// The fixed order's sequential sums on a block of block_threads threads: lane l < Lanes
/// (thread l) adds value(j) for j = l, l + Lanes, l + 2 Lanes, ... < len in turn, and gets
/// its sum (the other threads get 0). The order is inherently sequential per lane; what
/// the rest of the block does is load: warps 1 and up stage the values chunk by chunk in
/// shared memory, the next chunk while the lanes add this one, each thread loading all
/// its values of a chunk before it stores any (a store waits for its load, and no load
/// passes an earlier store that might alias it: one at a time, each value cost a load's
/// latency). Warp 0, whose first Lanes threads add, stages nothing, so that the additions
/// never wait on a global load.
template <unsigned Lanes, class Value>
__device__ double staged_lane_sums(std::uint64_t len, const Value& value) {
  static_assert(sum_chunk % Lanes == 0 && Lanes <= 32);
  constexpr unsigned stagers = block_threads - 32;
  constexpr unsigned per_stager = (sum_chunk + stagers - 1) / stagers;
  __shared__ double staged[2][sum_chunk];
  const auto chunks = static_cast<unsigned>((len + sum_chunk - 1) / sum_chunk);
  const auto stage = [&](unsigned chunk) {
    if (threadIdx.x < 32) return;
    const std::uint64_t at = std::uint64_t{chunk} * sum_chunk;
    const unsigned first = threadIdx.x - 32;
    double loaded[per_stager] = {};  // each stored only where loaded, which GCC cannot see
#pragma unroll
    for (unsigned q = 0; q < per_stager; ++q) {
      const unsigned j = first + q * stagers;
      if (j < sum_chunk && at + j < len) loaded[q] = value(at + j);
    }
#pragma unroll
    for (unsigned q = 0; q < per_stager; ++q) {
      const unsigned j = first + q * stagers;
      if (j < sum_chunk && at + j < len) staged[chunk & 1][j] = loaded[q];
    }
  };
  double part = 0.0;
  if (chunks > 0) stage(0);
  __syncthreads();
  for (unsigned chunk = 0; chunk < chunks; ++chunk) {
    if (chunk + 1 < chunks) stage(chunk + 1);  // the buffer the lanes finished before the last barrier
    if (threadIdx.x < Lanes) {
      const std::uint64_t at = std::uint64_t{chunk} * sum_chunk;
      const auto count = static_cast<unsigned>(len - at < sum_chunk ? len - at : sum_chunk);
      for (unsigned j = threadIdx.x; j < count; j += Lanes) part = add_rn(part, staged[chunk & 1][j]);
    }
    __syncthreads();
  }
  return part;
}

/// The tile sums of backend::cuda::sum in the order of fixed_order_sum.hpp: block c sums
/// tile c, lane l (thread l) the terms at offsets l, l + 8, ..., and thread 0 combines
/// the lanes.
template <class Term>
__global__ void __launch_bounds__(block_threads) tile_sums(std::uint64_t n, Term term, double* tile) {
  const std::uint64_t begin = static_cast<std::uint64_t>(blockIdx.x) * host_tile;
  const std::uint64_t end = begin + host_tile < n ? begin + host_tile : n;
  const double part =
      staged_lane_sums<8>(end - begin, [&](std::uint64_t j) { return term(static_cast<std::size_t>(begin + j)); });
  if (threadIdx.x < 32) {  // lanes 0..7 sit in warp 0
    double lanes[8];
    for (unsigned l = 0; l < 8; ++l) lanes[l] = __shfl_sync(0xFFFFFFFFu, part, static_cast<int>(l));
    if (threadIdx.x == 0) tile[blockIdx.x] = combine_lanes(lanes);
  }
}

// Kernels that are not templates otherwise take an unused template parameter: a plain
// __global__ function defined in a header would be defined again by every translation
// unit that includes it, and nvcc ignores `inline` on kernels.

/// The tile sums added in tile order (one lane, thread 0), staged by one block.
template <class = void>
__global__ void __launch_bounds__(block_threads) sum_of_tiles(const double* tile, std::uint64_t tiles, double* total) {
  const double sum = staged_lane_sums<1>(tiles, [&](std::uint64_t c) { return tile[c]; });
  if (threadIdx.x == 0) *total = sum;
}

}  // namespace detail::cuda_launch
GRADCOMP_NAMESPACE_END
