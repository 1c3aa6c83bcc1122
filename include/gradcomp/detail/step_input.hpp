/// \file detail/step_input.hpp
/// What the compressor hands its selector and encoder engines each step, whatever the
/// backend. Spans point into the backend's memory. Not API.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Everything a selector engine sees of the step it runs in.
struct select_input {
  std::span<const float> acc;   ///< the values ranked (the corrector's output)
  std::span<const float> grad;  ///< this step's gradient
  std::uint64_t step;           ///< steps completed before this one
};

/// What a selector engine chose: out[0, count) holds ascending indices.
struct selection {
  std::size_t count = 0;
  float value_scale = 1.0f;  ///< factor on the values sent (random_k's unbiased n/k)
  bool finite = true;        ///< false if the selector's pass met a NaN or infinity in acc
};

/// The default of a corrector engine's `before_pass(acc_at)` hook, which a selector
/// may use to look at acc before the corrector's pass: no look-ahead.
struct ignore_before_pass {
  template <class AccAt>
  void operator()(AccAt&&) const noexcept {}
};

/// Everything an encoder engine needs to write one message.
struct encode_input {
  std::span<const float> acc;            ///< values ranked by the selector
  std::span<const std::uint32_t> index;  ///< ascending selected indices
  std::uint64_t step;                    ///< steps completed before this one (seeds stochastic codings)
  float value_scale = 1.0f;              ///< factor on acc[index[j]] before coding
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
