/// \file detail/core/float_formats.hpp
/// binary16 and bfloat16 conversions in integer arithmetic: round to nearest even,
/// saturating at the largest finite value, identical on every backend; and the scaled
/// value that every backend's encoder codes. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/bits.hpp>

#include <bit>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Shifts `m` right by `s` (1 <= s <= 31), rounding to nearest, ties to even.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t shift_round_even(std::uint32_t m, unsigned s) noexcept {
  const std::uint32_t q = m >> s;
  const std::uint32_t rem = m & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

/// float -> binary16 bits. Finite inputs only (the compressor rejects the others).
GRADCOMP_HOST_DEVICE constexpr std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = bits_of(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7BFFu);  // rounds past 65504: saturate
  if (a >= 0x38800000u) {                                                   // normal half: rebias 127 -> 15
    return static_cast<std::uint16_t>(sign | shift_round_even(a - (112u << 23), 13));
  }
  const std::uint32_t e = a >> 23;  // subnormal half: value = m * 2^-24
  if (e < 102) return sign;         // below 2^-25: rounds to zero
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | shift_round_even(m, 126u - e));
}

/// binary16 bits -> float, exact. NaN and infinity encodings give NaN and infinity.
GRADCOMP_HOST_DEVICE constexpr float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  const std::uint32_t m = h & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1.0p-24f;
    return sign ? -v : v;
  }
  if (e == 31) return float_of(sign | 0x7F800000u | (m << 13));
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

/// float -> bfloat16 bits, round to nearest even, saturating. Finite inputs only.
GRADCOMP_HOST_DEVICE constexpr std::uint16_t float_to_bfloat(float f) noexcept {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F7F8000u) return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7F7Fu);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

GRADCOMP_HOST_DEVICE constexpr float bfloat_to_float(std::uint16_t b) noexcept {
  return float_of(static_cast<std::uint32_t>(b) << 16);
}

/// The largest finite float.
inline constexpr float largest_float = 3.40282347e+38f;

/// v * scale, rounded once and saturated at the largest finite float: a finite value
/// times a finite factor (random_k's unbiased n / k) never reaches a message as an
/// infinity, which the receiver would refuse. Every backend's encoder codes this.
GRADCOMP_HOST_DEVICE inline float scaled_value(float v, float scale) noexcept {
  const float x = v * scale;
  return x > largest_float ? largest_float : (x < -largest_float ? -largest_float : x);
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
