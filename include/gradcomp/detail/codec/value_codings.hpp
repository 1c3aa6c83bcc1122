/// \file detail/codec/value_codings.hpp
/// Every value coding as one struct, and the list of them: the encoder, the decoder, the
/// header's checks, the section sizes, the names and the Python binding's options all
/// read a coding through these, so a new coding is one value_coding entry, one struct
/// here (in the list below) and one line of the conformance grid. Not API.
///
/// A coding's struct says:
/// - `id` (its value_coding, the wire format's number) and `name`;
/// - `statistic`: what the encoder gathers over all of a message's values before it
///   writes any, and `param(statistics, count)`, the header's value_param made from it
///   (`has_param`: the header carries one; a coding without one carries zero bits);
/// - `takes_levels` (the header's codec_param carries the encoder's levels) and
///   `takes_seed` (its rounding is drawn from the encoder's seed);
/// - `entry_bits(levels)`: each entry's field in the section, LSB-first; `byte_aligned`
///   codings are written entry by entry, the others byte by byte (each byte assembling
///   the fields that overlap it) with zero padding after the last;
/// - `scale_block`: 0, or the entries per block of a coding whose section is blocks, each
///   a little-endian f32 scale then its entries' fields (int4): the scale is the
///   block's own, `block_scale(max_key)` of its largest magnitude, and is the `param`
///   its entries are encoded and decoded with;
/// - `encode(v, args, j, decoded)`: entry j's field for value v, and `decoded`, what the
///   receiver reads from it; `decode(field, param, levels)`: that value, NaN for a field
///   outside the coding (which validation refuses).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/bits.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/float_formats.hpp>
#include <gradcomp/detail/core/random.hpp>
#include <gradcomp/encode/coding_ids.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::uint32_t qsgd_max_levels = 1u << 16;

/// What the encoder gathers over a message's values before writing any.
enum class value_statistic {
  none,           ///< nothing
  max_magnitude,  ///< the largest magnitude key (reduce_max)
  sum_magnitude,  ///< the sum of |v| in double (the fixed-order sum)
  sum_squares,    ///< the sum of v^2 in double (the fixed-order sum)
};

/// The statistic's value, as the plan reads it.
struct value_statistics {
  std::uint32_t max_key = 0;
  double moment = 0.0;
};

/// What encoding one entry may use besides its value.
struct value_args {
  float param;           ///< the header's value_param
  std::uint32_t levels;  ///< the encoder's levels (codings that take them)
  std::uint64_t seed;    ///< the encoder's seed (codings that round at random)
  std::uint64_t step;    ///< the step, with the seed
};

/// Bits needed to write v (0 for 0), in host and device code.
GRADCOMP_HOST_DEVICE constexpr unsigned bit_width_of(std::uint32_t v) noexcept {
  unsigned width = 0;
  while ((std::uint64_t{v} >> width) != 0) ++width;
  return width;
}

/// The value a qsgd entry decodes to; shared by encoder and decoder so `sent` matches.
GRADCOMP_HOST_DEVICE inline float qsgd_value(float norm, std::uint32_t level, std::uint32_t levels,
                                             bool negative) noexcept {
  const float v = norm * (static_cast<float>(level) / static_cast<float>(levels));
  return negative ? -v : v;
}

/// The largest scale s <= max / q for which q s stays finite (q: a coding's largest
/// integer), as the receiver computes with it.
GRADCOMP_HOST_DEVICE inline float largest_scale(std::uint32_t max_key, float q) noexcept {
  float scale = float_of(max_key) / q;
  while ((bits_of(q * scale) & 0x7FFFFFFFu) >= 0x7F800000u) scale = float_of(bits_of(scale) - 1);
  return scale;
}

/// round(v / scale) to nearest even in [-limit, limit] (0 for a zero scale), and what the
/// receiver decodes from it, `decoded`: int8's and int4's rounding, through the integer,
/// so a -0 rounding becomes +0.
GRADCOMP_HOST_DEVICE inline int symmetric_code(float v, float scale, float limit, float& decoded) noexcept {
  float q = scale > 0.0f ? std::nearbyint(v / scale) : 0.0f;
  q = q < -limit ? -limit : (q > limit ? limit : q);
  const auto code = static_cast<int>(q);
  decoded = mul_rn(static_cast<float>(code), scale);
  return code;
}

