/// \file detail/codec/sections.hpp
/// Reading and writing the index and value sections of a message, one place per
/// coding so that the decoder's checks and the encoder's layout cannot drift. Not API.
///
/// Bit-packed data (delta_bitpack, bitmap, ternary, qsgd) is little-endian and
/// LSB-first: bit b of the section is bit (b % 8) of byte b / 8.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/float_formats.hpp>
#include <gradcomp/detail/core/random.hpp>
#include <gradcomp/detail/core/wire.hpp>
#include <gradcomp/detail/codec/value_codings.hpp>
#include <gradcomp/encode/codings.hpp>
#include <gradcomp/error.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::size_t delta_block = 128;  // gaps per delta_bitpack block

GRADCOMP_HOST_DEVICE constexpr bool is_wire_index_coding(index_coding c) noexcept {
  return c == index_coding::raw32 || c == index_coding::delta_bitpack || c == index_coding::bitmap;
}

// -- bit streams ----------------------------------------------------------------------

/// Reads `bits` (<= 32) bits at `bit_offset`, touching only the bytes that hold them.
GRADCOMP_HOST_DEVICE inline std::uint32_t read_bits(const std::byte* data, std::uint64_t bit_offset,
                                                    unsigned bits) noexcept {
  if (bits == 0) return 0;
  const std::byte* p = data + bit_offset / 8;
  const unsigned shift = static_cast<unsigned>(bit_offset % 8);
  const unsigned bytes = (shift + bits + 7) / 8;
  std::uint64_t v = 0;
  for (unsigned b = 0; b < bytes; ++b) v |= static_cast<std::uint64_t>(p[b]) << (8 * b);
  return static_cast<std::uint32_t>((v >> shift) & ((std::uint64_t{1} << bits) - 1));
}

/// Whether the bits of `data` (`bytes` long) from bit `used` on are all zero: the
/// padding of a bit-packed section, which the canonical form leaves zero.
GRADCOMP_HOST_DEVICE inline bool padding_is_zero(const std::byte* data, std::uint64_t used,
                                                 std::uint64_t bytes) noexcept {
  if (used >= 8 * bytes) return true;
  const unsigned tail = static_cast<unsigned>(used % 8);
  std::uint64_t b = used / 8;
  if (tail != 0 && (static_cast<unsigned>(data[b++]) >> tail) != 0) return false;
  for (; b < bytes; ++b) {
    if (data[b] != std::byte{0}) return false;
  }
  return true;
}

// -- section sizes --------------------------------------------------------------------

GRADCOMP_HOST_DEVICE constexpr std::uint64_t bitmap_bytes(std::uint64_t n) noexcept { return (n + 7) / 8; }

/// Blocks of `per_block` that `items` fill (the last one partly).
GRADCOMP_HOST_DEVICE constexpr std::size_t blocks_of(std::size_t items, std::size_t per_block) noexcept {
  return (items + per_block - 1) / per_block;
}

/// Largest index section a coding can need for `count` of `n` entries.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t max_index_section_bytes(index_coding c, std::uint64_t n,
                                                                     std::uint64_t count) noexcept {
  switch (c) {
    case index_coding::raw32:
      return 4 * count;
    case index_coding::delta_bitpack:
      return 4 * count + (count + delta_block - 1) / delta_block;
    case index_coding::bitmap:
      return bitmap_bytes(n);
    case index_coding::automatic:  // auto never exceeds either
      return 4 * count < bitmap_bytes(n) ? 4 * count : bitmap_bytes(n);
  }
  return 0;
}

// -- decoding -------------------------------------------------------------------------

