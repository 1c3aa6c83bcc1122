/// \file accumulate.hpp
/// Adding a message into a dense tensor on a backend: `dense[i] += scale * value` for
/// every entry, after the whole message is checked. Messages in device memory:
/// device_messages.cuh.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>
#include <gradcomp/message.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Accumulating a message in device memory with a backend that reads messages on the
/// host is refused at compile time, naming what to do instead.
template <class Backend, class Byte, class Dense>
  requires std::is_same_v<typename Backend::message_memory, host_memory>
void accumulate(const Backend& /*context*/, device_span<Byte> /*bytes*/, Dense&& /*dense*/, float /*scale*/) {
  static_assert(detail::never<Backend>,
                "gradcomp::accumulate: this backend reads messages from host memory, and these bytes are a "
                "device_span (a message in device memory): accumulate it with backend::cuda "
                "(device_messages.cuh), or copy the message to the host first");
}

/// Entries from which accumulate() on a backend of host memory runs the decoder written
/// over the primitives rather than the sequential reader (measured crossover: about
/// 62,500 entries of a 2.5e7-element tensor, docs/benchmarks.md).
inline constexpr std::uint64_t accumulate_generic_from = std::uint64_t{1} << 16;

/// `dense[i] += scale * value` for every entry of the message (host memory), into
/// `dense` in the backend's memory, on `context` (backend::host: its threads;
/// backend::kokkos: its instance; backend::cuda: device_messages.cuh). The whole
/// message is validated first; on error `dense` is unchanged. Where the backend's
/// memory is host memory, a message of at least accumulate_generic_from entries runs
/// the decoder written over the primitives (detail/codec/decode.hpp, what
/// backend::cuda runs too) and a smaller one the host's sequential reader, the faster of
/// the two on each side (docs/benchmarks.md: at 25,000 entries the reader takes 0.29 ms
/// and the decoder 0.39; at 250,000 the reader 9–12 ms and the decoder 3.6–5.2, on one
/// thread as on two); elsewhere the message is read on the host and its entries
/// scattered by the backend.
/// \throws gradcomp::error if the message is corrupt, `dense.size()` differs from the
///         message's n, `scale` is not finite, `dense` shares memory with the message,
///         or (non_finite) some dense[i] + scale * value would not be finite.
template <class Backend>
  requires std::is_same_v<typename Backend::message_memory, host_memory>
void accumulate(const Backend& context, std::span<const std::byte> bytes, backend_span<Backend, float> dense_at,
                float scale) {
  detail::require(std::isfinite(scale), errc::invalid_argument, "accumulate: scale must be finite, got ", scale);
  const std::span<float> dense = detail::raw(dense_at);
  detail::require_apart("accumulate", bytes.data(), bytes.size(), dense.data(), dense.size());
  const bool large = bytes.size() >= message_header::size &&
                     detail::load_le<std::uint64_t>(bytes.data() + 24) >= accumulate_generic_from;  // the count
  if constexpr (Backend::host_accessible) {
    if (large) {
      detail::message_decoder<Backend> decoder(context);
      decoder.add(context, decoder.check(context, bytes, dense.size(), "accumulate", {dense.data(), scale}), dense,
                  scale);
      return;
    }
  }
  const detail::message_reader reader(bytes);
  detail::require(reader.header().n == dense.size(), errc::invalid_argument,
                  "accumulate: dense.size() = ", dense.size(), " does not match the message's n = ", reader.header().n);
  reader.validate_entries();
  if constexpr (Backend::host_accessible) {
    // Every sum is checked before the first is written, so an overflow leaves dense as
    // it was; the entries are decoded once for both (a second decode cost as much as
    // the check and the adds together).
    struct entry {
      std::uint32_t index;
      float value;
    };
    std::vector<entry> entries;
    entries.reserve(static_cast<std::size_t>(reader.header().count));
    reader.visit([&](std::uint32_t index, float value) {
      if (!std::isfinite(detail::added(dense[index], scale, value))) {
        detail::fail_overflow("accumulate", index, dense[index], scale, value);
      }
      entries.push_back({index, value});
    });
    for (const entry& e : entries) dense[e.index] = detail::added(dense[e.index], scale, e.value);
  } else {  // read on the host, checked and scattered by the backend
    const auto count = static_cast<std::size_t>(reader.header().count);
    std::vector<std::uint32_t> index_host;
    std::vector<float> values_host;
    index_host.reserve(count);
    values_host.reserve(count);
    reader.visit([&](std::uint32_t index, float value) {
      index_host.push_back(index);
      values_host.push_back(value);
    });
    auto index = context.template allocate<std::uint32_t>(count);
    auto values = context.template allocate<float>(count);
    context.to_device(index_host.data(), count, index.data());
    context.to_device(values_host.data(), count, values.data());
    detail::require_sums_finite(context, "accumulate", index.data(), values.data(), count, {dense.data(), scale},
                                dense.size());
    context.for_each(count, detail::scatter_add{index.data(), values.data(), scale, dense.data()});
  }
}

GRADCOMP_NAMESPACE_END