/// A coding without parameters: no statistic, no levels, no seed.
struct plain_coding {
  static constexpr value_statistic statistic = value_statistic::none;
  static constexpr bool has_param = false;
  static constexpr bool takes_levels = false;
  static constexpr bool takes_seed = false;
  static constexpr bool byte_aligned = true;
  static constexpr std::uint32_t scale_block = 0;
  GRADCOMP_HOST_DEVICE static float param(const value_statistics&, std::uint64_t) noexcept { return 0.0f; }
};

/// IEEE binary32, exact.
struct f32_coding : plain_coding {
  static constexpr value_coding id = value_coding::f32;
  static constexpr const char* name = "f32";
  GRADCOMP_HOST_DEVICE static constexpr unsigned entry_bits(std::uint32_t) noexcept { return 32; }
  GRADCOMP_HOST_DEVICE static std::uint32_t encode(float v, const value_args&, std::size_t, float& decoded) noexcept {
    decoded = v;
    return bits_of(v);
  }
  GRADCOMP_HOST_DEVICE static float decode(std::uint32_t field, float, std::uint32_t) noexcept {
    return float_of(field);
  }
};

/// IEEE binary16, round to nearest even, saturating at +-65504.
struct f16_coding : plain_coding {
  static constexpr value_coding id = value_coding::f16;
  static constexpr const char* name = "f16";
  GRADCOMP_HOST_DEVICE static constexpr unsigned entry_bits(std::uint32_t) noexcept { return 16; }
  GRADCOMP_HOST_DEVICE static std::uint32_t encode(float v, const value_args&, std::size_t, float& decoded) noexcept {
    const std::uint16_t h = float_to_half(v);
    decoded = half_to_float(h);
    return h;
  }
  GRADCOMP_HOST_DEVICE static float decode(std::uint32_t field, float, std::uint32_t) noexcept {
    return half_to_float(static_cast<std::uint16_t>(field));
  }
};

/// bfloat16, round to nearest even, saturating at the largest finite.
struct bf16_coding : plain_coding {
  static constexpr value_coding id = value_coding::bf16;
  static constexpr const char* name = "bf16";
  GRADCOMP_HOST_DEVICE static constexpr unsigned entry_bits(std::uint32_t) noexcept { return 16; }
  GRADCOMP_HOST_DEVICE static std::uint32_t encode(float v, const value_args&, std::size_t, float& decoded) noexcept {
    const std::uint16_t b = float_to_bfloat(v);
    decoded = bfloat_to_float(b);
    return b;
  }
  GRADCOMP_HOST_DEVICE static float decode(std::uint32_t field, float, std::uint32_t) noexcept {
    return bfloat_to_float(static_cast<std::uint16_t>(field));
  }
};

/// round(v / scale) in [-127, 127], scale = max|v| / 127.
struct int8_coding : plain_coding {
  static constexpr value_coding id = value_coding::int8;
  static constexpr const char* name = "int8";
  static constexpr value_statistic statistic = value_statistic::max_magnitude;
  static constexpr bool has_param = true;
  GRADCOMP_HOST_DEVICE static constexpr unsigned entry_bits(std::uint32_t) noexcept { return 8; }
  /// max|v| / 127, lowered until 127 times it stays finite, as the receiver computes it.
  GRADCOMP_HOST_DEVICE static float param(const value_statistics& s, std::uint64_t) noexcept {
    return largest_scale(s.max_key, 127.0f);
  }
  GRADCOMP_HOST_DEVICE static std::uint32_t encode(float v, const value_args& a, std::size_t, float& decoded) noexcept {
    return static_cast<std::uint32_t>(symmetric_code(v, a.param, 127.0f, decoded)) & 0xFFu;
  }
  /// -128 is outside the coding: it decodes to NaN, which validation refuses.
  GRADCOMP_HOST_DEVICE static float decode(std::uint32_t field, float param, std::uint32_t) noexcept {
    const auto q = static_cast<std::int8_t>(static_cast<std::uint8_t>(field));
    return q == -128 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(q) * param;
  }
};

