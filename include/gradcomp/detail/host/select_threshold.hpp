/// \file detail/host/select_threshold.hpp
/// select::threshold on backend::host: selection happens entirely inside the
/// corrector's pass (observe); select() only concatenates the per-tile lists.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/host/slices.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/threshold.hpp>
#include <gradcomp/held_memory.hpp>

#include <utility>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
struct has_fast_path<select::threshold, backend::host> : std::true_type {};

template <>
class fast_engine<select::threshold, backend::host> {
 public:
  static constexpr bool checks_finite = true;  // non-finite keys are above every tau

  fast_engine(const backend::host& be, const select::threshold&, std::size_t n)
      : threads_(be.concurrency()), slices_(n) {}

  void begin_observe(const backend::host&, const select::threshold& policy, std::uint64_t) noexcept {
    key_ = magnitude_key(policy.tau);
    observed_ = true;
  }
  void observe(int, std::size_t begin, std::span<const float> acc, std::span<const float>) noexcept {
    bool tile_bad = false;  // the corrector reports non-finite acc itself
    slices_.collect_tile(begin / host_tile, begin, acc, key_, tile_bad);
  }
  /// Selects at once (the pass, or what observe() collected in the corrector's): the
  /// indices into out, their count and NaN verdict into the status (host memory).
  queued_selection select(const backend::host& be, const select::threshold& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    threads_ = be.concurrency();  // the call's context
    return record_selection(select_now(policy, in, out), status);
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const { use.workspace += slices_.held_bytes(); }

 private:
  selection select_now(const select::threshold& policy, const select_input& in, std::span<std::uint32_t> out) {
    bool finite = true;
    if (!std::exchange(observed_, false)) {
      key_ = magnitude_key(policy.tau);
      finite = slices_.collect(threads_, in.acc, key_);
    }
    return {slices_.gather(out.data()), 1.0f, finite};
  }

  int threads_;
  host_slices slices_;
  std::uint32_t key_ = 0;
  bool observed_ = false;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
