/// \file encode/codings.hpp
/// How indices and values are written in a message (see message.hpp for the layout).
#pragma once

#include <gradcomp/config.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN

/// How the index section is written. The numeric values are part of the wire format.
enum class index_coding : std::uint8_t {
  automatic = 0,  ///< encoder only: the smallest implemented coding for each message
  raw32 = 1,      ///< one little-endian uint32 per entry
};

/// How the value section is written. The numeric values are part of the wire format.
enum class value_coding : std::uint8_t {
  f32 = 1,  ///< IEEE binary32, exact
};

/// Lower-case name of an index coding, as used in messages and the CLI.
constexpr const char* to_string(index_coding c) noexcept {
  switch (c) {
    case index_coding::automatic: return "auto";
    case index_coding::raw32: return "raw32";
  }
  return "unknown";
}

/// Lower-case name of a value coding, as used in messages and the CLI.
constexpr const char* to_string(value_coding c) noexcept {
  switch (c) {
    case value_coding::f32: return "f32";
  }
  return "unknown";
}

GRADCOMP_NAMESPACE_END
