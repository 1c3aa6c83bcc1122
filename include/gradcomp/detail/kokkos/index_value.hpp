/// \file detail/kokkos/index_value.hpp
/// The index_value encoder on backend::kokkos: values gathered by a parallel_for, the
/// message written on the host by the same code as backend::host. Not API.
#pragma once

#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/detail/float_formats.hpp>
#include <gradcomp/detail/kokkos/primitives.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/message.hpp>

#include <cmath>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <class Space>
class engine<encode::index_value, backend::kokkos<Space>> {
 public:
  engine(const backend::kokkos<Space>& be, const encode::index_value&, std::size_t /*n*/, std::size_t capacity)
      : space_(be.space),
        values_(be.template allocate<float>(capacity)),
        index_host_(kk::host_accessible<Space> ? 0 : capacity),
        values_host_(kk::host_accessible<Space> ? 0 : capacity),
        sent_host_(kk::host_accessible<Space> ? 0 : capacity) {}

  /// `out` is host memory; `in` and `sent` are in the space's memory.
  std::size_t encode(const encode::index_value& policy, const encode_input& in, std::span<std::byte> out,
                     std::span<float> sent) {
    const std::size_t count = in.index.size();
    const auto acc = kk::wrap<Space>(in.acc);
    const auto idx = kk::wrap<Space>(in.index);
    const auto values = values_;
    const float scale = in.value_scale;
    Kokkos::parallel_for(
        "gradcomp::gather_values", kk::range(space_, count),
        KOKKOS_LAMBDA(const std::size_t j) { values(j) = scaled_value(acc(idx(j)), scale); });
    space_.fence();
    const std::uint32_t* index_host = kk::read_on_host<Space>(in.index, index_host_);
    const float* values_host = kk::read_on_host<Space>(std::span<const float>(values_.data(), count), values_host_);
    float* sent_host = kk::write_on_host<Space>(sent.first(count), sent_host_);
    const std::size_t bytes = encode_message(policy, in.acc.size(), {index_host, count}, {values_host, count}, out,
                                             {sent_host, count}, in.step);
    kk::write_back<Space>(sent_host, sent.first(count));
    return bytes;
  }

 private:
  Space space_;
  Kokkos::View<float*, kk::memory<Space>> values_;
  std::vector<std::uint32_t> index_host_;  // host staging, empty when the space is host memory
  std::vector<float> values_host_;
  std::vector<float> sent_host_;
};

}  // namespace detail

/// `dense[i] += scale * value` for every entry of a (host) message, into a dense tensor
/// in the space's memory. Validates the whole message first; on error `dense` is
/// unchanged.
template <class Space>
void accumulate(const backend::kokkos<Space>& be, std::span<const std::byte> bytes, std::span<float> dense,
                float scale) {
  detail::require(std::isfinite(scale), errc::invalid_argument, "accumulate: scale must be finite, got ", scale);
  const detail::message_reader reader(bytes);
  detail::require(reader.header().n == dense.size(), errc::invalid_argument, "accumulate: dense.size() = ",
                  dense.size(), " does not match the message's n = ", reader.header().n);
  reader.validate_entries();
  std::vector<std::uint32_t> index;
  std::vector<float> values;
  index.reserve(static_cast<std::size_t>(reader.header().count));
  values.reserve(static_cast<std::size_t>(reader.header().count));
  reader.visit([&](std::uint32_t i, float v) {
    index.push_back(i);
    values.push_back(v);
  });
  Kokkos::View<std::uint32_t*, detail::kk::memory<Space>> idx("gradcomp::index", index.size());
  Kokkos::View<float*, detail::kk::memory<Space>> val("gradcomp::values", values.size());
  detail::kk::from_host<Space>(index.data(), std::span<std::uint32_t>(idx.data(), index.size()));
  detail::kk::from_host<Space>(values.data(), std::span<float>(val.data(), values.size()));
  const auto out = detail::kk::wrap<Space>(dense);
  Kokkos::parallel_for(
      "gradcomp::accumulate", detail::kk::range(be.space, index.size()),
      KOKKOS_LAMBDA(const std::size_t j) { out(idx(j)) += scale * val(j); });  // indices are distinct
  be.space.fence();
}

GRADCOMP_NAMESPACE_END
