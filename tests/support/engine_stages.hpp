// The engines driven by hand, one stage at a time, for the tests and benchmarks that
// compare an engine with another or time one stage (the compressor queues a whole step
// with one status): each stage runs at once on context `be` with a step_status of its
// own in host memory, for a host-memory backend (host, Kokkos on host memory); and a
// message written from entries rather than a compressor.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/detail/codec/encode.hpp>
#include <gradcomp/detail/core/step_input.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace support {

using gradcomp::detail::encode_input;
using gradcomp::detail::message_writer;
using gradcomp::detail::queued_selection;
using gradcomp::detail::select_input;
using gradcomp::detail::selection;
using gradcomp::detail::step_status;

/// The engine's selection at once: out[0, count) holds the ascending indices.
template <class Engine, class Backend, class Policy>
selection select_now(Engine& engine, const Backend& be, const Policy& policy, const select_input& in,
                     std::span<std::uint32_t> out) {
  step_status status;
  const queued_selection chosen = engine.select(be, policy, in, out, &status);
  return {status.count, chosen.value_scale, status.non_finite == 0};
}

/// The corrector's update at once, from a float32 or 16-bit gradient (a vector or a span
/// of its elements): whether acc is all finite.
template <class Engine, class Backend, class Policy, class Grad>
bool update_now(Engine& engine, const Backend& be, const Policy& policy, const Grad& g) {
  step_status status;
  engine.update(be, policy, std::span<const typename Grad::value_type>(g), &status);
  return status.non_finite == 0;
}

/// The corrector's preview into `out` at once, from a float32 or 16-bit gradient (a
/// vector or a span of its elements): whether it is all finite.
template <class Engine, class Backend, class Policy, class Grad>
bool preview_now(Engine& engine, const Backend& be, const Policy& policy, const Grad& g, std::span<float> out) {
  step_status status;
  engine.preview(be, policy, std::span<const typename Grad::value_type>(g), out, &status);
  return status.non_finite == 0;
}

/// The corrector's commit of every entry of `index` at once.
template <class Engine, class Backend, class Policy>
void commit_now(Engine& engine, const Backend& be, const Policy& policy, std::span<const std::uint32_t> index,
                std::span<const float> sent) {
  step_status status;
  status.count = static_cast<std::uint32_t>(index.size());
  engine.commit(be, policy, index, sent, &status);
}

/// The message of every entry of in.index at once: its size.
template <class Engine, class Backend, class Policy>
std::size_t encode_now(Engine& engine, const Backend& be, const Policy& policy, const encode_input& in,
                       std::span<std::byte> out, std::span<float> sent) {
  step_status status;
  status.count = static_cast<std::uint32_t>(in.index.size());
  engine.encode(be, policy, in, out, sent, &status);
  return static_cast<std::size_t>(status.bytes);
}

/// Writes the message of ascending `index` with `values` (already scaled) of a tensor
/// of n elements on backend::host (one thread) into `out` (at least policy.max_bytes
/// long) and what the receiver decodes into `sent`; returns the message's size. For
/// tools and tests that hold entries rather than a compressor.
inline std::size_t encode_message(const gradcomp::encode::index_value& policy, std::size_t n,
                                  std::span<const std::uint32_t> index, std::span<const float> values,
                                  std::span<std::byte> out, std::span<float> sent, std::uint64_t step) {
  const gradcomp::backend::host one_thread{.threads = 1};
  message_writer<gradcomp::backend::host> writer(one_thread, policy, n, index.size());
  step_status status;  // host memory
  status.count = static_cast<std::uint32_t>(index.size());
  writer.queue(one_thread, policy, index.size(), index.data(), values.data(), step, out.data(), sent.data(), &status);
  return static_cast<std::size_t>(status.bytes);
}

}  // namespace support