/// One sign bit per entry, one scale = mean |v| (unsent entries are the zeros).
struct ternary_coding : plain_coding {
  static constexpr value_coding id = value_coding::ternary;
  static constexpr const char* name = "ternary";
  static constexpr value_statistic statistic = value_statistic::sum_magnitude;
  static constexpr bool has_param = true;
  static constexpr bool byte_aligned = false;
  GRADCOMP_HOST_DEVICE static constexpr unsigned entry_bits(std::uint32_t) noexcept { return 1; }
  GRADCOMP_HOST_DEVICE static float param(const value_statistics& s, std::uint64_t count) noexcept {
    return count > 0 ? static_cast<float>(s.moment / static_cast<double>(count)) : 0.0f;
  }
  GRADCOMP_HOST_DEVICE static std::uint32_t encode(float v, const value_args& a, std::size_t, float& decoded) noexcept {
    const bool negative = (bits_of(v) >> 31) != 0;
    decoded = negative ? -a.param : a.param;
    return negative ? 1u : 0u;
  }
  GRADCOMP_HOST_DEVICE static float decode(std::uint32_t field, float param, std::uint32_t) noexcept {
    return field != 0 ? -param : param;
  }
};

/// Stochastic rounding of |v| / ||v||_2 to `levels`, a sign bit, one f32 norm.
struct qsgd_coding : plain_coding {
  static constexpr value_coding id = value_coding::qsgd;
  static constexpr const char* name = "qsgd";
  static constexpr value_statistic statistic = value_statistic::sum_squares;
  static constexpr bool has_param = true;
  static constexpr bool takes_levels = true;
  static constexpr bool takes_seed = true;
  static constexpr bool byte_aligned = false;
  /// A sign bit and a level in [0, levels].
  GRADCOMP_HOST_DEVICE static constexpr unsigned entry_bits(std::uint32_t levels) noexcept {
    return 1u + bit_width_of(levels);
  }
  /// The norm goes on the wire as a float: saturated there.
  GRADCOMP_HOST_DEVICE static float param(const value_statistics& s, std::uint64_t) noexcept {
    const double norm = std::sqrt(s.moment);
    return static_cast<float>(norm < static_cast<double>(largest_float) ? norm : static_cast<double>(largest_float));
  }
  GRADCOMP_HOST_DEVICE static std::uint32_t encode(float v, const value_args& a, std::size_t j,
                                                   float& decoded) noexcept {
    const bool negative = (bits_of(v) >> 31) != 0;
    std::uint32_t level = 0;
    if (a.param > 0.0f) {
      const double magnitude = float_of(bits_of(v) & 0x7FFFFFFFu);
      const double r = mul_rn(magnitude / static_cast<double>(a.param), static_cast<double>(a.levels));
      const double below = std::floor(r);
      level = static_cast<std::uint32_t>(below) + (random_unit(a.seed, a.step, j) < r - below ? 1u : 0u);
      level = level < a.levels ? level : a.levels;
    }
    decoded = qsgd_value(a.param, level, a.levels, negative);
    return (level << 1) | (negative ? 1u : 0u);
  }
  /// A level above `levels` is outside the coding: NaN, which validation refuses.
  GRADCOMP_HOST_DEVICE static float decode(std::uint32_t field, float param, std::uint32_t levels) noexcept {
    const std::uint32_t level = field >> 1;
    if (level > levels) return std::numeric_limits<float>::quiet_NaN();
    return qsgd_value(param, level, levels, (field & 1u) != 0);
  }
};

/// Blocks of 128 entries (the last may be shorter), each an f32 scale = the block's
/// max|v| / 7 and, per entry, round(v / scale) to nearest (ties to even) in [-7, 7] as a
/// 4-bit two's complement field, LSB-first: ZeRO++'s block quantization (qgZ).
struct int4_coding : plain_coding {
  static constexpr value_coding id = value_coding::int4;
  static constexpr const char* name = "int4";
  static constexpr bool byte_aligned = false;
  static constexpr std::uint32_t scale_block = 128;
  GRADCOMP_HOST_DEVICE static constexpr unsigned entry_bits(std::uint32_t) noexcept { return 4; }
  GRADCOMP_HOST_DEVICE static float block_scale(std::uint32_t max_key) noexcept { return largest_scale(max_key, 7.0f); }
  GRADCOMP_HOST_DEVICE static std::uint32_t encode(float v, const value_args& a, std::size_t, float& decoded) noexcept {
    return static_cast<std::uint32_t>(symmetric_code(v, a.param, 7.0f, decoded)) & 0xFu;
  }
  /// -8, and a scale that is not finite or has its sign bit set (the encoder writes
  /// neither), are outside the coding: NaN, which validation refuses.
  GRADCOMP_HOST_DEVICE static float decode(std::uint32_t field, float param, std::uint32_t) noexcept {
    const int q = static_cast<int>(field & 0xFu) - ((field & 0x8u) != 0 ? 16 : 0);
    return q == -8 || bits_of(param) >= 0x7F800000u ? std::numeric_limits<float>::quiet_NaN()
                                                    : static_cast<float>(q) * param;
  }
};

