/// \file detail/core/step_input.hpp
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
  std::span<const float> grad;  ///< this step's gradient, float32 (empty where the selector does not read it:
                                ///< selector_reads_gradient)
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

/// What a step leaves in the backend's memory, so that the host learns its outcome with
/// one read (on backend::cuda, from device memory). Engines set `non_finite` as they find
/// a NaN or infinity; every later stage of the step then writes nothing.
struct step_status {
  std::uint32_t non_finite = 0;  ///< nonzero: grad or acc held a NaN or infinity
  std::uint32_t count = 0;       ///< entries the selector chose
  std::uint64_t bytes = 0;       ///< size of the message written
};

/// An index the corrector's commit leaves alone: on a device, accept_staged(kept) marks
/// the staged entries the caller did not keep so (step_engines::commit_staged), rather
/// than compacting the selection on the host. Never an index: indices are below n < 2^32.
inline constexpr std::uint32_t not_kept = 0xFFFFFFFFu;

/// What a selector engine queued: the indices and their count (in the step_status) stay
/// in the backend's memory.
struct queued_selection {
  float value_scale = 1.0f;  ///< factor on the values sent
};

/// Puts a selection made at once into the step's status, which must be host memory:
/// how backend::host's fast paths answer the queued protocol.
inline queued_selection record_selection(const selection& chosen, step_status* status) noexcept {
  status->count = static_cast<std::uint32_t>(chosen.count);
  if (!chosen.finite) status->non_finite = 1;
  return {chosen.value_scale};
}

/// Lets a selector engine that has a `before_pass(policy, acc_at)` look at acc before
/// the corrector's pass; nothing for the others. (A function rather than a
/// requires-expression inside the compressor's lambda, which nvcc misjudges.)
template <class Engine, class Policy, class AccAt>
void look_ahead(Engine& engine, const Policy& policy, AccAt& acc_at) {
  if constexpr (requires { engine.before_pass(policy, acc_at); }) engine.before_pass(policy, acc_at);
}

/// Everything an encoder engine needs to write one message.
struct encode_input {
  std::span<const float> acc;            ///< values ranked by the selector
  std::span<const std::uint32_t> index;  ///< ascending selected indices (on a device backend:
                                         ///< the whole workspace; the count is in the step_status)
  std::uint64_t step;                    ///< steps completed before this one (seeds stochastic codings)
  float value_scale = 1.0f;              ///< factor on acc[index[j]] before coding
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
