/// \file detail/core/wire.hpp
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
    using U = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                 std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
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

/// CRC-32C (Castagnoli), the checksum iSCSI and ext4 use; detects burst errors that a
/// corrupted transport would introduce in message payloads. Reflected: bit 31 of a
/// register is the coefficient of x^0.
inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;
inline constexpr std::uint32_t crc32c_init = 0xFFFFFFFFu;
GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c_final(std::uint32_t c) noexcept { return c ^ 0xFFFFFFFFu; }

/// A register shifted on by eight bits, bit by bit: a byte fed in, once it has been
/// XORed into the register's low eight bits.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c_shift_byte(std::uint32_t c) noexcept {
  for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ crc32c_polynomial : c >> 1;
  return c;
}

/// crc32c_shift_byte of each low byte (the rest of a register shifts by linearity).
inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) table[i] = crc32c_shift_byte(i);
  return table;
}();

/// A running CRC-32C register fed one more byte: by the table on the host, bit by bit on
/// a device (which has no copy of the table); the same value either way.
GRADCOMP_HOST_DEVICE inline std::uint32_t crc32c_byte(std::uint32_t c, std::byte b) noexcept {
#if defined(__CUDA_ARCH__)
  return crc32c_shift_byte(c ^ static_cast<std::uint32_t>(b));
#else
  return crc32c_table[(c ^ static_cast<std::uint32_t>(b)) & 0xFFu] ^ (c >> 8);
#endif
}

/// Feeds `size` bytes into a running CRC-32C; start from crc32c_init, end with crc32c_final.
inline std::uint32_t crc32c_update(std::uint32_t c, const std::byte* data, std::size_t size) noexcept {
  for (std::size_t i = 0; i < size; ++i) c = crc32c_byte(c, data[i]);
  return c;
}

/// a times b modulo the polynomial, both reflected.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c_multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if ((a & bit) != 0) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ crc32c_polynomial : b >> 1;
  }
  return product;
}

/// x^(8 bytes) modulo the polynomial: feeding `bytes` zero bytes multiplies a register by
/// it. Registers are linear in where they start, so the register of A then B is
/// crc32c_multiply(crc32c_zeros_factor(|B|), register of A) ^ (B's register from 0),
/// which lets pieces of a message be checksummed apart and chained.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t crc32c_zeros_factor(std::uint64_t bytes) noexcept {
  std::uint32_t factor = 1u << 31;  // x^0
  std::uint32_t power = 1u << 23;   // x^8, squared as the bits of `bytes` go by
  for (; bytes != 0; bytes >>= 1) {
    if ((bytes & 1u) != 0) factor = crc32c_multiply(power, factor);
    power = crc32c_multiply(power, power);
  }
  return factor;
}

/// A message's checksum in parallel pieces: the body after the checksum field (bytes 16
/// on) in tiles of this many bytes, each tile's register from 0 computed apart.
inline constexpr std::size_t checksum_chunk = 1024;

/// The register that tile c of the body of a message of `bytes` bytes gives from 0.
GRADCOMP_HOST_DEVICE inline std::uint32_t message_checksum_part(const std::byte* message, std::uint64_t bytes,
                                                                std::uint64_t c) noexcept {
  const std::uint64_t begin = 16 + c * checksum_chunk;
  const std::uint64_t end = begin + checksum_chunk < bytes ? begin + checksum_chunk : bytes;
  std::uint32_t reg = 0;
  for (std::uint64_t i = begin; i < end; ++i) reg = crc32c_byte(reg, message[i]);
  return reg;
}

/// The CRC-32C of a message with its checksum field read as 0 (message.hpp's
/// message_checksum) from the registers of its body's tiles: the first 12 bytes and
/// four zeros, then each tile's register chained on.
GRADCOMP_HOST_DEVICE inline std::uint32_t message_checksum_of_parts(const std::byte* message, std::uint64_t bytes,
                                                                    const std::uint32_t* parts) noexcept {
  std::uint32_t reg = crc32c_init;
  for (std::size_t i = 0; i < 12; ++i) reg = crc32c_byte(reg, message[i]);
  for (std::size_t i = 0; i < 4; ++i) reg = crc32c_byte(reg, std::byte{0});
  const std::uint64_t body = bytes - 16;
  const std::uint32_t full_tile = crc32c_zeros_factor(checksum_chunk);
  for (std::uint64_t c = 0; c * checksum_chunk < body; ++c) {
    const std::uint64_t len = body - c * checksum_chunk < checksum_chunk ? body - c * checksum_chunk : checksum_chunk;
    const std::uint32_t factor = len == checksum_chunk ? full_tile : crc32c_zeros_factor(len);
    reg = crc32c_multiply(factor, reg) ^ parts[c];
  }
  return crc32c_final(reg);
}

inline std::uint32_t crc32c(const std::byte* data, std::size_t size) noexcept {
  return crc32c_final(crc32c_update(crc32c_init, data, size));
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
