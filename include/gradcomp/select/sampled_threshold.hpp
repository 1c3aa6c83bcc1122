/// \file select/sampled_threshold.hpp
/// DGC's hierarchical threshold selection.
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

/// Deep Gradient Compression's selection (Lin et al., ICLR 2018): estimate the top-k
/// threshold on a strided sample, then refine.
/// 1. Sample m = max(ceil(n * sample_ratio), min(n, ceil(2 / density))) entries with
///    stride floor(n / m) from an offset drawn from (seed, step); if m >= n, this is
///    exact_topk.
/// 2. t = the ceil(m * density)-th largest |sample|; C = { i : |acc_i| >= t }.
/// 3. Up to max_iters times: if |C| > upper * k take the exact top-k of C and stop; if
///    |C| < lower * k set t <- t * lower and recount; otherwise stop.
/// 4. Send all of C, or with `truncate` its k largest. (DGC's reference code keeps the
///    lowest k indices instead; that biases against late layers, so we do not.)
/// With `reuse_threshold`, a step starts from the previous step's final t and samples
/// only when that count leaves [lower * k, upper * k]; the candidates are then collected
/// during the corrector's pass, so the gradient is read once.
struct sampled_threshold {
  double density = 0.0;          ///< target fraction sent, in (0, 1]
  double sample_ratio = 0.01;    ///< fraction sampled, in (0, 1]
  float lower = 0.8f;            ///< accept counts from lower * k, in (0, 1)
  float upper = 1.3f;            ///< up to upper * k, >= 1
  int max_iters = 10;            ///< threshold refinements, >= 1
  std::uint64_t seed = 0;        ///< sampling offset seed (with the step)
  bool truncate = false;         ///< keep only the k largest of C
  bool reuse_threshold = false;  ///< start from the previous step's final threshold

  static constexpr bool reads_gradient = false;  ///< ranks acc alone (concepts.hpp, selector_reads_gradient)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"density", &sampled_threshold::density},
                      setting{"sample_ratio", &sampled_threshold::sample_ratio},
                      setting{"lower", &sampled_threshold::lower},
                      setting{"upper", &sampled_threshold::upper},
                      setting{"max_iters", &sampled_threshold::max_iters},
                      setting{"seed", &sampled_threshold::seed},
                      setting{"truncate", &sampled_threshold::truncate},
                      setting{"reuse_threshold", &sampled_threshold::reuse_threshold}};
  }

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "sampled_threshold"; }

  /// \throws gradcomp::error naming the first parameter out of its range.
  void validate(std::size_t /*n*/) const {
    detail::require(density > 0.0 && density <= 1.0, errc::invalid_argument,
                    "sampled_threshold: density must be in (0, 1], got ", density);
    detail::require(sample_ratio > 0.0 && sample_ratio <= 1.0, errc::invalid_argument,
                    "sampled_threshold: sample_ratio must be in (0, 1], got ", sample_ratio);
    detail::require(lower > 0.0f && lower < 1.0f, errc::invalid_argument,
                    "sampled_threshold: lower must be in (0, 1), got ", lower);
    detail::require(upper >= 1.0f && std::isfinite(upper), errc::invalid_argument,
                    "sampled_threshold: upper must be finite and >= 1, got ", upper);
    detail::require(max_iters >= 1, errc::invalid_argument, "sampled_threshold: max_iters must be >= 1, got ",
                    max_iters);
  }

  /// Entries targeted for a tensor of n elements: those `density` names
  /// (detail::entries_at_density: ceil(density * n) for the decimal density meant).
  [[nodiscard]] std::size_t k(std::size_t n) const { return detail::entries_at_density(density, n); }
  /// Sample size m (>= n means: select exactly).
  [[nodiscard]] std::size_t sample_size(std::size_t n) const {
    const auto by_ratio = static_cast<std::size_t>(std::ceil(static_cast<double>(n) * sample_ratio));
    const auto by_density = static_cast<std::size_t>(std::min(static_cast<double>(n), std::ceil(2.0 / density)));
    return std::max(by_ratio, by_density);
  }
  /// Largest count sent: k with truncation, else up to upper * k.
  [[nodiscard]] std::size_t max_selected(std::size_t n) const {
    const std::size_t kk = k(n);
    if (truncate) return kk;
    return std::min(
        n, std::max(kk, static_cast<std::size_t>(std::floor(static_cast<double>(upper) * static_cast<double>(kk)))));
  }
};

}  // namespace select
GRADCOMP_NAMESPACE_END
