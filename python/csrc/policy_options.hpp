// A selector's and the encoder's fields read from gradcomp.torch.Compressor's keyword
// options, under their C++ names (a preset's own options are read in compressors.hpp's
// build()).
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <cstddef>

#include "api.hpp"

namespace gradcomp_py {

namespace gc = gradcomp;

/// A selector of default fields, its density (if it has one) from the options: what a
/// selector added to names.hpp gets until it reads fields of its own here.
template <class Selector>
Selector read_selector(options& o, std::size_t /*n*/) {
  Selector s{};
  if constexpr (requires { s.density = 0.5; }) s.density = o.number("density", 0.001);
  return s;
}

template <>
inline gc::select::exact_topk read_selector(options& o, std::size_t) {
  const bool by_count = o.has("count") && !o.has("density");
  return {.density = by_count ? 0.0 : o.number("density", 0.001), .count = o.size("count", 0)};
}
template <>
inline gc::select::sampled_threshold read_selector(options& o, std::size_t) {
  const gc::select::sampled_threshold d{};
  return {.density = o.number("density", 0.001),
          .sample_ratio = o.number("sample_ratio", d.sample_ratio),
          .lower = static_cast<float>(o.number("lower", d.lower)),
          .upper = static_cast<float>(o.number("upper", d.upper)),
          .max_iters = static_cast<int>(o.integer("max_iters", d.max_iters)),
          .seed = o.seed("selector", 0),
          .truncate = o.flag("truncate", false),
          .reuse_threshold = o.flag("reuse_threshold", false)};
}
template <>
inline gc::select::chunk_local read_selector(options& o, std::size_t) {
  return {.bin = o.size("bin", 50)};
}
template <>
inline gc::select::random_k read_selector(options& o, std::size_t) {
  return {.density = o.number("density", 0.001), .seed = o.seed("selector", 0), .unbiased = o.flag("unbiased", false)};
}
template <>
inline gc::select::threshold read_selector(options& o, std::size_t) {
  return {.tau = static_cast<float>(o.number("tau", 0.0))};
}
template <>
inline gc::select::given_indices read_selector(options& o, std::size_t) {
  // max_count, or as many as exact_topk would choose at `density`.
  if (o.has("max_count")) return {.max_count = o.size("max_count", 0)};
  return {.density = o.number("density", 0.001)};
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
