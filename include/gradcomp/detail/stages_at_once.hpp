/// \file detail/stages_at_once.hpp
/// One engine stage run at once on context `be`, with a step_status of its own in host
/// memory: for tests and benchmarks that drive the engines of a host-memory backend
/// (host, Kokkos on host memory) by hand. The compressor queues a whole step with one
/// status. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/step_input.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The engine's selection at once: out[0, count) holds the ascending indices.
template <class Engine, class Backend, class Policy>
selection select_now(Engine& engine, const Backend& be, const Policy& policy, const select_input& in,
                     std::span<std::uint32_t> out) {
  step_status status;
  const queued_selection chosen = engine.select(be, policy, in, out, &status);
  return {status.count, chosen.value_scale, status.non_finite == 0};
}

/// The corrector's update at once: whether acc is all finite.
template <class Engine, class Backend, class Policy>
bool update_now(Engine& engine, const Backend& be, const Policy& policy, std::span<const float> g) {
  step_status status;
  engine.update(be, policy, g, &status);
  return status.non_finite == 0;
}

/// The corrector's preview into `out` at once: whether it is all finite.
template <class Engine, class Backend, class Policy>
bool preview_now(Engine& engine, const Backend& be, const Policy& policy, std::span<const float> g,
                 std::span<float> out) {
  step_status status;
  engine.preview(be, policy, g, out, &status);
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

}  // namespace detail
GRADCOMP_NAMESPACE_END
