/// \file correct/low_pass.hpp
/// ScaleCom's low-pass filtered error feedback.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace correct {

/// acc = m + g; after sending, `m <- (1 - beta) * m + beta * (acc - sent)` with sent = 0
/// where nothing was sent. beta = 1 is plain error feedback; smaller beta smooths the
/// memory, which keeps workers' residuals similar under shared-index selection.
struct low_pass {
  float beta = 1.0f;  ///< filter weight, in (0, 1]

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() { return std::tuple{setting{"beta", &low_pass::beta}}; }

  static constexpr std::size_t state_arrays = 1;  ///< m
  static constexpr int acc_state = -1;            ///< acc = m + g differs from m: own array

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "low_pass"; }

  /// \throws gradcomp::error if beta is outside (0, 1].
  void validate() const {
    detail::require(beta > 0.0f && beta <= 1.0f, errc::invalid_argument, "low_pass: beta must be in (0, 1], got ",
                    beta);
  }

  /// One element of the update: `s` holds the state arrays' values (old in, new out); returns acc.
  GRADCOMP_HOST_DEVICE float update(float* s, float g) const noexcept {
    const float acc = s[0] + g;
    s[0] = (1.0f - beta) * s[0] + beta * acc;  // the unsent case, sent = 0
    return acc;
  }
  /// One sent element: `s` holds the updated state, `old` the state before the step, `sent` the
  /// value as the receiver decodes it.
  GRADCOMP_HOST_DEVICE void commit(float* s, const float* old, float acc, float sent) const noexcept {
    s[0] = (1.0f - beta) * old[0] + beta * (acc - sent);
  }
};

}  // namespace correct
GRADCOMP_NAMESPACE_END
