// The compressors `gradcomp eval` runs: exact top-k without memory (the baseline), then
// every preset of gradcomp/registry.hpp that compresses alone, made from its options
// struct with the run's density.
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace cli {

/// A compressor as the CLI runs it: its largest message and its compress().
struct runner {
  std::size_t max_message_bytes;
  std::function<gradcomp::message(std::span<const float> grad, std::span<std::byte> out)> compress;
};

template <class Compressor>
runner run(Compressor c) {
  auto shared = std::make_shared<Compressor>(std::move(c));
  return {shared->max_message_bytes(),
          [shared](std::span<const float> g, std::span<std::byte> out) { return shared->compress(g, out); }};
}

struct method {
  std::string name;
  std::string description;
  /// Momentum the method folds into its messages: its aggregate is compared with dense
  /// momentum SGD's (sum of u_t, u_t = momentum * u_{t-1} + g_t), not with sum of g_t.
  float momentum;
  std::function<runner(std::size_t n, double density, std::span<const float> first_step)> make;
};

/// Magnitude of the ceil(density * n)-th largest |g|: calibrates a threshold on the first
/// step so that every method aims at the same density.
inline float calibrated_tau(std::span<const float> first_step, double density) {
  std::vector<float> magnitudes(first_step.size());
  for (std::size_t i = 0; i < first_step.size(); ++i) magnitudes[i] = std::fabs(first_step[i]);
  const gradcomp::select::exact_topk topk{.density = density};
  const std::size_t k = topk.k(magnitudes.size());
  std::nth_element(magnitudes.begin(), magnitudes.begin() + static_cast<std::ptrdiff_t>(k - 1), magnitudes.end(),
                   std::greater<>());
  return magnitudes[k - 1];
}

/// A preset made by `make(n, options)` from its Options with the run's density (where it
/// has one; a threshold is calibrated to it), its momentum the options' default.
template <class Options, class Make>
method preset(const char* name, const char* description, Make make) {
  float momentum = 0.0f;
  if constexpr (requires(Options o) { o.momentum; }) momentum = Options{}.momentum;
  return {name, description, momentum, [make](std::size_t n, double density, std::span<const float> first) {
            Options o{};
            if constexpr (requires { o.density; }) o.density = density;
            if constexpr (requires { o.tau; }) o.tau = calibrated_tau(first, density);
            return run(make(n, o));
          }};
}

inline std::vector<method> methods() {
  namespace gc = gradcomp;
  std::vector<method> all{{"topk", "exact top-k, no memory (what is not sent is lost)", 0.0f,
                           [](std::size_t n, double d, std::span<const float>) {
                             return run(gc::compressor{gc::backend::host{}, n, gc::select::exact_topk{.density = d},
                                                       gc::correct::none{}, gc::encode::index_value{}});
                           }}};
  // A preset whose selector is given its indices (ScaleCom) compresses inside the exchange
  // that gives them (comm::cyclic_topk), not alone.
#define CLI_PRESET(M, S, DESCRIPTION)                                                                              \
  if constexpr (!std::is_same_v<gc::select::S, gc::select::given_indices>) {                                       \
    all.push_back(preset<gc::presets::M##_options>(                                                                \
        #M, DESCRIPTION, [](std::size_t n, const auto& o) { return gc::presets::M(gc::backend::host{}, n, o); })); \
  }
  GRADCOMP_PRESETS(CLI_PRESET)
#undef CLI_PRESET
  return all;
}

}  // namespace cli
