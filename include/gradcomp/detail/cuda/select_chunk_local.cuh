/// \file detail/cuda/select_chunk_local.cuh
/// select::chunk_local (AdaComp) on backend::cuda. Where a bin holds at most tile_room
/// entries (AdaComp's 50 and 500): one pass over tiles of whole bins, each block finding
/// its bins' largest |acc| in shared memory and marking the hits (|acc_i + g_i| >= that
/// maximum) as bits, then an ordered expansion of the bits' words into the marked
/// indices, whose count goes into the step's status; an element-wise corrector's
/// update rides the pass (acc is computed where it is read). Wider bins: the bins'
/// maxima by one cub::DeviceReduce::ReduceByKey over the bin number i / bin, then the
/// compaction of the hits. Magnitudes are compared as keys, which order as the host's
/// floats. Not API.
#pragma once

#include <gradcomp/detail/cuda/backend.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/compaction.cuh>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/chunk_local.hpp>
#include <gradcomp/held_memory.hpp>

#include <cub/device/device_reduce.cuh>
#include <cuda/functional>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cuda_chunk_local {

/// Entries a thread of the tiled pass takes, and the most a tile holds: a bin of at
/// most tile_room entries is tiled (a block per tile of whole bins), a wider one
/// reduced by key.
inline constexpr int items_per_thread = 8;
inline constexpr std::uint32_t tile_room = cuda_launch::block_threads * items_per_thread;

/// Where entry j of a tile sits in shared memory: a word of padding after every 32, so
/// that a warp reading its threads' runs of consecutive entries (thread t: entries
/// 8t..8t+7) meets 32 different banks, as a warp taking consecutive entries does.
__host__ __device__ constexpr std::uint32_t padded(std::uint32_t j) { return j + j / 32; }
inline constexpr std::uint32_t padded_room = padded(tile_room);

/// acc_i as it is stored, read and written as cuda_launch::updated_acc is: no
/// corrector's pass rides, and acc's NaN and infinity are the corrector's to flag.
struct stored_acc {
  const float* acc;
  using inputs = float;
  __device__ float read(std::uint64_t i) const { return acc[i]; }
  __device__ float written(std::uint64_t, float a) const { return a; }
};