/// Checks the section lengths and coding parameters of a parsed header.
template <class Header>
void check_section_sizes(const Header& h) {
  switch (h.index) {
    case index_coding::raw32:
    case index_coding::bitmap: {
      const auto want = max_index_section_bytes(h.index, h.n, h.count);
      require(h.index_bytes == want, errc::corrupt_message, "message index section is ", h.index_bytes, " bytes, ",
              to_string(h.index), " with n = ", h.n, " and count = ", h.count, " needs ", want);
      break;
    }
    case index_coding::delta_bitpack:  // exact size checked while parsing
      require(h.index_bytes <= max_index_section_bytes(h.index, h.n, h.count), errc::corrupt_message,
              "message index section of ", h.index_bytes,
              " bytes is larger than delta_bitpack allows for count = ", h.count);
      break;
    case index_coding::automatic:
      break;
  }
  visit_value_coding(h.value, [&](auto coding) {
    using C = decltype(coding);
    if constexpr (C::takes_levels) {
      require(h.codec_param >= 1 && h.codec_param <= qsgd_max_levels, errc::corrupt_message, "message ", C::name,
              " levels = ", h.codec_param, " is outside [1, ", qsgd_max_levels, "]");
    } else {
      require(h.codec_param == 0, errc::corrupt_message, "message value coding ", C::name,
              " takes no codec parameter, the header carries ", h.codec_param);
    }
    if constexpr (C::has_param) {
      require(std::isfinite(h.value_param) && h.value_param >= 0.0f, errc::corrupt_message, "message ", C::name,
              " scale = ", h.value_param, " is not a finite non-negative number");
    } else {
      require(std::bit_cast<std::uint32_t>(h.value_param) == 0, errc::corrupt_message, "message value coding ", C::name,
              " takes no scale, the header carries ", h.value_param);
    }
  });
  const auto want_value = value_section_bytes(h.value, h.count, h.codec_param);
  require(h.value_bytes == want_value, errc::corrupt_message, "message value section is ", h.value_bytes, " bytes, ",
          to_string(h.value), " with count = ", h.count, " needs ", want_value);
}

/// Decodes the index section, calling `f(index)` (a 64-bit index, so a hostile gap
/// cannot wrap around) for each entry, at most `count` times. Range and order are the
/// caller's to check; structural errors throw here.
template <class Header, class F>
void validate_index_section(const Header& h, const std::byte* section, F&& f) {
  switch (h.index) {
    case index_coding::raw32:
      for (std::uint64_t j = 0; j < h.count; ++j) f(std::uint64_t{load_le<std::uint32_t>(section + 4 * j)});
      return;
    case index_coding::bitmap: {
      const std::uint64_t bytes = bitmap_bytes(h.n);
      const unsigned tail = static_cast<unsigned>(h.n % 8);
      require(tail == 0 || (static_cast<unsigned>(section[bytes - 1]) >> tail) == 0, errc::corrupt_message,
              "message bitmap has bits set beyond n = ", h.n);
      std::uint64_t seen = 0;
      for (std::uint64_t b = 0; b < bytes; ++b) {
        unsigned byte = static_cast<unsigned>(section[b]);
        seen += static_cast<std::uint64_t>(std::popcount(byte));
        require(seen <= h.count, errc::corrupt_message, "message bitmap holds more than count = ", h.count, " bits");
        while (byte != 0) {
          f(8 * b + static_cast<unsigned>(std::countr_zero(byte)));
          byte &= byte - 1;
        }
      }
      return;
    }
    case index_coding::delta_bitpack: {
      std::uint64_t at = 0;
      std::uint64_t next = 0;  // previous index + 1
      for (std::uint64_t start = 0; start < h.count; start += delta_block) {
        const std::uint64_t len = std::min<std::uint64_t>(delta_block, h.count - start);
        require(at < h.index_bytes, errc::corrupt_message, "message delta_bitpack section ends before block ",
                start / delta_block);
        const unsigned width = static_cast<unsigned>(section[at++]);
        require(width <= 32, errc::corrupt_message, "message delta_bitpack block ", start / delta_block,
                " has bit width ", width);
        const std::uint64_t payload = (len * width + 7) / 8;
        require(payload <= h.index_bytes - at, errc::corrupt_message, "message delta_bitpack block ",
                start / delta_block, " overruns the index section");
        for (std::uint64_t j = 0; j < len; ++j) {
          const std::uint64_t index = next + read_bits(section + at, j * width, width);
          f(index);
          next = index + 1;
        }
        require(padding_is_zero(section + at, len * width, payload), errc::corrupt_message,
                "message delta_bitpack block ", start / delta_block, " has nonzero padding bits");
        at += payload;
      }
      require(at == h.index_bytes, errc::corrupt_message, "message delta_bitpack section has ", h.index_bytes - at,
              " bytes after its last block");
      return;
    }
    case index_coding::automatic:
      return;
  }
}

