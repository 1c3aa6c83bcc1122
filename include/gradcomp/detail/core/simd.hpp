/// \file detail/core/simd.hpp
/// The one SIMD idiom the host passes need: a bit mask of which of 16 floats have a
/// magnitude key at or above a bound. With it a pass skips the (vast majority of)
/// groups with no hit at the speed of a streaming read, and visits hits by bit scan.
/// SSE2 is part of x86-64, so only non-x86 builds take the portable loop. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/radix_select.hpp>

#include <bit>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::size_t mask_group = 16;

/// Index of the lowest set bit of m != 0, on host and device.
GRADCOMP_HOST_DEVICE inline unsigned lowest_bit(std::uint32_t m) noexcept {
#if defined(__CUDA_ARCH__)
  return static_cast<unsigned>(__ffs(static_cast<int>(m)) - 1);
#else
  return static_cast<unsigned>(std::countr_zero(m));
#endif
}

/// Bits set in a 16-bit mask (baseline x86-64 has no popcnt instruction: a nibble table).
GRADCOMP_HOST_DEVICE inline std::uint32_t popcount16(std::uint32_t m) noexcept {
  constexpr std::uint8_t nibble[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
  return nibble[m & 15u] + nibble[(m >> 4) & 15u] + nibble[(m >> 8) & 15u] + nibble[(m >> 12) & 15u];
}

/// Bit j set when magnitude_key(x[j]) >= low, for j < 16. Callable from Kokkos device
/// code too (the loop there).
GRADCOMP_HOST_DEVICE inline std::uint32_t at_least_mask16(const float* x, std::uint32_t low) noexcept {
#if defined(__SSE2__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  // Keys are below 2^31, so a signed compare with low - 1 (>= -1) is exact.
  const __m128i bound = _mm_set1_epi32(static_cast<std::int32_t>(low) - 1);
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  std::uint32_t mask = 0;
  for (int q = 0; q < 4; ++q) {
    const __m128i key = _mm_and_si128(_mm_castps_si128(_mm_loadu_ps(x + 4 * q)), magnitude);
    const __m128i hit = _mm_cmpgt_epi32(key, bound);
    mask |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(hit))) << (4 * q);
  }
  return mask;
#else
  std::uint32_t mask = 0;
  for (std::uint32_t j = 0; j < 16; ++j) mask |= (magnitude_key(x[j]) >= low ? 1u : 0u) << j;
  return mask;
#endif
}

/// at_least_mask16 for the `count` floats at x, count <= 16 (bits from count on are 0).
GRADCOMP_HOST_DEVICE inline std::uint32_t at_least_mask(const float* x, std::size_t count, std::uint32_t low) noexcept {
  if (count >= mask_group) return at_least_mask16(x, low);
  std::uint32_t mask = 0;
  for (std::size_t j = 0; j < count; ++j) mask |= (magnitude_key(x[j]) >= low ? 1u : 0u) << j;
  return mask;
}

/// Appends to `out` the index first + j of every x[j], j < len, with key >= low, in
/// order; returns the new end of `out`. Sets `non_finite` if one of them is NaN or
/// infinite (those keys are above every finite bound, so they are always visited).
inline std::uint32_t* collect_at_least(const float* x, std::size_t len, std::size_t first, std::uint32_t low,
                                       std::uint32_t* out, bool& non_finite) noexcept {
  std::size_t j = 0;
  for (; j + mask_group <= len; j += mask_group) {
    std::uint32_t mask = at_least_mask16(x + j, low);
    if (mask == 0) continue;
    non_finite |= at_least_mask16(x + j, non_finite_key) != 0;
    while (mask != 0) {
      *out++ = static_cast<std::uint32_t>(first + j + static_cast<std::size_t>(std::countr_zero(mask)));
      mask &= mask - 1;
    }
  }
  for (; j < len; ++j) {
    const std::uint32_t key = magnitude_key(x[j]);
    non_finite |= key >= non_finite_key;
    *out = static_cast<std::uint32_t>(first + j);
    out += key >= low ? 1 : 0;
  }
  return out;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
