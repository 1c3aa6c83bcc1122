/// \file correct/clip_norm.hpp
/// DGC's local gradient clipping.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace correct {

/// Before accumulation, `g <- g * min(1, (max_norm / sqrt(workers)) / ||g||_2)`: each
/// of `workers` clips to its share of the global threshold. A transform: use it alone
/// (acc = clipped g) or first in a `chain`.
struct clip_norm {
  float max_norm = 0.0f;  ///< global clipping threshold, > 0 (infinity disables)
  int workers = 1;        ///< workers sharing the threshold, >= 1

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"max_norm", &clip_norm::max_norm}, setting{"workers", &clip_norm::workers}};
  }

  static constexpr std::size_t state_arrays = 0;  ///< no memory: a transform
  static constexpr int acc_state = -1;            ///< acc is kept in its own array
  static constexpr bool scales_gradient = true;   ///< needs ||g|| before the update

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "clip_norm"; }

  /// \throws gradcomp::error if max_norm is not > 0 or workers < 1.
  void validate() const {
    detail::require(max_norm > 0.0f, errc::invalid_argument, "clip_norm: max_norm must be > 0, got ", max_norm);
    detail::require(workers >= 1, errc::invalid_argument, "clip_norm: workers must be >= 1, got ", workers);
  }

  /// Whether the gradient's norm is needed (an infinite max_norm never clips).
  [[nodiscard]] bool needs_norm() const noexcept { return std::isfinite(max_norm); }

  /// The factor applied to g, given sum(g_i^2).
  [[nodiscard]] GRADCOMP_HOST_DEVICE float gradient_scale(double sum_of_squares) const noexcept {
    const double norm = std::sqrt(sum_of_squares);
    const double limit = static_cast<double>(max_norm) / std::sqrt(static_cast<double>(workers));
    return norm > limit ? static_cast<float>(limit / norm) : 1.0f;
  }

  /// One element of the update: `s` holds the state arrays' values (old in, new out); returns acc.
  GRADCOMP_HOST_DEVICE float update(float* /*s*/, float g) const noexcept { return g; }
  /// One sent element: `s` holds the updated state, `old` the state before the step, `sent` the
  /// value as the receiver decodes it.
  GRADCOMP_HOST_DEVICE void commit(float*, const float*, float, float) const noexcept {}
};

}  // namespace correct
GRADCOMP_NAMESPACE_END
