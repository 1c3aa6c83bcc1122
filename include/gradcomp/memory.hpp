/// \file memory.hpp
/// Where memory lives, said by the type of the view over it.
///
/// Host memory is a std::span. Memory that the host must not dereference (a CUDA
/// device's, a Kokkos device space's) is a device_span: a pointer and a size with no
/// element access, which no host function of gradcomp accepts. So a message written by
/// backend::cuda is a device_message whose bytes() is a device_span, and
/// `decode(m.bytes())` on it does not compile instead of reading device addresses on
/// the host. Every backend names the memory of its
/// gradients and state (`memory`) and of its messages (`message_memory`); the
/// compressor's signatures follow from them (backend_span).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/float16.hpp>

#include <cstddef>
#include <span>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN

/// Memory the host reads and writes: viewed as std::span.
struct host_memory {};
/// Memory of a device that the host must not dereference: viewed as device_span.
struct device_memory {};

/// A contiguous run of `T` in device memory: what std::span is for host memory, minus
/// element access and iteration, which on the host would read the wrong address space.
/// Make one from a device pointer, e.g. `device_span<const float>(tensor.data_ptr<float>(),
/// tensor.numel())` or `thrust::raw_pointer_cast(v.data())`.
template <class T>
class device_span {
 public:
  using element_type = T;  ///< the element type, as std::span names it

  constexpr device_span() noexcept = default;
  /// `size` elements at the device address `data`.
  constexpr device_span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  /// A view of const elements from one of mutable ones (as std::span converts).
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr device_span(const device_span<U>& other) noexcept  // NOLINT(google-explicit-constructor)
      : data_(other.data()), size_(other.size()) {}

  /// The device address of the first element.
  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  /// Elements viewed.
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  /// Bytes viewed.
  [[nodiscard]] constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  /// Whether no element is viewed.
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  /// The first `count` elements (count <= size()).
  [[nodiscard]] constexpr device_span first(std::size_t count) const noexcept { return {data_, count}; }
  /// `count` elements from `offset` (offset + count <= size()).
  [[nodiscard]] constexpr device_span subspan(std::size_t offset, std::size_t count) const noexcept {
    return {data_ + offset, count};
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The view of `T` in memory `Memory` (host_memory or device_memory).
template <class Memory, class T>
using span_in = std::conditional_t<std::is_same_v<Memory, device_memory>, device_span<T>, std::span<T>>;

/// The view of `T` in the memory of `Backend`'s gradients, state and dense tensors.
template <class Backend, class T>
using backend_span = span_in<typename Backend::memory, T>;

/// The view of message bytes in the memory where `Backend` writes and reads messages.
template <class Backend, class Byte = const std::byte>
using message_span = span_in<typename Backend::message_memory, Byte>;

/// A gradient that a compressor on `Backend` takes: elements of float32, IEEE half or
/// bfloat16 (float16.hpp) in the backend's memory, as a backend_span or what converts to
/// one (std::vector<float>, std::span<float>, ...).
template <class Grad, class Backend>
concept gradient_view = std::is_convertible_v<const Grad&, backend_span<Backend, const float>> ||
                        std::is_convertible_v<const Grad&, backend_span<Backend, const half>> ||
                        std::is_convertible_v<const Grad&, backend_span<Backend, const bfloat16>>;

namespace detail {
/// The pointer and size of a view of either memory, as the std::span that engines take
/// (engines run in the backend's memory and never dereference it on the wrong side).
template <class T>
constexpr std::span<T> raw(std::span<T> s) noexcept {
  return s;
}
template <class T>
constexpr std::span<T> raw(device_span<T> s) noexcept {
  return {s.data(), s.size()};
}

/// A dependent false, for static_asserts that fire only when a template is used.
template <class...>
inline constexpr bool never = false;
}  // namespace detail

GRADCOMP_NAMESPACE_END
