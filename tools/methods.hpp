// The compressors `gradcomp eval` knows, behind one small runtime interface.
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cli {

/// One compressor, type-erased for the command line.
class runner {
 public:
  virtual ~runner() = default;
  virtual gradcomp::message compress(std::span<const float> grad, std::span<std::byte> out) = 0;
  [[nodiscard]] virtual std::size_t max_message_bytes() const = 0;
};

template <class Compressor>
class runner_of final : public runner {
 public:
  explicit runner_of(Compressor c) : c_(std::move(c)) {}
  gradcomp::message compress(std::span<const float> grad, std::span<std::byte> out) override {
    return c_.compress(grad, out);
  }
  [[nodiscard]] std::size_t max_message_bytes() const override { return c_.max_message_bytes(); }

 private:
  Compressor c_;
};

template <class Compressor>
std::unique_ptr<runner> make_runner(Compressor c) {
  return std::make_unique<runner_of<Compressor>>(std::move(c));
}

struct method {
  std::string name;
  std::string description;
  /// Momentum the method folds into its messages: its aggregate is compared with dense
  /// momentum SGD's (sum of u_t, u_t = momentum * u_{t-1} + g_t), not with sum of g_t.
  float momentum;
  std::function<std::unique_ptr<runner>(std::size_t n, double density, std::span<const float> first_step)> make;
};

/// Magnitude of the ceil(density * n)-th largest |g|: calibrates threshold_ef's tau on
/// the first step so that every method aims at the same density.
inline float calibrated_tau(std::span<const float> first_step, double density) {
  std::vector<float> magnitudes(first_step.size());
  for (std::size_t i = 0; i < first_step.size(); ++i) magnitudes[i] = std::fabs(first_step[i]);
  const gradcomp::select::exact_topk topk{.density = density};
  const std::size_t k = topk.k(magnitudes.size());
  std::nth_element(magnitudes.begin(), magnitudes.begin() + static_cast<std::ptrdiff_t>(k - 1), magnitudes.end(),
                   std::greater<>());
  return magnitudes[k - 1];
}

inline std::vector<method> methods() {
  namespace gc = gradcomp;
  namespace p = gradcomp::presets;
  const gc::backend::host host{};
  return {
      {"topk", "exact top-k, no memory (what is not sent is lost)", 0.0f,
       [=](std::size_t n, double d, std::span<const float>) {
         return make_runner(gc::compressor{host, n, gc::select::exact_topk{.density = d}, gc::correct::none{},
                                           gc::encode::index_value{}});
       }},
      {"topk_ef", "exact top-k with error feedback (GRACE-style)", 0.0f,
       [=](std::size_t n, double d, std::span<const float>) {
         return make_runner(p::topk_ef(host, n, {.density = d}));
       }},
      {"dgc", "Deep Gradient Compression: sampled threshold, momentum 0.9 correction, f16 values", 0.9f,
       [=](std::size_t n, double d, std::span<const float>) { return make_runner(p::dgc(host, n, {.density = d})); }},
      {"adacomp", "AdaComp: localized selection (bin 50), residual, ternary values (density is its own)", 0.0f,
       [=](std::size_t n, double, std::span<const float>) { return make_runner(p::adacomp(host, n)); }},
      {"randomk_ef", "random-k with error feedback (shared seed)", 0.0f,
       [=](std::size_t n, double d, std::span<const float>) {
         return make_runner(p::randomk_ef(host, n, {.density = d}));
       }},
      {"threshold_ef", "fixed threshold with error feedback (tau calibrated on step 0)", 0.0f,
       [=](std::size_t n, double d, std::span<const float> first) {
         return make_runner(p::threshold_ef(host, n, {.tau = calibrated_tau(first, d)}));
       }},
  };
}

}  // namespace cli
