/// \file encode/index_value.hpp
/// The message encoder: an index coding times a value coding.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/codecs.hpp>
#include <gradcomp/encode/codings.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>

#include <cstddef>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
namespace encode {

/// Writes the selected entries as a message (see message.hpp for the layout).
struct index_value {
  gradcomp::index_coding index = gradcomp::index_coding::raw32;  ///< how indices are written
  gradcomp::value_coding value = gradcomp::value_coding::f32;    ///< how values are written
  bool checksum = false;  ///< append a CRC-32C of the payload, checked by the decoder

  [[nodiscard]] std::string name() const {
    return std::string("index_value(") + to_string(index) + "," + to_string(value) + ")";
  }

  /// \throws gradcomp::error for a coding this build does not implement.
  void validate() const {
    detail::require(index == gradcomp::index_coding::automatic || detail::is_wire_index_coding(index),
                    errc::invalid_argument, "index_value: index coding ", static_cast<unsigned>(index),
                    " is not supported");
    detail::require(detail::is_wire_value_coding(value), errc::invalid_argument, "index_value: value coding ",
                    static_cast<unsigned>(value), " is not supported");
  }

  /// The resolved index coding for a message of `count` of `n` entries: `automatic`
  /// picks the smallest.
  [[nodiscard]] gradcomp::index_coding index_for(std::size_t n, std::size_t count) const noexcept {
    if (index != gradcomp::index_coding::automatic) return index;
    (void)n;
    (void)count;
    return gradcomp::index_coding::raw32;
  }

  /// Largest message of `count` entries of a tensor of `n` elements.
  [[nodiscard]] std::size_t max_bytes(std::size_t n, std::size_t count) const noexcept {
    return message_header::size +
           static_cast<std::size_t>(detail::index_section_bytes(index_for(n, count), n, count) +
                                    detail::value_section_bytes(value, count));
  }
};

}  // namespace encode
GRADCOMP_NAMESPACE_END

#include <gradcomp/detail/host/index_value.hpp>
