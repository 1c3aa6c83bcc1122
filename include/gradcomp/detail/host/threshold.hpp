/// \file detail/host/threshold.hpp
/// select::threshold on backend::host: selection happens entirely inside the
/// corrector's pass (observe); select() only concatenates the per-chunk lists.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/host/slices.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/threshold.hpp>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
class engine<select::threshold, backend::host> {
 public:
  engine(const backend::host& be, const select::threshold&, std::size_t n) : threads_(be.concurrency()), slices_(n) {}

  void begin_observe(const select::threshold& policy, std::uint64_t) noexcept {
    key_ = magnitude_key(policy.tau);
    observed_ = true;
  }
  void observe(int, std::size_t begin, std::span<const float> acc, std::span<const float>) noexcept {
    slices_.keep_chunk(begin / host_chunk, begin, begin + acc.size(),
                       [&](std::size_t i) { return magnitude_key(acc[i - begin]) >= key_; });
  }
  selection select(const select::threshold& policy, const select_input& in, std::span<std::uint32_t> out) {
    if (!observed_) {
      begin_observe(policy, in.step);
      slices_.keep(threads_, [&](std::size_t i) { return magnitude_key(in.acc[i]) >= key_; });
    }
    observed_ = false;
    return {slices_.gather(out.data())};
  }
  void accept() noexcept {}

 private:
  int threads_;
  host_slices slices_;
  std::uint32_t key_ = 0;
  bool observed_ = false;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
