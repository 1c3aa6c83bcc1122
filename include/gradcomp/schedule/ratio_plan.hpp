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
/// (water-filling): workers holding more data compress less. Any positive
/// finite volumes work, spanning any range: the densities sum to at most the budget
/// W * mean_density, and to it within rounding.
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

  const std::size_t workers = volumes.size();
  const double budget = mean_density * static_cast<double>(workers);
  std::vector<double> d(workers, 1.0);
  if (mean_density == 1.0) return d;  // every worker sends everything
  // In logarithms, so that lambda * w_i neither overflows nor underflows whatever the
  // range of the volumes (denormals included): d_i = clamp(exp(log_lambda + log w_i)).
  std::vector<double> log_w(workers);
  for (std::size_t i = 0; i < workers; ++i) log_w[i] = std::log(volumes[i]);
  auto densities = [&](double log_lambda) {
    double sum = 0.0;
    for (std::size_t i = 0; i < workers; ++i) {
      d[i] = std::clamp(std::exp(log_lambda + log_w[i]), min_density, 1.0);
      sum += d[i];
    }
    return sum;
  };
  // Bisection on log(lambda): the total is continuous and non-decreasing; at lo every
  // d_i is min_density (total W * min_density <= budget), at hi every d_i is 1 (total
  // W > budget). The interval is at most a few thousand wide, so a hundred halvings
  // reach rounding; the lower end is kept, whose total never exceeds the budget.
  const auto [smallest, largest] = std::minmax_element(log_w.begin(), log_w.end());
  double lo = std::log(min_density) - *largest;
  double hi = -*smallest;
  for (int it = 0; it < 200 && lo < hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    (densities(mid) <= budget ? lo : hi) = mid;
  }
  (void)densities(lo);
  return d;
}

}  // namespace schedule
GRADCOMP_NAMESPACE_END
