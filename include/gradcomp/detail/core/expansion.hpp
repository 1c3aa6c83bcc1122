/// \file detail/core/expansion.hpp
/// Ordered compaction as a case of ordered expansion, the backend primitive `expand`:
/// item b makes body(b, at) outputs, written from `at` on (or only counted when `at`
/// is null), the items' outputs concatenated in item order. Not API.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The expansion body of a compaction: index i makes one output, i itself, if keep(i).
template <class Keep>
struct kept_index {
  Keep keep;
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t i, std::uint32_t* at) const {
    if (!keep(i)) return 0;
    if (at != nullptr) *at = static_cast<std::uint32_t>(i);
    return 1;
  }
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
