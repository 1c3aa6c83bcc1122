/// \file select/threshold.hpp
/// A fixed magnitude threshold.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace select {

/// Sends every i with |acc_i| >= tau (possibly none, possibly all).
struct threshold {
  float tau = 0.0f;  ///< magnitude threshold, finite and >= 0

  static constexpr bool reads_gradient = false;  ///< ranks acc alone (concepts.hpp, selector_reads_gradient)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() { return std::tuple{setting{"tau", &threshold::tau}}; }

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "threshold"; }
  /// \throws gradcomp::error unless tau is finite and >= 0.
  void validate(std::size_t /*n*/) const {
    detail::require(std::isfinite(tau) && tau >= 0.0f, errc::invalid_argument,
                    "threshold: tau must be finite and >= 0, got ", tau);
  }
  /// The most entries a step of a tensor of n elements can select.
  [[nodiscard]] std::size_t max_selected(std::size_t n) const { return n; }
};

}  // namespace select
GRADCOMP_NAMESPACE_END
