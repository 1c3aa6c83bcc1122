/// \file encode/index_value.hpp
/// The message encoder: an index coding times a value coding.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/codec/sections.hpp>
#include <gradcomp/encode/codings.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
namespace encode {

/// Writes the selected entries as a message (see message.hpp and docs/wire-format.md).
/// Quantised value codings hand the values as decoded back to the corrector, so the
/// quantisation error stays in its memory.
struct index_value {
  gradcomp::index_coding index = gradcomp::index_coding::automatic;  ///< how indices are written
  gradcomp::value_coding value = gradcomp::value_coding::f32;        ///< how values are written
  std::uint32_t levels = 16;  ///< the codings that take levels (qsgd): quantisation levels, in [1, 65536]
  std::uint64_t seed = 0;     ///< the codings that round at random (qsgd): the seed (with the step)
  bool checksum = false;      ///< add a CRC-32C of the message, checked by the decoder

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const {
    std::string out = std::string("index_value(") + to_string(index) + "," + to_string(value);
    if (detail::is_wire_value_coding(value) && detail::takes_levels(value)) out += "/" + std::to_string(levels);
    return out + ")";
  }

  /// \throws gradcomp::error for an unknown coding, or levels outside [1, 65536] for a
  ///         coding that takes them.
  void validate() const {
    detail::require(index == gradcomp::index_coding::automatic || detail::is_wire_index_coding(index),
                    errc::invalid_argument, "index_value: index coding ", static_cast<unsigned>(index),
                    " is not supported");
    detail::require(detail::is_wire_value_coding(value), errc::invalid_argument, "index_value: value coding ",
                    static_cast<unsigned>(value), " is not supported");
    detail::require(!detail::takes_levels(value) || (levels >= 1 && levels <= detail::qsgd_max_levels),
                    errc::invalid_argument, "index_value: levels must be in [1, ", detail::qsgd_max_levels, "], got ",
                    levels);
  }

  /// Whether a message depends on the step number as well as on the entries (the codings
  /// that round at random draw from the seed and the step).
  [[nodiscard]] bool depends_on_step() const noexcept {
    return detail::is_wire_value_coding(value) && detail::takes_seed(value);
  }

  /// Largest message of `count` entries of a tensor of `n` elements.
  [[nodiscard]] std::size_t max_bytes(std::size_t n, std::size_t count) const noexcept {
    return message_header::size + static_cast<std::size_t>(detail::max_index_section_bytes(index, n, count) +
                                                           detail::value_section_bytes(value, count, levels));
  }
};

}  // namespace encode
GRADCOMP_NAMESPACE_END
