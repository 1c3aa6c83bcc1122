/// \file detail/core/selector_work.hpp
/// What the selector algorithms written once over the backend primitives share: the
/// small functors they queue and the helpers that put a count into the step's status.
/// Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Stores `value` at `at`: run as a for_each of one element, so that a count lands in
/// the step's status in order with the step's other work.
template <class T>
struct store_value {
  T* at;
  T value;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const { *at = value; }
};

/// to[i] = from[i].
template <class T>
struct copy_elements {
  const T* from;
  T* to;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { to[i] = from[i]; }
};

/// sample[j] = acc[offset + j * stride].
struct gather_strided {
  const float* acc;
  std::size_t offset, stride;
  float* sample;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { sample[j] = acc[offset + j * stride]; }
};

/// keys[j] = the magnitude key of acc[list[j]].
struct keys_at {
  const float* acc;
  const std::uint32_t* list;
  std::uint32_t* keys;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { keys[j] = magnitude_key(acc[list[j]]); }
};

/// The bytes of a workspace buffer of any backend (std::vector, Kokkos::View,
/// device_buffer: data() and size()).
template <class Buffer>
std::span<std::byte> workspace_bytes(Buffer& buffer) {
  return {buffer.data(), static_cast<std::size_t>(buffer.size())};
}

/// Queues `status->count = count` on `backend`.
template <class Backend>
void queue_count(const Backend& backend, step_status* status, std::size_t count) {
  backend.for_each(1, store_value<std::uint32_t>{&status->count, static_cast<std::uint32_t>(count)});
}

/// `count` elements of the backend's memory at `p`, readable on the host: the memory
/// itself where the host may touch it, else a copy in `staging` (sized by the caller).
template <class Backend, class T>
std::span<T> on_host(const Backend& backend, T* p, std::size_t count, std::vector<std::remove_const_t<T>>& staging) {
  if constexpr (Backend::host_accessible) {
    return {p, count};
  } else {
    backend.to_host(p, count, staging.data());
    return {staging.data(), count};
  }
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