/// The list of value codings.
template <class... Codings>
struct value_coding_list {};
using all_value_codings =
    value_coding_list<f32_coding, f16_coding, bf16_coding, int8_coding, ternary_coding, qsgd_coding, int4_coding>;

/// f(C{}) for the struct C of coding `c` (which must be one of the list's: is_wire_value_coding).
template <class F, class First, class... Rest>
GRADCOMP_HOST_DEVICE constexpr decltype(auto) visit_value_coding(value_coding c, F&& f,
                                                                 value_coding_list<First, Rest...> = {}) {
  if constexpr (sizeof...(Rest) == 0) {
    return f(First{});
  } else {
    if (c == First::id) return f(First{});
    return visit_value_coding(c, static_cast<F&&>(f), value_coding_list<Rest...>{});
  }
}
template <class F>
GRADCOMP_HOST_DEVICE constexpr decltype(auto) visit_value_coding(value_coding c, F&& f) {
  return visit_value_coding(c, static_cast<F&&>(f), all_value_codings{});
}

/// Whether `c` is a value coding of the list (one a message may carry).
template <class... Codings>
constexpr bool is_listed(value_coding c, value_coding_list<Codings...>) noexcept {
  return ((c == Codings::id) || ...);
}
constexpr bool is_wire_value_coding(value_coding c) noexcept { return is_listed(c, all_value_codings{}); }

/// Whether coding `c` takes the encoder's levels (qsgd), and its seed.
GRADCOMP_HOST_DEVICE constexpr bool takes_levels(value_coding c) noexcept {
  return visit_value_coding(c, [](auto coding) { return decltype(coding)::takes_levels; });
}
GRADCOMP_HOST_DEVICE constexpr bool takes_seed(value_coding c) noexcept {
  return visit_value_coding(c, [](auto coding) { return decltype(coding)::takes_seed; });
}

/// The bits of entry j's field in `entry_bits`.
GRADCOMP_HOST_DEVICE constexpr unsigned value_entry_bits(value_coding c, std::uint32_t levels) noexcept {
  return visit_value_coding(c, [&](auto coding) { return decltype(coding)::entry_bits(levels); });
}

/// Bytes of one full block of a block-scaled coding: its scale and its fields.
template <class Coding>
GRADCOMP_HOST_DEVICE constexpr std::uint64_t scaled_block_bytes() noexcept {
  static_assert(Coding::scale_block * Coding::entry_bits(0) % 8 == 0, "a full block's fields fill whole bytes");
  return 4 + Coding::scale_block * Coding::entry_bits(0) / 8;
}

/// Exact value-section size for `count` entries (`levels` for the codings that take them).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t value_section_bytes(value_coding c, std::uint64_t count,
                                                                 std::uint32_t levels) noexcept {
  return visit_value_coding(c, [&](auto coding) -> std::uint64_t {
    using C = decltype(coding);
    const std::uint64_t bits = C::entry_bits(levels);
    if constexpr (C::scale_block != 0) {
      const std::uint64_t rest = count % C::scale_block;
      return count / C::scale_block * scaled_block_bytes<C>() + (rest != 0 ? 4 + (rest * bits + 7) / 8 : 0);
    } else {
      return (count * bits + 7) / 8;
    }
  });
}

/// The value section's bits up to the end of its last field: the rest, to the section's
/// end, is padding, which must be zero. Every full byte before it is fields (and scales).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t value_used_bits(value_coding c, std::uint64_t count,
                                                             std::uint32_t levels) noexcept {
  const std::uint64_t bits = value_entry_bits(c, levels);
  const std::uint32_t block = visit_value_coding(c, [](auto coding) { return decltype(coding)::scale_block; });
  const std::uint64_t last_fields = block != 0 ? count % block * bits : count * bits;  // the last block's
  return 8 * value_section_bytes(c, count, levels) - (8 - last_fields % 8) % 8;
}

}  // namespace detail

GRADCOMP_NAMESPACE_END
