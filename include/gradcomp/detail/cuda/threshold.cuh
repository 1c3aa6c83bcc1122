/// \file detail/cuda/threshold.cuh
/// select::threshold on backend::cuda: an ordered compaction of the indices i with
/// |acc_i| >= tau (cub::DeviceSelect::If over the index sequence), whose count CUB
/// writes straight into the step's status. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/threshold.hpp>

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
template <>
class engine<select::threshold, backend::cuda> {
  using indices = thrust::counting_iterator<std::uint32_t>;

 public:
  engine(const backend::cuda& be, const select::threshold&, std::size_t n) : stream_(be.stream), n_(n) {
    std::size_t bytes = 0;
    cuda_check(cub::DeviceSelect::If(nullptr, bytes, indices(0), static_cast<std::uint32_t*>(nullptr),
                                     static_cast<std::uint32_t*>(nullptr), static_cast<std::int64_t>(n),
                                     cuda_launch::at_least{nullptr, 0}, stream_),
               "cub::DeviceSelect::If (scratch size)");
    scratch_ = device_buffer<std::byte>(bytes > 0 ? bytes : 1);
  }

  /// Queues the compaction: ascending indices in out, their count in the status. A
  /// NaN or infinity is above every tau; the corrector's pass flags it.
  queued_selection select(const select::threshold& policy, const select_input& in, std::span<std::uint32_t> out,
                          step_status* status) {
    std::size_t bytes = scratch_.size();
    cuda_check(cub::DeviceSelect::If(scratch_.data(), bytes, indices(0), out.data(), &status->count,
                                     static_cast<std::int64_t>(n_),
                                     cuda_launch::at_least{in.acc.data(), magnitude_key(policy.tau)}, stream_),
               "cub::DeviceSelect::If");
    return {};
  }
  void accept() noexcept {}

 private:
  cudaStream_t stream_;
  std::size_t n_;
  device_buffer<std::byte> scratch_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
