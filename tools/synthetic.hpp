// The embedded default gradient stream of `gradcomp eval` and the benchmarks: heavy-tailed
// like real gradients (a few coordinates dominate), with a persistent direction so that
// aggregates carry signal. Reproducible on every platform: a counter-based generator.
#pragma once

#include <gradcomp/detail/core/random.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace synthetic {

/// Standard normal from two counter-based uniforms (Box-Muller).
inline double normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  const double u1 = 1.0 - gradcomp::detail::random_unit(seed, stream, 2 * i);
  const double u2 = gradcomp::detail::random_unit(seed, stream, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Step `step` of a stream of n-element gradients: g_i = s_i * (0.2 * m_i + t3 noise),
/// with log-normal per-coordinate scales s_i (sigma 1.5), a fixed direction m_i and
/// Student-t noise with 3 degrees of freedom.
inline std::vector<float> gradient(std::size_t n, std::uint64_t step, std::uint64_t seed = 2018) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double scale = std::exp(1.5 * normal(seed, 0, i));
    const double direction = normal(seed, 1, i);
    const double z = normal(seed, 2 + 4 * step, i);
    double chi2 = 0.0;
    for (std::uint64_t d = 0; d < 3; ++d) {
      const double w = normal(seed, 3 + 4 * step + d, i);
      chi2 += w * w;
    }
    g[i] = static_cast<float>(1e-3 * scale * (0.2 * direction + z / std::sqrt(chi2 / 3.0 + 1e-12)));
  }
  return g;
}

}  // namespace synthetic
