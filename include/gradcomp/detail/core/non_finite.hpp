/// \file detail/core/non_finite.hpp
/// Naming the entry that made a step fail: the first NaN or infinity of the gradient,
/// else of the corrector's value, found in the backend's memory by one reduction and
/// read back as one value (no copy of the n entries to the host). Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/float16.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// n - i for an entry i that is a NaN or infinity, else 0: the largest names the first.
template <gradient_element T>
struct non_finite_rank {
  const T* x;
  std::size_t n;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t i) const {
    return magnitude_key(to_float(x[i])) >= non_finite_key ? static_cast<std::uint32_t>(n - i) : 0u;
  }
};

/// The first index of `x` (the backend's memory; at most 2^32 - 1 entries) holding a
/// NaN or infinity, if any.
template <class Backend, gradient_element T>
std::optional<std::size_t> first_non_finite(const Backend& on, std::span<const T> x) {
  auto word = on.template allocate<std::uint32_t>(1);
  on.clear(word.data(), 1);
  on.reduce_max(x.size(), non_finite_rank<T>{x.data(), x.size()}, word.data());
  const std::uint32_t rank = on.read(static_cast<const std::uint32_t*>(word.data()));
  if (rank == 0) return std::nullopt;
  return x.size() - rank;
}

/// x[i] as a float, read from the backend's memory.
template <class Backend, gradient_element T>
float value_at(const Backend& on, std::span<const T> x, std::size_t i) {
  T v{};
  on.to_host(x.data() + i, 1, &v);
  return to_float(v);
}

/// Throws errc::non_finite naming the first NaN or infinity of `grad` (float32 or 16-bit),
/// else of `acc` (the corrector's value updated with it), both in the backend's memory;
/// `who` starts the text.
template <class Backend, gradient_element T>
[[noreturn]] void report_non_finite(const Backend& on, const char* who, std::span<const T> grad,
                                    std::span<const float> acc) {
  if (const auto i = first_non_finite(on, grad)) {
    fail(errc::non_finite, who, ": grad[", *i, "] = ", value_at(on, grad, *i), " is not finite");
  }
  if (const auto i = first_non_finite(on, acc)) {
    fail(errc::non_finite, who, ": the corrector's value at index ", *i, " overflowed to ", value_at(on, acc, *i),
         " (grad[", *i, "] = ", value_at(on, grad, *i), ")");
  }
  fail(errc::non_finite, who, ": non-finite value detected");
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
