/// \file correct/error_feedback.hpp
/// Error feedback (residual memory): what is not sent now is sent later.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace correct {

/// `e <- beta * e + gamma * g`, acc = e; after sending, `e_i <- e_i - sent_i` for each
/// sent i (exactly zero with lossless values), so residual + everything sent equals the
/// (scaled) sum of all gradients.
struct error_feedback {
  float beta = 1.0f;   ///< decay of the residual, finite
  float gamma = 1.0f;  ///< weight of the new gradient, finite

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"beta", &error_feedback::beta}, setting{"gamma", &error_feedback::gamma}};
  }

  static constexpr std::size_t state_arrays = 1;  ///< e
  static constexpr int acc_state = 0;             ///< acc is the updated e

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "error_feedback"; }

  /// \throws gradcomp::error if beta or gamma is not finite.
  void validate() const {
    detail::require(std::isfinite(beta), errc::invalid_argument, "error_feedback: beta must be finite, got ", beta);
    detail::require(std::isfinite(gamma), errc::invalid_argument, "error_feedback: gamma must be finite, got ", gamma);
  }

  /// One element: `s` holds e (old in, new out); returns acc.
  GRADCOMP_HOST_DEVICE float update(float* s, float g) const noexcept {
    s[0] = beta * s[0] + gamma * g;
    return s[0];
  }
  /// A bound of |e| after update() from |e| <= state_max[0] and |g| <= g_max (commit
  /// then moves e by |sent|).
  [[nodiscard]] double magnitude_bound(const double* state_max, double g_max) const noexcept {
    return std::fabs(static_cast<double>(beta)) * state_max[0] + std::fabs(static_cast<double>(gamma)) * g_max;
  }
  /// One sent element: `s` holds the updated e, `old` the e before the step.
  GRADCOMP_HOST_DEVICE void commit(float* s, const float* /*old*/, float /*acc*/, float sent) const noexcept {
    s[0] -= sent;
  }
};

}  // namespace correct
GRADCOMP_NAMESPACE_END
