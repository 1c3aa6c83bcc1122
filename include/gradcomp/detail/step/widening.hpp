/// \file detail/step/widening.hpp
/// A 16-bit gradient (IEEE half, bfloat16) widened to float32 exactly, in the backend's
/// memory, for a compressor whose step cannot read it as it is (a selector that reads the
/// gradient, a corrector engine without the capability: step_engines::reads_as_stored).
/// Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/float16.hpp>
#include <gradcomp/held_memory.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The element type of a gradient_view on Backend: float, half or bfloat16.
template <class Backend, class Grad>
using gradient_element_of = std::conditional_t<
    std::is_convertible_v<const Grad&, backend_span<Backend, const float>>, float,
    std::conditional_t<std::is_convertible_v<const Grad&, backend_span<Backend, const half>>, half, bfloat16>>;

/// The float32 workspace of one compressor's 16-bit gradients: n floats, allocated by
/// the first widening (if that throws, nothing has changed).
template <class Backend>
class widening {
 public:
  /// The float32 values of `grad`, a gradient_view of n elements: its own, or a 16-bit
  /// gradient's widened on `on` (checked first as a step checks its gradient); valid
  /// until the next call.
  template <class Grad>
  std::span<const float> float_values(const Backend& on, const Backend& be, const char* who, const Grad& grad,
                                      std::size_t n) {
    using T = gradient_element_of<Backend, Grad>;
    if constexpr (std::is_same_v<T, float>) {
      return raw(backend_span<Backend, const float>(grad));
    } else {
      return values(on, be, who, raw(backend_span<Backend, const T>(grad)), n);
    }
  }

  /// Bytes of the float32 copy (0 until a 16-bit gradient arrives).
  [[nodiscard]] std::size_t held_bytes() const noexcept { return bytes_held(wide_); }
  /// Gives the float32 copy back (the next 16-bit gradient allocates it again), once
  /// the widening last queued into it is done where the memory is a device's.
  void release() {
    if constexpr (!Backend::host_accessible) {
      if (wide_.size() != 0) (void)last_->read(wide_.data());
    }
    wide_ = typename Backend::template buffer<float>{};
  }

 private:
  template <narrow_float T>
  std::span<const float> values(const Backend& on, const Backend& be, const char* who, std::span<const T> grad,
                                std::size_t n) {
    require_current_device(be, who);
    require(grad.size() == n, errc::invalid_argument, who, ": grad.size() = ", grad.size(),
            " does not match the compressor's n = ", n);
    require_device_pointer(be, who, "grad", grad.data());
    if (static_cast<std::size_t>(wide_.size()) != n) wide_ = be.template allocate<float>(n);
    on.for_each(n, widen_to_float<T>{grad.data(), wide_.data()});
    last_ = on;
    return {wide_.data(), n};
  }

  typename Backend::template buffer<float> wide_;
  std::optional<Backend> last_;  // where the last widening was queued
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
