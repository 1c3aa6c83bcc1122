/// \file select/exact_topk.hpp
/// Exact top-k by magnitude.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/density.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace select {

/// Sends the k entries of largest |acc|, k = `count`, or the entries `density` names of n
/// (detail::entries_at_density: ceil(density * n) for the decimal density meant, in [1, n]).
/// Ties at the boundary go to the lower index, so exactly k are chosen; indices ascend.
/// Set exactly one of `density` and `count`.
struct exact_topk {
  double density = 0.0;   ///< fraction of entries to send, in (0, 1]
  std::size_t count = 0;  ///< number of entries to send, in [1, n]

  static constexpr bool reads_gradient = false;  ///< ranks acc alone (concepts.hpp, selector_reads_gradient)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"density", &exact_topk::density}, setting{"count", &exact_topk::count}};
  }

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "exact_topk"; }

  /// \throws gradcomp::error unless exactly one of density (in (0, 1]) and count
  ///         (in [1, n]) is set.
  void validate(std::size_t n) const {
    detail::require(!(density != 0.0 && count != 0), errc::invalid_argument,
                    "exact_topk: set density or count, not both (density = ", density, ", count = ", count, ")");
    if (count != 0) {
      detail::require(count <= n, errc::invalid_argument, "exact_topk: count must be in [1, n = ", n, "], got ", count);
    } else {
      detail::require(density > 0.0 && density <= 1.0, errc::invalid_argument,
                      "exact_topk: density must be in (0, 1], got ", density);
    }
  }

  /// Entries selected for a tensor of n elements.
  [[nodiscard]] std::size_t k(std::size_t n) const {
    if (count != 0) return count;
    return detail::entries_at_density(density, n);
  }

  /// The most entries a step of a tensor of n elements can select.
  [[nodiscard]] std::size_t max_selected(std::size_t n) const { return k(n); }
};

}  // namespace select
GRADCOMP_NAMESPACE_END
