/// \file correct/momentum.hpp
/// DGC's momentum correction with momentum factor masking.
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

/// Accumulates velocity instead of gradient so that sparse updates keep momentum's
/// effect (Lin et al., ICLR 2018):
/// - plain:    `u <- beta*u + g`,     `v <- v + u`;
/// - Nesterov: `u <- beta*(u + g)`,  `v <- v + u + g`;
/// acc = v. After sending, `v_i <- v_i - sent_i`, and with masking `u_i <- 0`, for each
/// sent i. The aggregate is the update direction already: do not apply momentum again.
struct momentum {
  float beta = 0.9f;      ///< momentum, finite
  bool nesterov = false;  ///< Nesterov momentum
  bool masking = true;    ///< zero the momentum of sent entries (momentum factor masking)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"beta", &momentum::beta}, setting{"nesterov", &momentum::nesterov},
                      setting{"masking", &momentum::masking}};
  }

  static constexpr std::size_t state_arrays = 2;  ///< u, v
  static constexpr int acc_state = 1;             ///< acc is the updated v

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return nesterov ? "momentum(nesterov)" : "momentum"; }

  /// \throws gradcomp::error if beta is not finite.
  void validate() const {
    detail::require(std::isfinite(beta), errc::invalid_argument, "momentum: beta must be finite, got ", beta);
  }

  /// One element of the update: `s` holds the state arrays' values (old in, new out); returns acc.
  GRADCOMP_HOST_DEVICE float update(float* s, float g) const noexcept {
    if (nesterov) {
      s[0] = beta * (s[0] + g);
      s[1] = s[1] + s[0] + g;
    } else {
      s[0] = beta * s[0] + g;
      s[1] = s[1] + s[0];
    }
    return s[1];
  }
  /// A bound of |u| and |v| after update() from |u| <= state_max[0], |v| <= state_max[1]
  /// and |g| <= g_max (commit then moves v by |sent| and u towards 0).
  [[nodiscard]] double magnitude_bound(const double* state_max, double g_max) const noexcept {
    const double b = std::fabs(static_cast<double>(beta));
    return nesterov ? state_max[1] + b * (state_max[0] + g_max) + g_max : state_max[1] + b * state_max[0] + g_max;
  }
  /// One sent element: `s` holds the updated state, `old` the state before the step, `sent` the
  /// value as the receiver decodes it.
  GRADCOMP_HOST_DEVICE void commit(float* s, const float* /*old*/, float /*acc*/, float sent) const noexcept {
    s[1] -= sent;
    if (masking) s[0] = 0.0f;
  }
};

}  // namespace correct
GRADCOMP_NAMESPACE_END
