// The DDP hook's frames as its all-gather sends them, for the tests of the decoder that
// reads them (detail::message_decoder::queue_framed_add, device_accumulator's).
#pragma once

#include <gradcomp/detail/codec/decode.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace frames {

// The format a frame's reader expects of `bytes` (the encoder the ranks agreed on): the
// codings, levels and checksum flag its header names, f32 and raw32 where it names none
// it knows.
inline gradcomp::encode::index_value format_named_by(const std::vector<std::byte>& bytes) {
  gradcomp::encode::index_value f{.index = gradcomp::index_coding::raw32, .value = gradcomp::value_coding::f32};
  if (bytes.size() < gradcomp::message_header::size) return f;
  const auto index = static_cast<gradcomp::index_coding>(bytes[6]);
  const auto value = static_cast<gradcomp::value_coding>(bytes[7]);
  if (gradcomp::detail::is_wire_index_coding(index)) f.index = index;
  if (gradcomp::detail::is_wire_value_coding(value)) f.value = value;
  const auto levels = gradcomp::detail::load_le<std::uint32_t>(bytes.data() + 52);
  if (gradcomp::detail::takes_levels(f.value) && levels >= 1 && levels <= gradcomp::detail::qsgd_max_levels)
    f.levels = levels;
  f.checksum =
      (gradcomp::detail::load_le<std::uint32_t>(bytes.data() + 8) & gradcomp::message_header::flag_checksum) != 0;
  return f;
}

// A frame as the DDP hook's all-gather sends it: a verdict (error `code`, the message's
// size), then the message, then `slack` bytes of garbage up to the frame's bound.
inline std::vector<std::byte> frame_of(const std::vector<std::byte>& bytes, std::uint32_t code = 0,
                                       std::size_t slack = 40, std::uint64_t size = ~std::uint64_t{0}) {
  constexpr std::size_t head = gradcomp::detail::decoding::verdict_bytes;
  std::vector<std::byte> frame(head + bytes.size() + slack, std::byte{0xAB});
  gradcomp::detail::store_le<std::uint32_t>(frame.data(), code);
  gradcomp::detail::store_le<std::uint32_t>(frame.data() + 4, 0);
  gradcomp::detail::store_le<std::uint64_t>(frame.data() + 16, 0);
  gradcomp::detail::store_le<std::uint64_t>(frame.data() + 8, size != ~std::uint64_t{0} ? size : bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) frame[head + i] = bytes[i];
  return frame;
}

}  // namespace frames
