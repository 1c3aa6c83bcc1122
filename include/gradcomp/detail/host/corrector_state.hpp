/// \file detail/host/corrector_state.hpp
/// What the corrector engines of backend::host share.
///
/// State is double-buffered: update() writes the new state next to the committed one,
/// so a step rejected after the update (a NaN found in the same pass) leaves the
/// committed state untouched at no extra memory traffic; accept() swaps.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/radix_select.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// True when every element of `x` is finite; a branch-free OR the compiler vectorises.
inline bool all_finite(std::span<const float> x) noexcept {
  const auto* bits = reinterpret_cast<const std::int32_t*>(x.data());
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    bad |= (bits[i] & 0x7FFFFFFF) >= static_cast<std::int32_t>(non_finite_key);
  }
  return bad == 0;
}

/// Committed and next copies of a corrector's `Arrays` state arrays of n floats.
template <std::size_t Arrays>
class host_state {
 public:
  explicit host_state(std::size_t n) {
    for (auto& a : committed_) a.assign(n, 0.0f);
    for (auto& a : next_) a.assign(n, 0.0f);
  }
  std::span<float> committed(std::size_t a) noexcept { return committed_[a]; }
  std::span<const float> committed(std::size_t a) const noexcept { return committed_[a]; }
  std::span<float> next(std::size_t a) noexcept { return next_[a]; }
  void accept() noexcept { std::swap(committed_, next_); }

 private:
  std::array<std::vector<float>, Arrays> committed_;
  std::array<std::vector<float>, Arrays> next_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