/// The tiled pass, block b over tile b (`tile` entries from b * tile: whole bins of
/// `bin`): bit i%32 of hit_words[i/32] is set where |acc_i + g_i| >= the largest |acc|
/// of i's bin. The words are zero before the pass: a tile stores the words that only it
/// covers and ORs its first and last, which it may share with the tiles beside it.
/// Where a corrector's pass rides (cuda_launch::updated_acc), a NaN or infinity in acc
/// sets *non_finite, as that pass would.
template <class Acc>
__global__ void __launch_bounds__(cuda_launch::block_threads)
    mark_hits(Acc acc_of, const float* g, std::uint64_t n, std::uint32_t bin, std::uint32_t tile,
              std::uint32_t* hit_words, std::uint32_t* non_finite) {
  constexpr bool flags_non_finite = !std::is_same_v<Acc, stored_acc>;
  constexpr std::uint32_t threads = cuda_launch::block_threads;
  __shared__ std::uint32_t acc_key[padded_room];  // |acc| of the tile's entries, as keys
  __shared__ std::uint32_t bin_max[tile_room];    // per bin of the tile, its largest |acc|
  __shared__ std::uint32_t words[tile_room / 32 + 2];
  const std::uint32_t t = threadIdx.x;
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * tile;
  const auto len = static_cast<std::uint32_t>(n - first < tile ? n - first : tile);
  const std::uint64_t first_word = first / 32;
  const auto word_count = static_cast<std::uint32_t>((first + len - 1) / 32 - first_word + 1);
  for (std::uint32_t b = t; b < (len + bin - 1) / bin; b += threads) bin_max[b] = 0;
  for (std::uint32_t w = t; w < word_count; w += threads) words[w] = 0;

  // Consecutive threads take consecutive entries (item q of thread t: entry
  // q * threads + t), so acc, what a riding update writes, and g move coalesced; every
  // read of the thread's entries is issued before any write.
  typename Acc::inputs in[items_per_thread] = {};
  float a[items_per_thread];
  float h[items_per_thread];  // g, then acc + g
#pragma unroll
  for (int q = 0; q < items_per_thread; ++q) {
    const std::uint32_t j = static_cast<std::uint32_t>(q) * threads + t;
    h[q] = 0.0f;
    if (j < len) {
      h[q] = g[first + j];
      in[q] = acc_of.read(first + j);
    }
  }
  bool flagged = false;
#pragma unroll
  for (int q = 0; q < items_per_thread; ++q) {
    const std::uint32_t j = static_cast<std::uint32_t>(q) * threads + t;
    a[q] = 0.0f;
    if (j < len) {
      a[q] = acc_of.written(first + j, in[q]);
      h[q] = __fadd_rn(a[q], h[q]);
      acc_key[padded(j)] = magnitude_key(a[q]);
      if constexpr (flags_non_finite) flagged |= magnitude_key(a[q]) >= non_finite_key;
    }
  }
  if (flagged) atomicOr(non_finite, 1u);
  __syncthreads();

  // Each thread's run of consecutive entries (8t..8t+7): its largest |acc| per bin it
  // meets, into the bin's word, where a bin's threads meet once each.
  const std::uint32_t run = t * items_per_thread;
  if (run < len) {
    std::uint32_t b = run / bin;
    std::uint32_t end = (b + 1) * bin;
    std::uint32_t largest = 0;
#pragma unroll
    for (int q = 0; q < items_per_thread; ++q) {
      const std::uint32_t j = run + static_cast<std::uint32_t>(q);
      if (j < len) {
        if (j == end) {
          atomicMax(&bin_max[b], largest);
          ++b;
          end += bin;
          largest = 0;
        }
        largest = max(largest, acc_key[padded(j)]);
      }
    }
    atomicMax(&bin_max[b], largest);
  }
  __syncthreads();

  // The hits, a warp's 32 consecutive entries at a time: its ballot is their bits, from
  // bit first % 32 of the word that holds the warp's first entry on.
  const std::uint32_t lane = t % 32;
  const auto shift = static_cast<std::uint32_t>(first % 32);
#pragma unroll
  for (int q = 0; q < items_per_thread; ++q) {
    const std::uint32_t j = static_cast<std::uint32_t>(q) * threads + t;
    const bool hit = j < len && magnitude_key(h[q]) >= bin_max[j / bin];
    const std::uint32_t bits = __ballot_sync(0xFFFFFFFFu, hit);
    if (lane == 0 && bits != 0) {
      const std::uint32_t w = (shift + j) / 32;  // j: the warp's first entry here
      atomicOr(&words[w], bits << shift);
      if (shift != 0 && (bits >> (32 - shift)) != 0) atomicOr(&words[w + 1], bits >> (32 - shift));
    }
  }
  __syncthreads();
  for (std::uint32_t w = t; w < word_count; w += threads) {
    if (w != 0 && w + 1 != word_count) {
      hit_words[first_word + w] = words[w];
    } else if (words[w] != 0) {
      atomicOr(&hit_words[first_word + w], words[w]);
    }
  }
}

using indices = thrust::counting_iterator<std::uint32_t>;

/// The bin of entry i.
struct bin_of {
  std::uint32_t bin;
  __host__ __device__ std::uint32_t operator()(std::uint32_t i) const { return i / bin; }
};

/// |acc_i| as a magnitude key.
struct magnitude_of {
  const float* acc;
  __host__ __device__ std::uint32_t operator()(std::uint32_t i) const { return magnitude_key(acc[i]); }
};

/// Whether |acc_i + g_i| >= the largest |acc| of i's bin (H overflowing to infinity
/// passes, as on the host; a NaN or infinity in acc or g is the corrector's to flag).
struct hits {
  const float* acc;
  const float* g;
  const std::uint32_t* bin_max;
  std::uint32_t bin;
  __device__ bool operator()(std::uint32_t i) const {
    return magnitude_key(__fadd_rn(acc[i], g[i])) >= bin_max[i / bin];
  }
};

using bins = thrust::transform_iterator<bin_of, indices>;
using magnitudes = thrust::transform_iterator<magnitude_of, indices>;

}  // namespace cuda_chunk_local

template <>
struct has_fast_path<select::chunk_local, backend::cuda> : std::true_type {};

template <>
class fast_engine<select::chunk_local, backend::cuda> {
 public:
  static constexpr bool runs_update_pass = true;  // select(..., pass) computes acc in its pass over it

