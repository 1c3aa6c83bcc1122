// Plain, obviously-correct references for the conformance tests. Nothing here includes
// or calls gradcomp: a bug shared by the library and its reference cannot hide.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace reference {

// k = clamp(ceil(d n), 1, n), as ALGORITHMS.md defines it.
inline std::size_t k_for(double density, std::size_t n) {
  const auto k = static_cast<std::size_t>(std::ceil(density * static_cast<double>(n)));
  return std::min(std::max<std::size_t>(k, 1), n);
}

// The k entries of largest |x|, ties to the lower index, returned ascending: sort every
// index by (|x| descending, index ascending) and keep the first k.
inline std::vector<std::uint32_t> top_k(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    const float fa = std::fabs(x[a]);
    const float fb = std::fabs(x[b]);
    return fa != fb ? fa > fb : a < b;
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// One step of top-k with error feedback: e = beta e + gamma g, send top-k of e, zero it.
struct topk_error_feedback {
  std::vector<float> e;
  float beta = 1.0f;
  float gamma = 1.0f;

  std::pair<std::vector<std::uint32_t>, std::vector<float>> step(const std::vector<float>& g, std::size_t k) {
    if (e.empty()) e.assign(g.size(), 0.0f);
    for (std::size_t i = 0; i < g.size(); ++i) e[i] = beta * e[i] + gamma * g[i];
    auto idx = top_k(e, k);
    std::vector<float> values;
    for (const auto i : idx) {
      values.push_back(e[i]);
      e[i] -= e[i];
    }
    return {idx, values};
  }
};

}  // namespace reference
