/// \file encode/codings.hpp
/// How indices and values are written in a message (see message.hpp for the layout):
/// the codings' numbers (encode/coding_ids.hpp) and names.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/codec/value_codings.hpp>
#include <gradcomp/encode/coding_ids.hpp>

GRADCOMP_NAMESPACE_BEGIN

/// Lower-case name of a value coding, as used in messages and the CLI.
constexpr const char* to_string(value_coding c) noexcept {
  return detail::is_wire_value_coding(c)
             ? detail::visit_value_coding(c, [](auto coding) { return decltype(coding)::name; })
             : "unknown";
}

/// Every value coding, in the wire format's order (names for options and errors).
template <class F>
constexpr void for_each_value_coding(F&& f) {
  [&]<class... Codings>(detail::value_coding_list<Codings...>) { (f(Codings::id), ...); }(detail::all_value_codings{});
}

GRADCOMP_NAMESPACE_END
