// Seeded test inputs of awkward sizes and shapes (no gradcomp code).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace inputs {

enum class shape { normal, student_t3, log_normal, ties, all_zero, tiny_and_signed_zero, sparse_spikes };

inline std::string name(shape s) {
  switch (s) {
    case shape::normal:
      return "normal";
    case shape::student_t3:
      return "student_t3";
    case shape::log_normal:
      return "log_normal";
    case shape::ties:
      return "ties";
    case shape::all_zero:
      return "all_zero";
    case shape::tiny_and_signed_zero:
      return "tiny_and_signed_zero";
    case shape::sparse_spikes:
      return "sparse_spikes";
  }
  return "?";
}

inline constexpr shape all_shapes[] = {shape::normal,   shape::student_t3,           shape::log_normal,   shape::ties,
                                       shape::all_zero, shape::tiny_and_signed_zero, shape::sparse_spikes};
inline constexpr std::size_t awkward_sizes[] = {1, 7, 1000, (std::size_t{1} << 20) + 3};

inline std::vector<float> make(shape s, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(s) + 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::chi_squared_distribution<double> chi2(3.0);
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> x(n);
  for (auto& v : x) {
    switch (s) {
      case shape::normal:
        v = static_cast<float>(normal(rng));
        break;
      case shape::student_t3:
        v = static_cast<float>(normal(rng) / std::sqrt(chi2(rng) / 3.0));
        break;
      case shape::log_normal:
        v = static_cast<float>((unit(rng) < 0.5 ? -1.0 : 1.0) * std::exp(3.0 * normal(rng)));
        break;
      case shape::ties:
        v = static_cast<float>(small(rng)) * 0.5f;
        break;
      case shape::all_zero:
        v = 0.0f;
        break;
      case shape::tiny_and_signed_zero: {
        const double u = unit(rng);
        v = u < 0.3   ? -0.0f
            : u < 0.6 ? 0.0f
                      : static_cast<float>(normal(rng)) * std::numeric_limits<float>::denorm_min() * 1000.0f;
        break;
      }
      case shape::sparse_spikes:
        v = unit(rng) < 0.001 ? static_cast<float>(1e30 * normal(rng)) : 1e-30f;
        break;
    }
  }
  return x;
}

}  // namespace inputs
