/// \file detail/cuda/select_chunk_local.cuh
/// select::chunk_local (AdaComp) on backend::cuda: the bins' max |acc| by one
/// cub::DeviceReduce::ReduceByKey over the bin number i / bin (one pass, whatever the
/// bin size), then an ordered compaction (cub::DeviceSelect::If) of the indices with
/// |acc_i + g_i| >= the maximum of their bin, whose count CUB writes into the step's
/// status. Magnitudes are compared as keys, which order as the host's floats. Not API.
#pragma once

#include <gradcomp/detail/cuda/backend.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/compaction.cuh>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/core/radix_select.hpp>
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

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cuda_chunk_local {

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
  fast_engine(const backend::cuda& be, const select::chunk_local& policy, std::size_t n)
      : n_(n),
        bin_max_(be.template allocate<std::uint32_t>(n / policy.bin_for(n) + (n % policy.bin_for(n) != 0 ? 1 : 0))),
        runs_(be.template allocate<std::uint32_t>(1)),
        compact_(
            n, be.template allocate<std::byte>(cuda_launch::select_if_scratch<cuda_chunk_local::hits>(n, be.stream))) {
    using namespace cuda_chunk_local;
    std::size_t bytes = 0;
    cuda_check(
        cub::DeviceReduce::ReduceByKey(nullptr, bytes, bins(indices(0), bin_of{1}), thrust::make_discard_iterator(),
                                       magnitudes(indices(0), magnitude_of{}), static_cast<std::uint32_t*>(nullptr),
                                       static_cast<std::uint32_t*>(nullptr), cuda::maximum<std::uint32_t>{},
                                       static_cast<std::int64_t>(n), be.stream),
        "cub::DeviceReduce::ReduceByKey (scratch size)");
    reduce_scratch_ = be.template allocate<std::byte>(std::max<std::size_t>(bytes, 1));
  }

  /// Queues the bin maxima and the compaction on the context's stream: ascending
  /// indices in out, their count in the status.
  queued_selection select(const backend::cuda& be, const select::chunk_local& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    using namespace cuda_chunk_local;
    const auto bin = static_cast<std::uint32_t>(policy.bin_for(n_));
    std::size_t bytes = reduce_scratch_.size();
    cuda_check(cub::DeviceReduce::ReduceByKey(
                   reduce_scratch_.data(), bytes, bins(indices(0), bin_of{bin}), thrust::make_discard_iterator(),
                   magnitudes(indices(0), magnitude_of{in.acc.data()}), bin_max_.data(), runs_.data(),
                   cuda::maximum<std::uint32_t>{}, static_cast<std::int64_t>(n_), be.stream),
               "cub::DeviceReduce::ReduceByKey");
    compact_(hits{in.acc.data(), in.grad.data(), bin_max_.data(), bin}, out.data(), &status->count, be.stream);
    return {};
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const {
    use.workspace += bytes_held(bin_max_, runs_, reduce_scratch_) + compact_.held_bytes();
  }

 private:
  std::size_t n_;
  device_buffer<std::uint32_t> bin_max_;  // per bin, the largest magnitude key
  device_buffer<std::uint32_t> runs_;     // ReduceByKey's run count (the number of bins; unused)
  device_buffer<std::byte> reduce_scratch_;
  cuda_launch::index_compaction<cuda_chunk_local::hits> compact_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
