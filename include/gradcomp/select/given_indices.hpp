/// \file select/given_indices.hpp
/// An index set chosen by the caller (ScaleCom followers, shared random sets).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/density.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace select {

/// Sends the indices last passed to compressor::set_indices (none until then); the set
/// stays in force until replaced. set_indices checks that they ascend strictly, are
/// below n, and number at most max_selected(n): `max_count`, or the entries `density`
/// names (as exact_topk counts them, so that a ScaleCom leader's top-k fits). Set
/// exactly one of the two; with a density, compressor::set_density changes the capacity
/// (and drops a set that no longer fits).
struct given_indices {
  std::size_t max_count = 0;  ///< capacity, in [1, n]
  double density = 0.0;       ///< capacity as a fraction of n, in (0, 1]

  static constexpr bool reads_gradient = false;  ///< ranks acc alone (concepts.hpp, selector_reads_gradient)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"max_count", &given_indices::max_count}, setting{"density", &given_indices::density}};
  }

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "given_indices"; }
  /// \throws gradcomp::error unless exactly one of max_count (in [1, n]) and density
  ///         (in (0, 1]) is set.
  void validate(std::size_t n) const {
    detail::require(!(density != 0.0 && max_count != 0), errc::invalid_argument,
                    "given_indices: set density or max_count, not both (density = ", density,
                    ", max_count = ", max_count, ")");
    detail::require(density != 0.0 || max_count != 0, errc::invalid_argument,
                    "given_indices: set density (in (0, 1]) or max_count (in [1, n = ", n, "]); both are 0");
    if (max_count != 0) {
      detail::require(max_count <= n, errc::invalid_argument, "given_indices: max_count must be in [1, n = ", n,
                      "], got ", max_count);
    } else {
      detail::require(density > 0.0 && density <= 1.0, errc::invalid_argument,
                      "given_indices: density must be in (0, 1], got ", density);
    }
  }
  /// The most entries a step of a tensor of n elements can select.
  [[nodiscard]] std::size_t max_selected(std::size_t n) const {
    return density != 0.0 ? detail::entries_at_density(density, n) : max_count;
  }
};

}  // namespace select
GRADCOMP_NAMESPACE_END
