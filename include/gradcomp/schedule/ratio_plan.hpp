/// \file schedule/ratio_plan.hpp
/// DAGC's per-worker densities for unequal data.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace schedule {

/// Per-worker densities d_i for data volumes w_i under a traffic budget (DAGC, Lu et al.,
/// INFOCOM 2023): minimises sum w_i^2 (1/d_i - 1) subject to sum d_i = W * mean_density
/// and min_density <= d_i <= 1. The stationarity condition gives d_i proportional to w_i,
/// so d_i = clamp(lambda * w_i, min_density, 1) with lambda found by bisection
/// (water-filling): workers holding more data compress less.
/// \throws gradcomp::error if volumes is empty or holds a value that is not finite and
///         > 0, or the densities are outside 0 < min_density <= mean_density <= 1.
inline std::vector<double> ratio_plan(std::span<const double> volumes, double mean_density, double min_density) {
  detail::require(!volumes.empty(), errc::invalid_argument, "ratio_plan: volumes is empty");
  for (std::size_t i = 0; i < volumes.size(); ++i) {
    detail::require(std::isfinite(volumes[i]) && volumes[i] > 0.0, errc::invalid_argument, "ratio_plan: volumes[", i,
                    "] must be finite and > 0, got ", volumes[i]);
  }
  detail::require(mean_density > 0.0 && mean_density <= 1.0, errc::invalid_argument,
                  "ratio_plan: mean_density must be in (0, 1], got ", mean_density);
  detail::require(min_density > 0.0 && min_density <= mean_density, errc::invalid_argument,
                  "ratio_plan: min_density must be in (0, mean_density = ", mean_density, "], got ", min_density);

  const double budget = mean_density * static_cast<double>(volumes.size());
  auto total = [&](double lambda) {
    double sum = 0.0;
    for (const double w : volumes) sum += std::clamp(lambda * w, min_density, 1.0);
    return sum;
  };
  double lo = 0.0;                                                        // total(lo) <= budget
  double hi = 1.0 / *std::min_element(volumes.begin(), volumes.end());  // total(hi) = W >= budget
  for (int it = 0; it < 200 && lo < hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    (total(mid) < budget ? lo : hi) = mid;
  }
  std::vector<double> d(volumes.size());
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = std::clamp(hi * volumes[i], min_density, 1.0);
  return d;
}

}  // namespace schedule
GRADCOMP_NAMESPACE_END
