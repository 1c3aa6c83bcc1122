/// \file detail/select/threshold.hpp
/// select::threshold's algorithm over the backend primitives: one ordered compaction of
/// the indices with |acc_i| >= tau, whose count goes straight into the step's status,
/// then the finiteness check of the selected entries, which hold every NaN and infinity
/// (so that without a corrector acc = g is read once).
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
#include <gradcomp/held_memory.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The step's NaN flag raised if selected entry j is a NaN or an infinity.
struct flag_non_finite {
  const float* acc;
  const std::uint32_t* index;
  step_status* status;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return status->count; }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const noexcept {
    if (j < status->count && magnitude_key(acc[index[j]]) >= non_finite_key) status->non_finite = 1;
  }
};

/// select::threshold on any backend.
/// A NaN or infinity is above every tau: it is selected, and flagged.
template <class Backend>
class threshold_selection {
 public:
  static constexpr bool checks_finite = true;  // every non-finite entry is selected, and the selection is checked

  threshold_selection(const Backend& be, const select::threshold&, std::size_t n)
      : n_(n), workspace_(be.template allocate<std::byte>(be.template compact_workspace<magnitude_at_least>(n))) {}

  /// Queues the compaction: ascending indices in out, their count in the status.
  queued_selection select(const Backend& be, const select::threshold& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    be.compact(n_, magnitude_at_least{in.acc.data(), magnitude_key(policy.tau)}, out.data(),
               workspace_bytes(workspace_), &status->count);
    be.for_each(out.size(), flag_non_finite{in.acc.data(), out.data(), status});
    return {};
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const { use.workspace += bytes_held(workspace_); }

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
