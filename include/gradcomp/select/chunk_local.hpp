/// \file select/chunk_local.hpp
/// AdaComp's localized selection.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace select {

/// AdaComp (Chen et al., AAAI 2018): with H = acc + g, and for each bin of `bin`
/// consecutive entries gmax = max |acc_i| over the bin, sends i where |H_i| >= gmax of
/// its bin (the last bin may be shorter; a bin longer than the tensor holds all of it). Use with error_feedback (acc =
/// residual + g); the paper uses bin 50 for fully-connected and recurrent layers, 500 for convolutions, and pairs it
/// with the ternary value coding.
struct chunk_local {
  std::size_t bin = 50;  ///< entries per bin, >= 1

  static constexpr bool reads_gradient = true;  ///< AdaComp's bins read |g| (concepts.hpp, selector_reads_gradient)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() { return std::tuple{setting{"bin", &chunk_local::bin}}; }

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const { return "chunk_local"; }
  /// \throws gradcomp::error if bin is 0.
  void validate(std::size_t /*n*/) const {
    detail::require(bin >= 1, errc::invalid_argument, "chunk_local: bin must be >= 1, got ", bin);
  }
  /// The most entries a step of a tensor of n elements can select.
  [[nodiscard]] std::size_t max_selected(std::size_t n) const { return n; }
  /// The bin length used for a tensor of n elements: a bin longer than the tensor is
  /// one bin holding all of it.
  [[nodiscard]] GRADCOMP_HOST_DEVICE std::size_t bin_for(std::size_t n) const noexcept { return bin < n ? bin : n; }
};

}  // namespace select
GRADCOMP_NAMESPACE_END
