/// \file encode/coding_ids.hpp
/// The numbers of the index and value codings, as the wire format writes them; what
/// encode/codings.hpp, which includes this, and the codings' definitions name them by.
#pragma once

#include <gradcomp/config.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN

/// How the index section is written. The numeric values are part of the wire format.
enum class index_coding : std::uint8_t {
  automatic = 0,      ///< encoder only: the smallest of the codings below for each message
  raw32 = 1,          ///< one little-endian uint32 per entry
  delta_bitpack = 2,  ///< gaps between indices in blocks of 128, each at its widest gap's bit width
  bitmap = 3,         ///< one bit per element of the dense tensor
};

/// How the value section is written. The numeric values are part of the wire format;
/// each coding is a struct of detail/codec/value_codings.hpp (its name, layout and
/// arithmetic).
enum class value_coding : std::uint8_t {
  f32 = 1,      ///< IEEE binary32, exact
  f16 = 2,      ///< IEEE binary16, round to nearest even, saturating at +-65504
  bf16 = 3,     ///< bfloat16, round to nearest even, saturating at the largest finite
  int8 = 4,     ///< round(v / scale) in [-127, 127], scale = max|v| / 127
  ternary = 5,  ///< one sign bit per entry, one scale = mean |v| (unsent entries are the zeros)
  qsgd = 6,     ///< stochastic rounding of |v| / ||v||_2 to `levels`, a sign bit, one f32 norm
  int4 = 7,     ///< blocks of 128 entries, each an f32 scale = its max|v| / 7 and 4-bit round(v / scale)
};

/// Lower-case name of an index coding, as used in messages and the CLI.
constexpr const char* to_string(index_coding c) noexcept {
  switch (c) {
    case index_coding::automatic:
      return "auto";
    case index_coding::raw32:
      return "raw32";
    case index_coding::delta_bitpack:
      return "delta_bitpack";
    case index_coding::bitmap:
      return "bitmap";
  }
  return "unknown";
}

GRADCOMP_NAMESPACE_END
