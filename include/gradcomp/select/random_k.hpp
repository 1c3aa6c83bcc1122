/// \file select/random_k.hpp
/// Uniformly random entries, the same on every worker that shares the seed.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/density.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace select {

/// Sends k distinct indices drawn uniformly at random from (seed, step) alone — never
/// from the data — so workers that share a seed pick the same set and can all-reduce
/// the values. With `unbiased`, values are scaled by n/k so the message is an unbiased
/// estimate of acc (use it without error feedback).
struct random_k {
  double density = 0.0;    ///< fraction of entries to send, in (0, 1]
  std::uint64_t seed = 0;  ///< shared by the workers that must agree
  bool unbiased = false;   ///< scale values by n / k

  static constexpr bool reads_gradient = false;  ///< ranks acc alone (concepts.hpp, selector_reads_gradient)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"density", &random_k::density}, setting{"seed", &random_k::seed},
                      setting{"unbiased", &random_k::unbiased}};
  }

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return unbiased ? "random_k(unbiased)" : "random_k"; }
  /// \throws gradcomp::error if density is outside (0, 1].
  void validate(std::size_t /*n*/) const {
    detail::require(density > 0.0 && density <= 1.0, errc::invalid_argument,
                    "random_k: density must be in (0, 1], got ", density);
  }
  /// Entries targeted for a tensor of n elements: those `density` names
  /// (detail::entries_at_density: ceil(density * n) for the decimal density meant).
  [[nodiscard]] std::size_t k(std::size_t n) const { return detail::entries_at_density(density, n); }
  /// The most entries a step of a tensor of n elements can select.
  [[nodiscard]] std::size_t max_selected(std::size_t n) const { return k(n); }
  /// Factor on the values sent: n / k when unbiased, else 1.
  [[nodiscard]] float value_scale(std::size_t n) const {
    return unbiased ? static_cast<float>(static_cast<double>(n) / static_cast<double>(k(n))) : 1.0f;
  }
};

}  // namespace select
GRADCOMP_NAMESPACE_END
