/// \file correct/compact.hpp
/// Compressed error memory: a corrector's state stored in 8 or 4 bits per entry.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace correct {

/// `Inner` (a corrector with state: error_feedback, momentum, low_pass, or a chain ending
/// in one) with its state arrays stored block-quantized between steps: `bits` per entry
/// (8 or 4) and one power-of-two exponent per `block` entries, each entry's rounding
/// error carried into the next entry of its block (docs/algorithms.md, "Compressed
/// memory"). Inner's update and commit run unchanged, in float32, on the stored values;
/// between steps the state takes 1 + 1/block bytes (8 bits) or 0.5 + 1/block bytes
/// (4 bits) per entry and array instead of 4 (twice 4 while a float32 state is double-
/// buffered), and float32 working copies exist only during a step.
template <class Inner>
struct compact {
  Inner inner{};             ///< the corrector whose state is stored compactly
  std::uint32_t bits = 8;    ///< bits per stored entry: 8 or 4
  std::uint32_t block = 64;  ///< entries per exponent: a multiple of 8 in [8, 4096]

  static_assert(Inner::state_arrays > 0, "correct::compact: the inner corrector keeps no state to store");

  /// Its settings by name (settings.hpp): its own; the inner corrector's are set on `inner`.
  static constexpr auto settings() {
    return std::tuple{setting{"memory_bits", &compact::bits}, setting{"memory_block", &compact::block}};
  }

  static constexpr std::size_t state_arrays = Inner::state_arrays;  ///< the inner corrector's arrays
  static constexpr int acc_state = Inner::acc_state;                ///< as the inner corrector's

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const {
    return "compact<" + std::to_string(bits) + "," + std::to_string(block) + ">(" + inner.name() + ")";
  }

  /// \throws gradcomp::error if bits is not 8 or 4, block is not a multiple of 8 in
  ///         [8, 4096], or the inner corrector's settings are invalid.
  void validate() const {
    detail::require(bits == 8 || bits == 4, errc::invalid_argument, "compact: bits must be 8 or 4, got ", bits);
    detail::require(block >= 8 && block <= 4096 && block % 8 == 0, errc::invalid_argument,
                    "compact: block must be a multiple of 8 in [8, 4096], got ", block);
    inner.validate();
  }
};

}  // namespace correct
GRADCOMP_NAMESPACE_END
