/// \file detail/encode_index_value.hpp
/// encode::index_value's algorithm for every backend whose messages are host memory
/// (backend::host, backend::kokkos): the selected values gathered (and scaled) by a
/// `for_each` in the backend's memory, then the message written on the host by
/// encode_message, the writer backend::cuda's engine also ends in for the codings it
/// does not write on the device, so every backend writes the same bytes. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/codecs.hpp>
#include <gradcomp/detail/float_formats.hpp>
#include <gradcomp/detail/queued_selector.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/message.hpp>

#include <cstddef>
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

/// values[j] = acc[index[j]] times the selector's value scale (saturating).
struct gather_scaled {
  const float* acc;
  const std::uint32_t* index;
  float scale;
  float* values;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { values[j] = scaled_value(acc[index[j]], scale); }
};

/// encode::index_value on a backend whose messages are host memory.
template <class Backend>
class index_value_encoding {
  static constexpr bool staged = !Backend::host_accessible;  // host copies of index, values and sent

 public:
  index_value_encoding(const Backend& be, const encode::index_value&, std::size_t /*n*/, std::size_t capacity)
      : backend_(be),
        values_(be.template allocate<float>(capacity)),
        index_host_(staged ? capacity : 0),
        values_host_(staged ? capacity : 0),
        sent_host_(staged ? capacity : 0) {}

  /// Writes the message to `out` (host memory, at least max_bytes long) and the decoded
  /// value of each entry to `sent` (the backend's memory). Returns the message size.
  std::size_t encode(const encode::index_value& policy, const encode_input& in, std::span<std::byte> out,
                     std::span<float> sent) {
    const std::size_t count = in.index.size();
    backend_.for_each(count, gather_scaled{in.acc.data(), in.index.data(), in.value_scale, values_.data()});
    const std::span<const std::uint32_t> index = on_host(backend_, in.index.data(), count, index_host_);
    const std::span<const float> values = on_host(backend_, values_.data(), count, values_host_);
    const std::span<float> sent_host = staged ? std::span<float>(sent_host_).first(count) : sent.first(count);
    const std::size_t bytes = encode_message(policy, in.acc.size(), index, values, out, sent_host, in.step);
    if constexpr (staged) backend_.to_device(sent_host.data(), count, sent.data());
    return bytes;
  }

 private:
  Backend backend_;
  typename Backend::template buffer<float> values_;  // the gathered, scaled values
  std::vector<std::uint32_t> index_host_;
  std::vector<float> values_host_, sent_host_;
};

/// Every backend without an engine of its own for encode::index_value runs the one above.
template <class Backend>
class engine<encode::index_value, Backend> : public index_value_encoding<Backend> {
 public:
  using index_value_encoding<Backend>::index_value_encoding;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
