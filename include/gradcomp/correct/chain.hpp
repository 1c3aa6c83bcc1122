/// \file correct/chain.hpp
/// Composition of gradient transforms and one stateful corrector.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN
namespace correct {

/// A stateless corrector that scales the gradient by a factor of its norm (clip_norm).
template <class C>
concept gradient_transform = C::state_arrays == 0 && requires(const C& c, double s) {
  { c.gradient_scale(s) } -> std::same_as<float>;
  { c.needs_norm() } -> std::same_as<bool>;
};

/// `chain{clip_norm{...}, momentum{...}}`: applies the transforms in order, then the
/// last corrector, which owns all the state.
template <class... Parts>
struct chain {
  static_assert(sizeof...(Parts) >= 1, "gradcomp: chain needs at least one corrector");
  /// The stateful corrector at the end of the chain.
  using last_type = std::tuple_element_t<sizeof...(Parts) - 1, std::tuple<Parts...>>;

  std::tuple<Parts...> parts;  ///< the transforms, then the stateful corrector

  /// Each part with its defaults (what a wrapper such as correct::compact starts from).
  chain() : chain(Parts{}...) {}
  /// Chains `p` in order: every part but the last must be a gradient_transform.
  chain(Parts... p) : parts(p...) {  // NOLINT: implicit so that chain{a, b} deduces
    static_assert(all_but_last_are_transforms(std::index_sequence_for<Parts...>{}),
                  "gradcomp: every corrector of a chain but the last must be a gradient transform (clip_norm)");
  }

  static constexpr std::size_t state_arrays = last_type::state_arrays;  ///< the last part's memory
  static constexpr int acc_state = last_type::acc_state;                ///< which state array acc is (-1: its own)
  /// Whether any part scales the gradient (the engine then computes ||g|| first).
  static constexpr bool scales_gradient = (gradient_transform<Parts> || ...);

  /// The policy's name, as checkpoints and messages of errors record it.
  [[nodiscard]] std::string name() const {
    std::string out = "chain(";
    std::apply([&](const auto&... p) { ((out += p.name() + ","), ...); }, parts);
    out.back() = ')';
    return out;
  }
  /// Validates every part.
  void validate() const {
    std::apply([](const auto&... p) { (p.validate(), ...); }, parts);
  }
  /// Whether any transform needs the gradient's norm this step.
  [[nodiscard]] bool needs_norm() const noexcept {
    return std::apply([](const auto&... p) { return (needs_norm_of(p) || ...); }, parts);
  }
  /// Product of the transforms' factors, each seeing the gradient as scaled before it.
  [[nodiscard]] GRADCOMP_HOST_DEVICE float gradient_scale(double sum_of_squares) const noexcept {
    float factor = 1.0f;
    scale_through(sum_of_squares, factor, std::index_sequence_for<Parts...>{});
    return factor;
  }
  /// One element of the update: `s` holds the state arrays' values (old in, new out); returns acc.
  GRADCOMP_HOST_DEVICE float update(float* s, float g) const noexcept { return last().update(s, g); }
  /// One sent element: `s` holds the updated state, `old` the state before the step, `sent` the
  /// value as the receiver decodes it.
  GRADCOMP_HOST_DEVICE void commit(float* s, const float* old, float acc, float sent) const noexcept {
    last().commit(s, old, acc, sent);
  }
  /// The stateful corrector.
  GRADCOMP_HOST_DEVICE const last_type& last() const noexcept { return std::get<sizeof...(Parts) - 1>(parts); }
  /// The stateful corrector's bound (the transforms only shrink g).
  [[nodiscard]] double magnitude_bound(const double* state_max, double g_max) const noexcept
    requires requires(const last_type& l, const double* m, double g) { l.magnitude_bound(m, g); }
  {
    return last().magnitude_bound(state_max, g_max);
  }

 private:
  template <class P>
  static bool needs_norm_of(const P& p) noexcept {
    if constexpr (gradient_transform<P>) {
      return p.needs_norm();
    } else {
      return false;
    }
  }
  template <std::size_t... I>
  static constexpr bool all_but_last_are_transforms(std::index_sequence<I...>) {
    return ((I + 1 == sizeof...(Parts) || gradient_transform<std::tuple_element_t<I, std::tuple<Parts...>>>)&&...);
  }
  template <std::size_t... I>
  GRADCOMP_HOST_DEVICE void scale_through(double sum_of_squares, float& factor,
                                          std::index_sequence<I...>) const noexcept {
    (
        [&] {
          using part = std::tuple_element_t<I, std::tuple<Parts...>>;
          if constexpr (gradient_transform<part>) {
            const double f = factor;
            factor *= std::get<I>(parts).gradient_scale(sum_of_squares * f * f);
          }
        }(),
        ...);
  }
};

}  // namespace correct
GRADCOMP_NAMESPACE_END
