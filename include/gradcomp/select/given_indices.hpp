/// \file select/given_indices.hpp
/// An index set chosen by the caller (ScaleCom followers, shared random sets).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cstddef>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
namespace select {

/// Sends the indices last passed to compressor::set_indices (none until then); the set
/// stays in force until replaced. set_indices checks that they ascend strictly, are
/// below n, and number at most `max_count`.
struct given_indices {
  std::size_t max_count = 0;  ///< capacity, in [1, n]

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "given_indices"; }
  /// \throws gradcomp::error if max_count is outside [1, n].
  void validate(std::size_t n) const {
    detail::require(max_count >= 1 && max_count <= n, errc::invalid_argument, "given_indices: max_count must be in [1, n = ",
                    n, "], got ", max_count);
  }
  /// The most entries a step of a tensor of n elements can select.
  [[nodiscard]] std::size_t max_selected(std::size_t /*n*/) const { return max_count; }
};

}  // namespace select
GRADCOMP_NAMESPACE_END

#include <gradcomp/detail/select_given_indices.hpp>  // the algorithm, on every backend
