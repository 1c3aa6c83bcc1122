/// \file concepts.hpp
/// What a selector, a corrector, an encoder and a backend must provide.
///
/// Policies are small aggregates that hold parameters only. Each concept is the
/// conjunction of one-member concepts so that `compressor` can report exactly which
/// member a policy lacks (see `detail::check_policies`).
#pragma once

#include <gradcomp/config.hpp>

#include <concepts>
#include <cstddef>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {
/// The implementation of policy `Policy` on backend `Backend`. The primary template is
/// never defined: each backend specialises it for the policies it runs.
template <class Policy, class Backend>
class engine;

template <class Policy, class Backend>
concept has_engine = requires { sizeof(engine<Policy, Backend>); };
}  // namespace detail

// -- one requirement each, named so that a failed check names the member ------------

template <class P>
concept policy_has_name = requires(const P& p) {
  { p.name() } -> std::convertible_to<std::string>;
};

template <class S>
concept selector_has_validate = requires(const S& s, std::size_t n) { s.validate(n); };

template <class S>
concept selector_has_max_selected = requires(const S& s, std::size_t n) {
  { s.max_selected(n) } -> std::same_as<std::size_t>;
};

template <class C>
concept corrector_has_validate = requires(const C& c) { c.validate(); };

template <class C>
concept corrector_has_state_arrays = requires {
  { C::state_arrays } -> std::convertible_to<std::size_t>;
};

template <class E>
concept encoder_has_validate = requires(const E& e) { e.validate(); };

template <class E>
concept encoder_has_max_bytes = requires(const E& e, std::size_t n, std::size_t count) {
  { e.max_bytes(n, count) } -> std::same_as<std::size_t>;
};

template <class B>
concept backend_has_allocate = requires(const B& b, std::size_t n) {
  typename B::template buffer<float>;
  { b.template allocate<float>(n) } -> std::same_as<typename B::template buffer<float>>;
};

// -- the concepts -------------------------------------------------------------------

/// Decides which entries are sent: `validate(n)` throws gradcomp::error for parameters
/// that are invalid for a tensor of `n` elements; `max_selected(n)` bounds the count.
template <class S>
concept selector = std::copyable<S> && policy_has_name<S> && selector_has_validate<S> &&
                   selector_has_max_selected<S>;

/// Owns what is remembered between steps: `state_arrays` is the number of n-element
/// float arrays it keeps; `validate()` throws for bad parameters.
template <class C>
concept corrector = std::copyable<C> && policy_has_name<C> && corrector_has_validate<C> &&
                    corrector_has_state_arrays<C>;

/// Writes the selected entries as message bytes: `max_bytes(n, count)` bounds the size
/// of a message of `count` entries; `validate()` throws for bad parameters.
template <class E>
concept encoder = std::copyable<E> && policy_has_name<E> && encoder_has_validate<E> && encoder_has_max_bytes<E>;

/// Knows where memory lives and runs the data-parallel work.
template <class B>
concept backend_type = std::copyable<B> && backend_has_allocate<B>;

namespace detail {

/// Static assertions that name the first missing member of each policy. Called from
/// compressor's class body so a misuse fails with these words, not a wall of templates.
template <class Backend, class Selector, class Corrector, class Encoder>
consteval bool check_policies() {
  static_assert(backend_has_allocate<Backend>,
                "gradcomp: the backend has no member template allocate<T>(n) returning buffer<T>");
  static_assert(policy_has_name<Selector>, "gradcomp: the selector has no member name()");
  static_assert(selector_has_validate<Selector>, "gradcomp: the selector has no member validate(n)");
  static_assert(selector_has_max_selected<Selector>,
                "gradcomp: the selector has no member max_selected(n) returning std::size_t");
  static_assert(policy_has_name<Corrector>, "gradcomp: the corrector has no member name()");
  static_assert(corrector_has_validate<Corrector>, "gradcomp: the corrector has no member validate()");
  static_assert(corrector_has_state_arrays<Corrector>,
                "gradcomp: the corrector has no static member state_arrays");
  static_assert(policy_has_name<Encoder>, "gradcomp: the encoder has no member name()");
  static_assert(encoder_has_validate<Encoder>, "gradcomp: the encoder has no member validate()");
  static_assert(encoder_has_max_bytes<Encoder>,
                "gradcomp: the encoder has no member max_bytes(n, count) returning std::size_t");
  static_assert(has_engine<Selector, Backend>, "gradcomp: this selector has no implementation for this backend");
  static_assert(has_engine<Corrector, Backend>, "gradcomp: this corrector has no implementation for this backend");
  static_assert(has_engine<Encoder, Backend>, "gradcomp: this encoder has no implementation for this backend");
  return true;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
