/// \file detail/select/threshold.hpp
/// select::threshold's algorithm over the backend primitives: one ordered compaction of
/// the indices with |acc_i| >= tau, whose count goes straight into the step's status.
/// What backend::kokkos and backend::cuda run; backend::host's engine
/// (detail/host/select_threshold.hpp) collects during the corrector's pass instead, a fast
/// path the tests prove equal to this. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/threshold.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// select::threshold on any backend.
/// A NaN or infinity is above every tau: it is selected, and the corrector's pass
/// rejects the step.
template <class Backend>
class threshold_selection {
 public:
  threshold_selection(const Backend& be, const select::threshold&, std::size_t n)
      : n_(n), workspace_(be.template allocate<std::byte>(be.template compact_workspace<magnitude_at_least>(n))) {}

  /// Queues the compaction: ascending indices in out, their count in the status.
  queued_selection select(const Backend& be, const select::threshold& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    be.compact(n_, magnitude_at_least{in.acc.data(), magnitude_key(policy.tau)}, out.data(),
               workspace_bytes(workspace_), &status->count);
    return {};
  }
  void accept() noexcept {}

 private:
  std::size_t n_;
  typename Backend::template buffer<std::byte> workspace_;
};

/// Every backend without an engine of its own for select::threshold runs the one above.
template <class Backend>
class engine<select::threshold, Backend> : public threshold_selection<Backend> {
 public:
  using threshold_selection<Backend>::threshold_selection;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