  /// Made for the policy's bin (chunk_local's bin does not change after).
  fast_engine(const backend::cuda& be, const select::chunk_local& policy, std::size_t n)
      : n_(n), bin_(static_cast<std::uint32_t>(policy.bin_for(n))) {
    using namespace cuda_chunk_local;
    if (tiled()) {
      hit_words_ = be.template allocate<std::uint32_t>((n + 31) / 32);
      expand_scratch_ = be.template allocate<std::byte>(be.expand_workspace(hit_words_.size()));
      return;
    }
    bin_max_ = be.template allocate<std::uint32_t>((n + bin_ - 1) / bin_);
    runs_ = be.template allocate<std::uint32_t>(1);
    compact_scratch_ = be.template allocate<std::byte>(be.template compact_workspace<hits>(n));
    std::size_t bytes = 0;
    cuda_check(
        cub::DeviceReduce::ReduceByKey(nullptr, bytes, bins(indices(0), bin_of{1}), thrust::make_discard_iterator(),
                                       magnitudes(indices(0), magnitude_of{}), static_cast<std::uint32_t*>(nullptr),
                                       static_cast<std::uint32_t*>(nullptr), cuda::maximum<std::uint32_t>{},
                                       static_cast<std::int64_t>(n), be.stream),
        "cub::DeviceReduce::ReduceByKey (scratch size)");
    reduce_scratch_ = be.template allocate<std::byte>(std::max<std::size_t>(bytes, 1));
  }

  /// Queues the selection on the context's stream: ascending indices in out, their
  /// count in the status.
  queued_selection select(const backend::cuda& be, const select::chunk_local&, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    using namespace cuda_chunk_local;
    if (tiled()) return select_tiled(be, stored_acc{in.acc.data()}, in, out, status);
    return select_by_key(be, in, out, status);
  }
  /// The same, with acc written by the corrector's pass `update` (correction::update_pass)
  /// in the tiled pass, which reads each acc as it computes it, where the corrector's own
  /// pass would write acc and the selection read it again; a NaN or infinity in acc
  /// raises the status's flag, as the corrector's pass would. Bins too wide to tile run
  /// the corrector's pass first.
  template <class Update>
  queued_selection select(const backend::cuda& be, const select::chunk_local&, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status, const Update& update) {
    using namespace cuda_chunk_local;
    if (tiled()) return select_tiled(be, cuda_launch::updated_acc<Update>{update}, in, out, status);
    be.reduce_or(n_, update, &status->non_finite);
    return select_by_key(be, in, out, status);
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const {
    use.workspace += bytes_held(hit_words_, expand_scratch_, bin_max_, runs_, reduce_scratch_, compact_scratch_);
  }

 private:
  [[nodiscard]] bool tiled() const noexcept { return bin_ <= cuda_chunk_local::tile_room; }

  template <class Acc>
  queued_selection select_tiled(const backend::cuda& be, const Acc& acc_of, const select_input& in,
                                std::span<std::uint32_t> out, step_status* status) {
    using namespace cuda_chunk_local;
    const std::uint32_t tile = tile_room / bin_ * bin_;
    const auto tiles = static_cast<unsigned>((n_ + tile - 1) / tile);
    be.clear(hit_words_.data(), hit_words_.size());
    cuda_launch::launch("chunk_local's mark_hits (launch)", mark_hits<Acc>, tiles, cuda_launch::block_threads, 0,
                        be.stream, acc_of, in.grad.data(), std::uint64_t{n_}, bin_, tile, hit_words_.data(),
                        &status->non_finite);
    be.expand(hit_words_.size(), cuda_launch::set_bits_of{hit_words_.data()}, out.data(),
              workspace_bytes(expand_scratch_), &status->count);
    return {};
  }

  queued_selection select_by_key(const backend::cuda& be, const select_input& in, std::span<std::uint32_t> out,
                                 step_status* status) {
    using namespace cuda_chunk_local;
    std::size_t bytes = reduce_scratch_.size();
    cuda_check(cub::DeviceReduce::ReduceByKey(
                   reduce_scratch_.data(), bytes, bins(indices(0), bin_of{bin_}), thrust::make_discard_iterator(),
                   magnitudes(indices(0), magnitude_of{in.acc.data()}), bin_max_.data(), runs_.data(),
                   cuda::maximum<std::uint32_t>{}, static_cast<std::int64_t>(n_), be.stream),
               "cub::DeviceReduce::ReduceByKey");
    be.compact(n_, hits{in.acc.data(), in.grad.data(), bin_max_.data(), bin_}, out.data(),
               workspace_bytes(compact_scratch_), &status->count);
    return {};
  }

  std::size_t n_;
  std::uint32_t bin_;
  // Tiled: the hits as bits, and the workspace of their expansion into indices.
  device_buffer<std::uint32_t> hit_words_;
  device_buffer<std::byte> expand_scratch_;
  // Bins too wide to tile: per bin, the largest magnitude key; ReduceByKey's run count
  // (the number of bins; unused) and scratch; the compaction of the hits.
  device_buffer<std::uint32_t> bin_max_;
  device_buffer<std::uint32_t> runs_;
  device_buffer<std::byte> reduce_scratch_;
  device_buffer<std::byte> compact_scratch_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
