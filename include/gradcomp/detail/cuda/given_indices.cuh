/// \file detail/cuda/given_indices.cuh
/// select::given_indices on backend::cuda: the set lives in device memory, copied there
/// by set_indices after the host has checked it. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/host/given_indices.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/given_indices.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
class engine<select::given_indices, backend::cuda> {
 public:
  engine(const backend::cuda& be, const select::given_indices& policy, std::size_t n)
      : backend_(be), n_(n), given_(policy.max_count) {}

  /// Replaces the index set (checked on the host first; on error nothing changes).
  void set_indices(const select::given_indices& policy, std::span<const std::uint32_t> indices) {
    check_given_indices(indices, n_, policy.max_count);
    backend_.to_device(indices.data(), indices.size(), given_.data());
    count_ = indices.size();
  }

  queued_selection select(const select::given_indices&, const select_input&, std::span<std::uint32_t> out,
                          step_status* status) {
    cuda_check(cudaMemcpyAsync(out.data(), given_.data(), count_ * sizeof(std::uint32_t), cudaMemcpyDeviceToDevice,
                               backend_.stream),
               "cudaMemcpyAsync (given indices)");
    cuda_launch::set_count<<<1, 1, 0, backend_.stream>>>(status, static_cast<std::uint32_t>(count_));
    cuda_check(cudaGetLastError(), "set_count (launch)");
    return {};
  }
  void accept() noexcept {}

 private:
  backend::cuda backend_;
  std::size_t n_;
  device_buffer<std::uint32_t> given_;
  std::size_t count_ = 0;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
