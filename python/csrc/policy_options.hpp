// A policy's or a preset's settings read from gradcomp.torch.Compressor's keyword
// options, under their C++ names (settings.hpp), with the defaults its struct gives.
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "api.hpp"

namespace gradcomp_py {

namespace gc = gradcomp;

/// The density a selector sized by one gets when the options name neither it nor a count:
/// the presets' (topk_ef's) default.
inline constexpr double default_density = gc::presets::topk_ef_options{}.density;

/// `policy` with each setting the options name read as the setting's type (the struct's
/// default where they do not); a setting named seed is `role`'s seed (options::seed).
template <class Policy>
Policy read_settings(options& o, Policy policy, const std::string& role) {
  gc::for_each_setting(policy, [&](const char* name, auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, bool>) {
      value = o.flag(name, value);
    } else if constexpr (std::is_floating_point_v<T>) {
      value = static_cast<T>(o.number(name, value));
    } else if constexpr (std::is_same_v<T, int>) {
      value = static_cast<int>(o.integer(name, value));
    } else if constexpr (std::is_same_v<T, std::uint64_t>) {  // a seed, or a count (std::size_t)
      value = std::string_view(name) == "seed" ? o.seed(role, value) : o.size(name, value);
    } else if constexpr (std::is_same_v<T, std::uint32_t>) {  // a width or a block (the policy checks its range)
      const std::size_t v = o.size(name, value);
      gc::detail::require(v <= 0xFFFFFFFFu, gc::errc::invalid_argument, role, ": ", name, " must be below 2^32, got ",
                          v);
      value = static_cast<std::uint32_t>(v);
    } else {
      static_assert(std::is_same_v<T, void>, "read_settings: a setting of a type the options cannot hold");
    }
  });
  return policy;
}

/// A selector from the options: its settings, and default_density where it is sized by a
/// density and the options set neither that nor a count.
template <class Selector>
Selector read_selector(options& o) {
  Selector s = read_settings(o, Selector{}, "selector");
  if constexpr (requires { s.density; }) {
    bool sized = s.density != 0.0;
    if constexpr (requires { s.count; }) sized = sized || s.count != 0;
    if constexpr (requires { s.max_count; }) sized = sized || s.max_count != 0;
    if (!sized) s.density = default_density;
  }
  return s;
}

inline gc::encode::index_value read_encoder(options& o) {
  gc::encode::index_value e{};
  e.index = o.index_coding("index", e.index);
  e.value = o.value_coding("value", e.value);
  if (gc::detail::takes_levels(e.value)) {  // levels and the seed are options of the codings that take them
    const std::size_t levels = o.size("levels", e.levels);
    gc::detail::require(levels <= gc::detail::qsgd_max_levels, gc::errc::invalid_argument,
                        "index_value: levels must be in [1, ", gc::detail::qsgd_max_levels, "], got ", levels);
    e.levels = static_cast<std::uint32_t>(levels);
  }
  if (gc::detail::takes_seed(e.value)) e.seed = o.seed("encoder", e.seed);
  e.checksum = o.flag("checksum", false);
  return e;
}

}  // namespace gradcomp_py
