/// \file detail/aggregation_args.hpp
/// The argument checks every communication backend's aggregation makes. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cmath>
#include <cstddef>
#include <exception>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// \throws gradcomp::error unless there is one dense tensor per message and `scale` is
///         finite.
inline void check_aggregation_args(std::size_t messages, std::size_t dense, float scale) {
  require(messages == dense, errc::invalid_argument, "allgather_accumulate: ", messages, " messages for ", dense,
          " dense tensors");
  require(std::isfinite(scale), errc::invalid_argument, "allgather_accumulate: scale must be finite, got ", scale);
}

/// Runs `attempt` on every rank of `comm` and agrees on the outcome before any rank
/// goes on, so that none waits in a later collective for a rank that failed: rethrows
/// this rank's own gradcomp::error, or, where this rank succeeded and another did not,
/// raises `code` with the text `others`.
template <class Comm, class Attempt>
void on_every_rank(Comm& comm, Attempt&& attempt, errc code, const char* others) {
  std::exception_ptr failure;
  try {
    attempt();
  } catch (const error&) {
    failure = std::current_exception();
  }
  if (comm.all_succeeded(failure == nullptr)) return;
  if (failure) std::rethrow_exception(failure);
  fail(code, others);
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
