/// \file settings.hpp
/// A policy's or a preset's settings by name, declared once in its own struct
/// (`static constexpr auto settings()`): what gradcomp.torch reads from its keyword
/// options and what the CLI lists, with the defaults the struct gives.
#pragma once

#include <gradcomp/config.hpp>

#include <tuple>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN

/// One setting of `Owner`: its name and the member that holds it.
template <class Owner, class T>
struct setting {
  const char* name;  ///< as gradcomp.torch's keyword option names it
  T Owner::*member;  ///< where `Owner` holds it
};
/// setting{"name", &Owner::name} is a setting<Owner, T>.
template <class Owner, class T>
setting(const char*, T Owner::*) -> setting<Owner, T>;

/// Whether T names its settings (T::settings()).
template <class T>
concept has_settings = requires { std::remove_const_t<T>::settings(); };

/// Calls `f(name, member)` for each setting of `object`, in the order T::settings() lists
/// them (a reference to the member, const where `object` is); nothing where T has none.
template <class T, class F>
constexpr void for_each_setting(T& object, F&& f) {
  if constexpr (has_settings<T>) {
    std::apply([&](auto... each) { (f(each.name, object.*(each.member)), ...); }, std::remove_const_t<T>::settings());
  }
}

GRADCOMP_NAMESPACE_END
