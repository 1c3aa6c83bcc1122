/// \file schedule/warmup.hpp
/// DGC's exponential sparsity warm-up.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace schedule {

/// Density by epoch e: max(start * factor^e, final_density). The defaults give DGC's
/// 25%, 6.25%, 1.5625%, 0.390625%, then 0.1% (75% to 99.9% sparsity over four epochs).
/// Feed the result to compressor::set_density.
struct warmup {
  double start = 0.25;           ///< density of epoch 0, in (0, 1]
  double factor = 0.25;          ///< per-epoch multiplier, in (0, 1]
  double final_density = 0.001;  ///< floor reached after the warm-up, in (0, 1]

  /// \throws gradcomp::error naming the first parameter out of range.
  void validate() const {
    detail::require(start > 0.0 && start <= 1.0, errc::invalid_argument, "warmup: start must be in (0, 1], got ",
                    start);
    detail::require(factor > 0.0 && factor <= 1.0, errc::invalid_argument, "warmup: factor must be in (0, 1], got ",
                    factor);
    detail::require(final_density > 0.0 && final_density <= 1.0, errc::invalid_argument,
                    "warmup: final_density must be in (0, 1], got ", final_density);
  }

  /// Density for a whole epoch (epochs count from 0).
  [[nodiscard]] double by_epoch(std::uint64_t epoch) const {
    validate();
    return std::max(start * std::pow(factor, static_cast<double>(epoch)), final_density);
  }

  /// Density at a step, decaying smoothly within epochs: start * factor^(step /
  /// steps_per_epoch), floored at final_density; equals by_epoch at epoch boundaries.
  /// \throws gradcomp::error if steps_per_epoch is 0.
  [[nodiscard]] double by_step(std::uint64_t step, std::uint64_t steps_per_epoch) const {
    validate();
    detail::require(steps_per_epoch >= 1, errc::invalid_argument, "warmup: steps_per_epoch must be >= 1, got ",
                    steps_per_epoch);
    const double epochs = static_cast<double>(step) / static_cast<double>(steps_per_epoch);
    return std::max(start * std::pow(factor, epochs), final_density);
  }
};

}  // namespace schedule
GRADCOMP_NAMESPACE_END
