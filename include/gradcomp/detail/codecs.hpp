/// \file detail/codecs.hpp
/// Reading and writing the index and value sections of a message, one place per
/// coding so that the decoder's checks and the encoder's layout cannot drift. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/wire.hpp>
#include <gradcomp/encode/codings.hpp>
#include <gradcomp/error.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
struct message_header;
namespace detail {

constexpr bool is_wire_index_coding(index_coding c) noexcept { return c == index_coding::raw32; }
constexpr bool is_wire_value_coding(value_coding c) noexcept { return c == value_coding::f32; }

/// Exact index-section size of a message with `count` of `n` entries.
constexpr std::uint64_t index_section_bytes(index_coding c, std::uint64_t /*n*/, std::uint64_t count) noexcept {
  switch (c) {
    case index_coding::raw32: return 4 * count;
    case index_coding::automatic: break;
  }
  return 0;
}

/// Exact value-section size of a message with `count` entries.
constexpr std::uint64_t value_section_bytes(value_coding c, std::uint64_t count) noexcept {
  switch (c) {
    case value_coding::f32: return 4 * count;
  }
  return 0;
}

template <class Header>
void check_section_sizes(const Header& h) {
  const auto want_index = index_section_bytes(h.index, h.n, h.count);
  require(h.index_bytes == want_index, errc::corrupt_message, "message index section is ", h.index_bytes,
          " bytes, ", to_string(h.index), " with count = ", h.count, " needs ", want_index);
  const auto want_value = value_section_bytes(h.value, h.count);
  require(h.value_bytes == want_value, errc::corrupt_message, "message value section is ", h.value_bytes,
          " bytes, ", to_string(h.value), " with count = ", h.count, " needs ", want_value);
  const bool params_used = false;  // no implemented value coding carries parameters yet
  require(params_used || (std::bit_cast<std::uint32_t>(h.value_param) == 0 && h.codec_param == 0),
          errc::corrupt_message, "message value coding ", to_string(h.value),
          " takes no parameters, but the header carries ", h.value_param, " and ", h.codec_param);
}

/// Decodes the index section, calling `f(index)` per entry; the caller checks range
/// and order (message_reader::validate_entries). Structural errors of variable-length
/// codings throw here.
template <class Header, class F>
void validate_index_section(const Header& h, const std::byte* sections, F&& f) {
  switch (h.index) {
    case index_coding::raw32:
      for (std::uint64_t j = 0; j < h.count; ++j) f(load_le<std::uint32_t>(sections + 4 * j));
      return;
    case index_coding::automatic: break;
  }
}

/// Decodes an index section that validate_index_section has accepted.
template <class Header, class F>
void for_each_index(const Header& h, const std::byte* sections, F&& f) {
  validate_index_section(h, sections, f);
}

/// Random access to decoded values of a validated value section.
class value_decoder {
 public:
  template <class Header>
  value_decoder(const Header& h, const std::byte* section) noexcept : coding_(h.value), section_(section) {}

  float operator()(std::size_t j) const noexcept {
    switch (coding_) {
      case value_coding::f32: return load_le<float>(section_ + 4 * j);
    }
    return 0.0f;
  }

 private:
  value_coding coding_;
  const std::byte* section_;
};

/// Writes the index section for ascending `indices`; returns its size.
inline std::size_t write_index_section(index_coding c, std::span<const std::uint32_t> indices, std::byte* out) noexcept {
  switch (c) {
    case index_coding::raw32:
      for (std::size_t j = 0; j < indices.size(); ++j) store_le<std::uint32_t>(out + 4 * j, indices[j]);
      return 4 * indices.size();
    case index_coding::automatic: break;
  }
  return 0;
}

/// What a value coding wrote besides the section itself.
struct value_section_info {
  std::size_t bytes = 0;
  float value_param = 0.0f;
  std::uint32_t codec_param = 0;
};

/// Writes `values[j]` for every entry and stores in `sent[j]` the value the receiver
/// will decode, so correctors keep the quantisation error.
inline value_section_info write_value_section(value_coding c, std::span<const float> values, std::byte* out,
                                              std::span<float> sent) noexcept {
  switch (c) {
    case value_coding::f32:
      for (std::size_t j = 0; j < values.size(); ++j) {
        store_le<float>(out + 4 * j, values[j]);
        sent[j] = values[j];
      }
      return {4 * values.size(), 0.0f, 0};
  }
  return {};
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
