/// \file detail/cuda/threshold.cuh
/// select::threshold on backend::cuda: an ordered compaction of the indices i with
/// |acc_i| >= tau (cub::DeviceSelect::If over the index sequence), whose count CUB
/// writes straight into the step's status. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/compaction.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/threshold.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
template <>
class engine<select::threshold, backend::cuda> {
 public:
  engine(const backend::cuda& be, const select::threshold&, std::size_t n) : compact_(n, be.stream) {}

  /// Queues the compaction: ascending indices in out, their count in the status. A
  /// NaN or infinity is above every tau; the corrector's pass flags it.
  queued_selection select(const select::threshold& policy, const select_input& in, std::span<std::uint32_t> out,
                          step_status* status) {
    compact_(cuda_launch::at_least{in.acc.data(), magnitude_key(policy.tau)}, out.data(), &status->count);
    return {};
  }
  void accept() noexcept {}

 private:
  cuda_launch::index_compaction<cuda_launch::at_least> compact_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
