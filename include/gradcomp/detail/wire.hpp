/// \file detail/wire.hpp
/// Little-endian loads and stores on byte spans, and CRC-32C. Not API.
#pragma once

#include <gradcomp/config.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <class T>
GRADCOMP_HOST_DEVICE constexpr T byteswap_if_big(T v) noexcept {
  if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
    return v;
  } else {
    using U = std::conditional_t<sizeof(T) == 2, std::uint16_t, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
    auto u = std::bit_cast<U>(v);
    U r = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i) r = static_cast<U>((r << 8) | ((u >> (8 * i)) & 0xFF));
    return std::bit_cast<T>(r);
  }
}

/// Stores `v` little-endian at `p` (no alignment needed), in host or device code.
template <class T>
GRADCOMP_HOST_DEVICE inline void store_le(std::byte* p, T v) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  v = byteswap_if_big(v);
  std::memcpy(p, &v, sizeof(T));
}

/// Loads a little-endian `T` from `p` (no alignment needed).
template <class T>
GRADCOMP_HOST_DEVICE inline T load_le(const std::byte* p) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  T v;
  std::memcpy(&v, p, sizeof(T));
  return byteswap_if_big(v);
}

inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}();

/// CRC-32C (Castagnoli), the checksum iSCSI and ext4 use; detects burst errors that a
/// corrupted transport would introduce in message payloads.
/// Feeds `size` bytes into a running CRC-32C; start from crc32c_init, end with crc32c_final.
inline std::uint32_t crc32c_update(std::uint32_t c, const std::byte* data, std::size_t size) noexcept {
  for (std::size_t i = 0; i < size; ++i) c = crc32c_table[(c ^ static_cast<std::uint32_t>(data[i])) & 0xFFu] ^ (c >> 8);
  return c;
}
inline constexpr std::uint32_t crc32c_init = 0xFFFFFFFFu;
inline constexpr std::uint32_t crc32c_final(std::uint32_t c) noexcept { return c ^ 0xFFFFFFFFu; }

inline std::uint32_t crc32c(const std::byte* data, std::size_t size) noexcept {
  return crc32c_final(crc32c_update(crc32c_init, data, size));
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
