/// \file detail/queued_selector.hpp
/// What every selector algorithm written once over the backend primitives shares: the
/// queued step protocol (`select(policy, in, out, status)` leaves the indices in `out`
/// and their count in the step's status, in the backend's memory), answered at once
/// for the compressor's host-memory path by CRTP base queued_selector, and the small
/// device functors such algorithms queue. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/detail/step_record.hpp>

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

/// Base of a selector engine `Derived` written to the queued protocol: adds the
/// at-once select() (through a status record in the backend's memory) and the empty
/// look at the corrector's pass. Derived declares `using queued_selector::select;`.
template <class Derived, class Backend>
class queued_selector {
 public:
  explicit queued_selector(const Backend& be) : record_(be) {}

  /// select() at once: out[0, count) holds the ascending indices.
  template <class Policy>
  selection select(const Policy& policy, const select_input& in, std::span<std::uint32_t> out) {
    float scale = 1.0f;
    const step_status done = record_.run_now([&](step_status* status) {
      scale = static_cast<Derived&>(*this).select(policy, in, out, status).value_scale;
    });
    return {done.count, scale, done.non_finite == 0};
  }

  /// Nothing to do during the corrector's pass.
  template <class Policy>
  void begin_observe(const Policy&, std::uint64_t) noexcept {}
  void observe(int, std::size_t, std::span<const float>, std::span<const float>) noexcept {}

 private:
  step_record<Backend> record_;
};

/// Runs `engine`'s selection to the queued protocol, whichever protocol it has: an
/// engine that answers at once gets its count (and NaN verdict) stored in the status.
template <class Engine, class Policy, class Backend>
void queue_selection(Engine& engine, const Policy& policy, const select_input& in, std::span<std::uint32_t> out,
                     step_status* status, const Backend& backend) {
  if constexpr (requires { engine.select(policy, in, out, status); }) {
    engine.select(policy, in, out, status);
  } else {
    const selection chosen = engine.select(policy, in, out);
    queue_count(backend, status, chosen.count);
    if (!chosen.finite) backend.for_each(1, store_value<std::uint32_t>{&status->non_finite, 1u});
  }
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
