/// \file detail/core/density.hpp
/// How many of n entries a density names: the one rule every selector with a density
/// uses (docs/algorithms.md, "Densities and counts"). Not API.
#pragma once

#include <gradcomp/config.hpp>

#include <cmath>
#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The smallest k in [1, n] whose share k / n, rounded to double, is at least
/// `density` (in (0, 1]); n when none is. This is ceil(density * n) for the real numbers
/// the caller means: a density that is a decimal fraction of n names that count, where
/// ceil of the product in double would not (100 * 0.07 is 7.000000000000001, one too
/// many). The product is off by at most one unit of its last place, so one step either
/// way settles it; k / n is monotone in k, so the step finds the smallest.
GRADCOMP_HOST_DEVICE inline std::size_t entries_at_density(double density, std::size_t n) {
  const double whole = static_cast<double>(n);
  const double product = density * whole;
  if (!(product < whole)) return n;
  std::size_t k = static_cast<std::size_t>(std::ceil(product));
  if (k > 1 && static_cast<double>(k - 1) / whole >= density) --k;
  if (k < n && static_cast<double>(k) / whole < density) ++k;
  return k < 1 ? 1 : k;
}

/// `s` selecting the entries density `d` names: a count that the selector may take
/// instead (exact_topk's count, given_indices' max_count) is cleared.
template <class Selector>
Selector with_density(Selector s, double d) {
  s.density = d;
  if constexpr (requires { s.count = 0; }) s.count = 0;
  if constexpr (requires { s.max_count = 0; }) s.max_count = 0;
  return s;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
