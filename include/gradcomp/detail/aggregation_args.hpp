/// \file detail/aggregation_args.hpp
/// The argument checks every communication backend's aggregation makes. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cmath>
#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// \throws gradcomp::error unless there is one dense tensor per message and `scale` is
///         finite.
inline void check_aggregation_args(std::size_t messages, std::size_t dense, float scale) {
  require(messages == dense, errc::invalid_argument, "allgather_accumulate: ", messages, " messages for ", dense,
          " dense tensors");
  require(std::isfinite(scale), errc::invalid_argument, "allgather_accumulate: scale must be finite, got ", scale);
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
