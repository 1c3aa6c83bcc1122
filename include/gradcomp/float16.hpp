/// \file float16.hpp
/// Gradients in 16 bits: IEEE binary16 (`half`) and bfloat16 as they are stored, so a
/// half or bfloat16 tensor of a framework (c10::Half, c10::BFloat16, __half,
/// __nv_bfloat16, _Float16: each 16 bits of the same layout) is passed without a copy.
/// A compressor reads them as they are, each value widened to float32 exactly as it is
/// read; state and arithmetic stay float32.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/float_formats.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN

/// IEEE 754 binary16, as stored: its 16 bits.
struct half {
  std::uint16_t bits = 0;  ///< sign, 5 exponent bits, 10 fraction bits
};

/// bfloat16 (the top half of a binary32), as stored: its 16 bits.
struct bfloat16 {
  std::uint16_t bits = 0;  ///< sign, 8 exponent bits, 7 fraction bits
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

/// The value of a binary16, exactly (infinities and NaNs included).
GRADCOMP_HOST_DEVICE constexpr float to_float(half h) noexcept { return detail::half_to_float(h.bits); }
/// The value of a bfloat16, exactly (infinities and NaNs included).
GRADCOMP_HOST_DEVICE constexpr float to_float(bfloat16 b) noexcept { return detail::bfloat_to_float(b.bits); }
/// A float32 as it is: so that code reading any gradient element type reads to_float(g[i]).
GRADCOMP_HOST_DEVICE constexpr float to_float(float f) noexcept { return f; }

namespace detail {

/// The 16-bit gradient element types.
template <class T>
concept narrow_float = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// The element types of a gradient a compressor takes.
template <class T>
concept gradient_element = std::is_same_v<T, float> || narrow_float<T>;

/// to[i] = the float value of from[i]: the body of a backend's for_each.
template <narrow_float T>
struct widen_to_float {
  const T* from;
  float* to;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const noexcept { to[i] = to_float(from[i]); }
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
