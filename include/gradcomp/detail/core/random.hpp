/// \file detail/core/random.hpp
/// Counter-based random numbers: a value is a pure function of (seed, stream, counter),
/// so every backend and every thread draws the same numbers in any order, and sampled
/// policies never depend on the clock. Not API.
#pragma once

#include <gradcomp/config.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// SplitMix64's finaliser: a bijective mix with full avalanche (Steele et al., 2014).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// 64 random bits for (seed, stream, counter).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t random_bits(std::uint64_t seed, std::uint64_t stream,
                                                         std::uint64_t counter) noexcept {
  return mix64(mix64(seed ^ mix64(stream)) + counter);
}

/// Uniform double in [0, 1) with 53 random bits.
GRADCOMP_HOST_DEVICE constexpr double random_unit(std::uint64_t seed, std::uint64_t stream,
                                                  std::uint64_t counter) noexcept {
  return static_cast<double>(random_bits(seed, stream, counter) >> 11) * 0x1.0p-53;
}

/// Uniform integer in [0, bound), 0 < bound < 2^32 (indices are 32-bit), by Lemire's
/// multiply-shift on 32 random bits.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t random_below(std::uint64_t seed, std::uint64_t stream,
                                                          std::uint64_t counter, std::uint32_t bound) noexcept {
  const std::uint64_t r = random_bits(seed, stream, counter) >> 32;
  return static_cast<std::uint32_t>((r * bound) >> 32);
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
