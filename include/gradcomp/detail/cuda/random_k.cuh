/// \file detail/cuda/random_k.cuh
/// select::random_k on backend::cuda. The index set depends on (seed, step) alone, never
/// on the data, so the host draws it with the host engine's code (Floyd's algorithm,
/// O(k)) while the GPU runs the corrector's pass, and uploads the k indices: the same
/// set as backend::host by construction. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/host/random_k.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/random_k.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
class engine<select::random_k, backend::cuda> {
 public:
  engine(const backend::cuda& be, const select::random_k& policy, std::size_t n)
      : backend_(be), n_(n), taken_((n + 63) / 64) {
    reserve(policy);
  }

  /// Sizes the host draw for the policy's k (constructor and set_density only).
  void reserve(const select::random_k& policy) {
    if (policy.k(n_) > drawn_.size()) drawn_.resize(policy.k(n_));
  }

  /// Draws the indices on the host and queues their upload and count.
  queued_selection select(const select::random_k& policy, const select_input& in, std::span<std::uint32_t> out,
                          step_status* status) {
    const std::size_t k = policy.k(n_);
    random_k_indices(policy.seed, in.step, n_, k, taken_.data(), drawn_.data());
    // From pageable memory the copy is staged before the call returns, so drawn_ may
    // be written again by the next step.
    cuda_check(cudaMemcpyAsync(out.data(), drawn_.data(), k * sizeof(std::uint32_t), cudaMemcpyHostToDevice,
                               backend_.stream),
               "cudaMemcpyAsync (random_k indices)");
    cuda_launch::set_count<<<1, 1, 0, backend_.stream>>>(status, static_cast<std::uint32_t>(k));
    cuda_check(cudaGetLastError(), "set_count (launch)");
    return {policy.value_scale(n_)};
  }
  void accept() noexcept {}

 private:
  backend::cuda backend_;
  std::size_t n_;
  std::vector<std::uint64_t> taken_;
  std::vector<std::uint32_t> drawn_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