/// Checks that the value section's bits after the last entry are zero, for the codings
/// whose fields are not whole bytes (ternary, qsgd, int4): the canonical form the encoder
/// writes.
template <class Header>
void check_value_padding(const Header& h, const std::byte* section) {
  if (value_entry_bits(h.value, h.codec_param) % 8 == 0) return;
  const std::uint64_t used = value_used_bits(h.value, h.count, h.codec_param);
  require(padding_is_zero(section, used, h.value_bytes), errc::corrupt_message, "message ", to_string(h.value),
          " value section has nonzero padding bits after its ", h.count, " entries");
}

/// Decodes an index section that validate_index_section has accepted.
template <class Header, class F>
void for_each_index(const Header& h, const std::byte* section, F&& f) {
  validate_index_section(h, section, [&](std::uint64_t index) { f(static_cast<std::uint32_t>(index)); });
}

/// Entry j's field of a value section whose entries are `bits` wide: whole bytes
/// little-endian, or packed LSB-first.
GRADCOMP_HOST_DEVICE inline std::uint32_t value_field(const std::byte* section, std::size_t j, unsigned bits) noexcept {
  switch (bits) {
    case 32:
      return load_le<std::uint32_t>(section + 4 * j);
    case 16:
      return load_le<std::uint16_t>(section + 2 * j);
    case 8:
      return static_cast<std::uint32_t>(section[j]);
    default:
      return read_bits(section, std::uint64_t{j} * bits, bits);
  }
}

/// Random access to the decoded values of a section in coding `Coding`, known at compile
/// time: a byte-aligned coding reads its field at its constant width (a plain load), a
/// packed one at the header's.
template <class Coding>
struct coded_values {
  const std::byte* section;
  float param;
  std::uint32_t levels;
  unsigned bits;
  GRADCOMP_HOST_DEVICE float operator()(std::size_t j) const noexcept {
    if constexpr (Coding::scale_block != 0) {  // the entry's block: its scale, then its fields
      const std::byte* block = section + j / Coding::scale_block * scaled_block_bytes<Coding>();
      return Coding::decode(value_field(block + 4, j % Coding::scale_block, Coding::entry_bits(levels)),
                            load_le<float>(block), levels);
    } else {
      const unsigned width = Coding::byte_aligned ? Coding::entry_bits(levels) : bits;
      return Coding::decode(value_field(section, j, width), param, levels);
    }
  }
};

/// Random access to decoded values of a section whose header passed check_section_sizes.
class value_decoder {
 public:
  template <class Header>
  GRADCOMP_HOST_DEVICE value_decoder(const Header& h, const std::byte* section) noexcept
      : coding_(h.value),
        section_(section),
        param_(h.value_param),
        levels_(h.codec_param),
        bits_(value_entry_bits(h.value, h.codec_param)) {}

  /// f(coded_values<C>{...}) for the section's coding C: a pass over many entries
  /// dispatches on the coding once, not once per entry.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return visit_value_coding(coding_, [&](auto coding) {
      return f(coded_values<decltype(coding)>{section_, param_, levels_, bits_});
    });
  }

  GRADCOMP_HOST_DEVICE float operator()(std::size_t j) const noexcept {
    return visit_value_coding(coding_, [&](auto coding) {
      return coded_values<decltype(coding)>{section_, param_, levels_, bits_}(j);
    });
  }

 private:
  value_coding coding_;
  const std::byte* section_;
  float param_;
  std::uint32_t levels_;
  unsigned bits_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
