/// \file detail/cuda/compaction.cuh
/// The ordered compaction that threshold, chunk_local and sampled_threshold select
/// with: the indices of [0, n) that a predicate keeps, ascending, and their count, by
/// cub::DeviceSelect::If over the index sequence. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>

#include <cub/device/device_select.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::cuda_launch {

/// Compacts [0, n) by `Predicate` (a device functor of the index) on one stream; the
/// scratch is allocated once, here.
template <class Predicate>
class index_compaction {
  using indices = thrust::counting_iterator<std::uint32_t>;

 public:
  index_compaction(std::size_t n, cudaStream_t stream) : n_(n), stream_(stream) {
    std::size_t bytes = 0;
    cuda_check(cub::DeviceSelect::If(nullptr, bytes, indices(0), static_cast<std::uint32_t*>(nullptr),
                                     static_cast<std::uint32_t*>(nullptr), static_cast<std::int64_t>(n), Predicate{},
                                     stream),
               "cub::DeviceSelect::If (scratch size)");
    scratch_ = device_buffer<std::byte>(std::max<std::size_t>(bytes, 1));
  }

  /// Queues the kept indices into out (device memory, room for all n) and their
  /// number into *count (device memory).
  void operator()(const Predicate& keep, std::uint32_t* out, std::uint32_t* count) {
    std::size_t bytes = scratch_.size();
    cuda_check(cub::DeviceSelect::If(scratch_.data(), bytes, indices(0), out, count, static_cast<std::int64_t>(n_),
                                     keep, stream_),
               "cub::DeviceSelect::If");
  }

 private:
  std::size_t n_;
  cudaStream_t stream_;
  device_buffer<std::byte> scratch_;
};

}  // namespace detail::cuda_launch
GRADCOMP_NAMESPACE_END
