/// \file held_memory.hpp
/// What a compressor holds in its backend's memory between calls
/// (compressor::memory_bytes()): the state that carries the method from step to step,
/// apart from the workspace that only serves a step.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN

/// Bytes a compressor holds: in its backend's memory (host, device or Kokkos space), and,
/// on a device backend, the host copies it keeps for checkpoints once one was asked for.
struct held_memory {
  /// What the next step needs from the last: the corrector's committed arrays (error
  /// feedback's residual, momentum's velocity), in float32 or stored in blocks
  /// (correct::compact). A checkpoint holds this (and the few bytes a selector carries,
  /// sampled_threshold's threshold, counted as workspace); compressor::release_workspace()
  /// keeps all of it.
  std::size_t state = 0;
  /// Every other byte held between calls: the corrector's arrays for the step in progress
  /// (float32 state is double-buffered), the selector's candidate lists and sort space,
  /// the selection's indices and values, the encoder's plan, the float32 copy of a 16-bit
  /// gradient, a preview's buffer, host copies of a device's state, given_indices' index
  /// set. What compressor::release_workspace() gives back, but for a few per-tile and
  /// per-thread bytes and that index set (which the selector carries to its next step).
  std::size_t workspace = 0;

  /// state + workspace.
  [[nodiscard]] constexpr std::size_t total() const noexcept { return state + workspace; }
  /// Adds what `other` holds.
  constexpr held_memory& operator+=(const held_memory& other) noexcept {
    state += other.state;
    workspace += other.workspace;
    return *this;
  }
};

namespace detail {

/// Bytes held by buffers of any backend (std::vector: its capacity; device_buffer and
/// Kokkos::View: their size).
template <class... Buffers>
[[nodiscard]] std::size_t bytes_held(const Buffers&... buffers) noexcept {
  const auto one = [](const auto& b) -> std::size_t {
    using element = std::remove_cvref_t<decltype(*b.data())>;
    if constexpr (requires { b.capacity(); }) {
      return static_cast<std::size_t>(b.capacity()) * sizeof(element);
    } else {
      return static_cast<std::size_t>(b.size()) * sizeof(element);
    }
  };
  return (std::size_t{0} + ... + one(buffers));
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
