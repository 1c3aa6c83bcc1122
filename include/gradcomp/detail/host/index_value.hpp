/// \file detail/host/index_value.hpp
/// The index_value encoder on backend::host.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/encode_message.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/encode/index_value.hpp>

#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

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
    for (std::size_t j = 0; j < count; ++j) values_[j] = in.acc[in.index[j]] * in.value_scale;
    return encode_message(policy, in.acc.size(), in.index, std::span<const float>(values_).first(count), out, sent,
                          in.step);
  }

 private:
  std::vector<float> values_;  // gathered acc values of the selected entries
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
