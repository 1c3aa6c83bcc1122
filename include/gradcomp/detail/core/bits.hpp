/// \file detail/core/bits.hpp
/// The bit pattern of a float and back, constexpr, in host and device code alike:
/// std::bit_cast is a host function to nvcc, so this calls the builtin behind it
/// (GCC, Clang, nvcc and MSVC all provide it). Not API.
#pragma once

#include <gradcomp/config.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

GRADCOMP_HOST_DEVICE constexpr std::uint32_t bits_of(float x) noexcept { return __builtin_bit_cast(std::uint32_t, x); }

GRADCOMP_HOST_DEVICE constexpr float float_of(std::uint32_t bits) noexcept { return __builtin_bit_cast(float, bits); }

}  // namespace detail
GRADCOMP_NAMESPACE_END
