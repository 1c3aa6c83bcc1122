/// \file correct/none.hpp
/// No memory: the selector ranks the gradient itself.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
namespace correct {

/// acc = g; nothing is remembered, so what is not sent is lost.
struct none {
  static constexpr std::size_t state_arrays = 0;  ///< no memory
  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "none"; }
  /// Nothing to check.
  void validate() const noexcept {}
};

}  // namespace correct
GRADCOMP_NAMESPACE_END
