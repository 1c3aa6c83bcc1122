/// \file detail/cuda/compaction.cuh
/// The ordered compaction that threshold, chunk_local and sampled_threshold select
/// with: the indices of [0, n) that a predicate keeps, ascending, and their count, by
/// cub::DeviceSelect::If over the index sequence. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/held_memory.hpp>

#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::cuda_launch {

/// Scratch bytes that select_if needs for n indices.
template <class Predicate>
std::size_t select_if_scratch(std::size_t n, cudaStream_t stream) {
  std::size_t bytes = 0;
  cuda_check(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<std::uint32_t>(0),
                                   static_cast<std::uint32_t*>(nullptr), static_cast<std::uint32_t*>(nullptr),
                                   static_cast<std::int64_t>(n), Predicate{}, stream),
             "cub::DeviceSelect::If (scratch size)");
  return std::max<std::size_t>(bytes, 1);
}

/// Queues the indices i < n with keep(i), ascending, into out (device memory, room for
/// all n) and their number into *count (device memory); `scratch` holds
/// select_if_scratch<Predicate>(n) bytes.
template <class Predicate>
void select_if(std::byte* scratch, std::size_t scratch_bytes, const Predicate& keep, std::size_t n, std::uint32_t* out,
               std::uint32_t* count, cudaStream_t stream) {
  cuda_check(cub::DeviceSelect::If(scratch, scratch_bytes, thrust::counting_iterator<std::uint32_t>(0), out, count,
                                   static_cast<std::int64_t>(n), keep, stream),
             "cub::DeviceSelect::If");
}

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

/// Compacts [0, n) by `Predicate` (a device functor of the index) in `scratch`, which
/// holds select_if_scratch<Predicate>(n) bytes, allocated once by the caller.
template <class Predicate>
class index_compaction {
 public:
  index_compaction(std::size_t n, device_buffer<std::byte> scratch) : n_(n), scratch_(std::move(scratch)) {}

  /// Queues on `stream` the kept indices into out (device memory, room for all n) and
  /// their number into *count (device memory).
  void operator()(const Predicate& keep, std::uint32_t* out, std::uint32_t* count, cudaStream_t stream) {
    select_if(scratch_.data(), scratch_.size(), keep, n_, out, count, stream);
  }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return bytes_held(scratch_); }

 private:
  std::size_t n_;
  device_buffer<std::byte> scratch_;
};

}  // namespace detail::cuda_launch
GRADCOMP_NAMESPACE_END
