/// \file detail/host/index_value.hpp
/// The index_value encoder on backend::host, and the message writer every backend's
/// index_value engine ends in, so all write the same bytes.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/codecs.hpp>
#include <gradcomp/detail/float_formats.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/encode/index_value.hpp>

#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Writes the message for ascending `index` with `values` (already scaled) of a tensor of
/// n elements to `out` (at least policy.max_bytes long) and the decoded value of each
/// entry to `sent`. Returns the message size.
inline std::size_t encode_message(const encode::index_value& policy, std::size_t n, std::span<const std::uint32_t> index,
                                  std::span<const float> values, std::span<std::byte> out, std::span<float> sent,
                                  std::uint64_t step) {
  message_header h;
  h.index = policy.index == index_coding::automatic ? smallest_index_coding(n, index) : policy.index;
  h.value = policy.value;
  h.n = n;
  h.count = index.size();
  std::byte* sections = out.data() + message_header::size;
  h.index_bytes = write_index_section(h.index, n, index, sections);
  const value_section_info info = write_value_section(h.value, values, sections + h.index_bytes, sent,
                                                      {.levels = policy.levels, .seed = policy.seed, .step = step});
  h.value_bytes = info.bytes;
  h.value_param = info.value_param;
  h.codec_param = info.codec_param;
  const std::size_t bytes = message_header::size + static_cast<std::size_t>(h.index_bytes + h.value_bytes);
  if (policy.checksum) h.flags |= message_header::flag_checksum;
  write_header(out.data(), h);
  if (policy.checksum) store_le<std::uint32_t>(out.data() + 12, message_checksum(out.first(bytes)));
  return bytes;
}

template <>
class engine<encode::index_value, backend::host> {
 public:
  engine(const backend::host&, const encode::index_value&, std::size_t /*n*/, std::size_t capacity)
      : values_(capacity) {}

  /// Writes the message to `out` (at least max_bytes long) and the decoded value of
  /// each entry to `sent`. Returns the message size.
  std::size_t encode(const encode::index_value& policy, const encode_input& in, std::span<std::byte> out,
                     std::span<float> sent) {
    const std::size_t count = in.index.size();
    for (std::size_t j = 0; j < count; ++j) values_[j] = scaled_value(in.acc[in.index[j]], in.value_scale);
    return encode_message(policy, in.acc.size(), in.index, std::span<const float>(values_).first(count), out, sent,
                          in.step);
  }

 private:
  std::vector<float> values_;  // gathered acc values of the selected entries
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
