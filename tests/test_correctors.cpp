// Correctors against their formulas (docs/algorithms.md), step by step, written out here.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <sstream>

#include "support/inputs.hpp"
#include "support/reference.hpp"

namespace gc = gradcomp;

namespace {

constexpr std::size_t n = 2053;
constexpr std::size_t k = 31;

std::vector<float> gradient(int t) {
  return inputs::make(inputs::shape::student_t3, n, 500 + static_cast<std::uint64_t>(t));
}

// Runs a compressor with exact top-k (count k) and returns each step's decoded message.
template <class C>
gc::sparse_vector run_step(C& c, const std::vector<float>& g) {
  std::vector<std::byte> buf(c.max_message_bytes());
  return gc::decode(c.compress(g, buf).bytes());
}

}  // namespace

TEST_CASE("momentum follows DGC's momentum correction and masking for 50 steps") {
  for (const bool nesterov : {false, true}) {
    for (const bool masking : {true, false}) {
      CAPTURE(nesterov);
      CAPTURE(masking);
      const float beta = 0.9f;
      gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = k},
                       gc::correct::momentum{.beta = beta, .nesterov = nesterov, .masking = masking}};
      std::vector<float> u(n, 0.0f), v(n, 0.0f);
      std::vector<double> u_sum(n, 0.0), sent_sum(n, 0.0), scale(n, 0.0);
      for (int t = 0; t < 50; ++t) {
        const auto g = gradient(t);
        for (std::size_t i = 0; i < n; ++i) {
          if (nesterov) {
            u[i] = beta * (u[i] + g[i]);
            v[i] = v[i] + u[i] + g[i];
            u_sum[i] += static_cast<double>(u[i]) + g[i];  // what Nesterov adds to v
          } else {
            u[i] = beta * u[i] + g[i];
            v[i] = v[i] + u[i];
            u_sum[i] += u[i];
          }
          scale[i] += std::fabs(static_cast<double>(v[i])) + std::fabs(static_cast<double>(u[i]));
        }
        const auto want = reference::top_k(v, k);
        const auto got = run_step(c, g);
        REQUIRE(got.indices == want);
        for (std::size_t j = 0; j < want.size(); ++j) {
          REQUIRE(got.values[j] == v[want[j]]);
          sent_sum[want[j]] += got.values[j];
          v[want[j]] -= got.values[j];
          if (masking) u[want[j]] = 0.0f;
        }
      }
      const auto u_lib = c.corrector_state(0);
      const auto v_lib = c.corrector_state(1);
      std::size_t leaks = 0;
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(u_lib[i] == u[i]);
        REQUIRE(v_lib[i] == v[i]);
        // Conservation: v + everything sent == what was added to v over all steps.
        leaks += std::fabs(v[i] + sent_sum[i] - u_sum[i]) > 1e-5 * (scale[i] + 1e-30) ? 1 : 0;
      }
      CHECK(leaks == 0);
    }
  }
}

TEST_CASE("clip_norm scales the gradient to max_norm / sqrt(workers)") {
  const auto g = gradient(0);
  double sq = 0.0;
  for (const float x : g) sq += static_cast<double>(x) * x;
  const double norm = std::sqrt(sq);
  for (const double fraction : {0.25, 2.0}) {
    const float max_norm = static_cast<float>(norm * fraction * 2.0);
    gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.density = 1.0},
                     gc::correct::clip_norm{.max_norm = max_norm, .workers = 4}};
    const auto got = run_step(c, g);
    const double limit = static_cast<double>(max_norm) / 2.0;
    const float factor = norm > limit ? static_cast<float>(limit / norm) : 1.0f;
    CAPTURE(fraction);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(got.values[i] == g[i] * factor);
  }
}

TEST_CASE("low_pass filters the residual as ScaleCom does") {
  for (const float beta : {1.0f, 0.3f}) {
    gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = k}, gc::correct::low_pass{.beta = beta}};
    std::vector<float> m(n, 0.0f);
    for (int t = 0; t < 30; ++t) {
      const auto g = gradient(t);
      std::vector<float> acc(n);
      for (std::size_t i = 0; i < n; ++i) acc[i] = m[i] + g[i];
      const auto want = reference::top_k(acc, k);
      const auto got = run_step(c, g);
      REQUIRE(got.indices == want);
      std::vector<float> sent(n, 0.0f);
      for (std::size_t j = 0; j < want.size(); ++j) sent[want[j]] = got.values[j];
      for (std::size_t i = 0; i < n; ++i) m[i] = (1.0f - beta) * m[i] + beta * (acc[i] - sent[i]);
    }
    for (std::size_t i = 0; i < n; ++i) REQUIRE(c.corrector_state(0)[i] == m[i]);
  }
}

TEST_CASE("chain clips, then runs the stateful corrector") {
  const float max_norm = 0.05f;
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = k},
                   gc::correct::chain{gc::correct::clip_norm{.max_norm = max_norm}, gc::correct::error_feedback{}}};
  CHECK(c.corrector().name() == "chain(clip_norm,error_feedback)");
  std::vector<float> e(n, 0.0f);
  for (int t = 0; t < 10; ++t) {
    const auto g = gradient(t);
    double sq = 0.0;
    for (const float x : g) sq += static_cast<double>(x) * x;
    const float factor = std::sqrt(sq) > max_norm ? static_cast<float>(max_norm / std::sqrt(sq)) : 1.0f;
    for (std::size_t i = 0; i < n; ++i) e[i] = e[i] + g[i] * factor;
    const auto want = reference::top_k(e, k);
    const auto got = run_step(c, g);
    REQUIRE(got.indices == want);
    for (std::size_t j = 0; j < want.size(); ++j) {
      REQUIRE(got.values[j] == e[want[j]]);
      e[want[j]] = 0.0f;
    }
  }
}

TEST_CASE("corrector parameters are validated by name") {
  using gc::select::exact_topk;
  const gc::backend::host h{};
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, exact_topk{.count = 1}, gc::correct::momentum{.beta = NAN}),
                       doctest::Contains("momentum: beta must be finite"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, exact_topk{.count = 1}, gc::correct::clip_norm{.max_norm = 0.0f}),
                       doctest::Contains("clip_norm: max_norm must be > 0, got 0"), gc::error);
  CHECK_THROWS_WITH_AS(
      gc::compressor(h, 10, exact_topk{.count = 1}, gc::correct::clip_norm{.max_norm = 1, .workers = 0}),
      doctest::Contains("workers must be >= 1, got 0"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, exact_topk{.count = 1}, gc::correct::low_pass{.beta = 1.5f}),
                       doctest::Contains("low_pass: beta must be in (0, 1], got 1.5"), gc::error);
  CHECK_THROWS_WITH_AS(
      gc::compressor(h, 10, exact_topk{.count = 1},
                     gc::correct::chain{gc::correct::clip_norm{.max_norm = -1}, gc::correct::momentum{}}),
      doctest::Contains("max_norm must be > 0, got -1"), gc::error);
}

TEST_CASE("the dgc preset with exact selection reproduces a plain DGC for 50 steps") {
  const float max_norm = 85.0f;  // the base gradient's norm is about 78: the scaled steps clip
  const double density = 0.01;
  auto c = gc::presets::dgc(gc::backend::host{}, n, {.momentum = 0.9f, .max_norm = max_norm},
                            gc::select::exact_topk{.density = density});
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  const std::size_t k = reference::k_for(density, n);
  int clipped = 0;
  for (int t = 0; t < 50; ++t) {
    auto g = gradient(t);
    for (auto& x : g) x *= 1.0f + 0.05f * static_cast<float>(t % 7);  // vary the norm
    double sq = 0.0;
    for (const float x : g) sq += static_cast<double>(x) * x;
    const double norm = std::sqrt(sq);
    const float factor = norm > max_norm ? static_cast<float>(max_norm / norm) : 1.0f;
    clipped += factor < 1.0f ? 1 : 0;
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = 0.9f * u[i] + g[i] * factor;
      v[i] = v[i] + u[i];
    }
    const auto idx = reference::top_k(v, k);
    const auto got = run_step(c, g);
    REQUIRE(got.indices == idx);
    for (std::size_t j = 0; j < idx.size(); ++j) {
      const float sent = static_cast<float>(static_cast<_Float16>(v[idx[j]]));  // f16 values, round to nearest even
      REQUIRE(got.values[j] == sent);
      v[idx[j]] -= sent;
      u[idx[j]] = 0.0f;
    }
  }
  CHECK(clipped > 0);
  CHECK(clipped < 50);
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(c.corrector_state(0)[i] == u[i]);
    REQUIRE(c.corrector_state(1)[i] == v[i]);
  }
}

namespace {

// preview(g) against what compress(g) ranks: a twin compressor, kept in step, sends
// every entry (density 1, f32 values) at the step previewed.
template <class Corrector>
void preview_matches_compress(Corrector corrector, float scale_grad) {
  using gc::select::exact_topk;
  const gc::encode::index_value exact_values{.index = gc::index_coding::raw32, .value = gc::value_coding::f32};
  gc::compressor a{gc::backend::host{}, n, exact_topk{.density = 0.01}, corrector, exact_values};
  gc::compressor twin{gc::backend::host{}, n, exact_topk{.density = 0.01}, corrector, exact_values};
  std::vector<std::byte> buf(a.max_message_bytes());
  for (int t = 0; t < 12; ++t) {
    auto g = gradient(t);
    for (auto& x : g) x *= scale_grad * (1.0f + 0.3f * static_cast<float>(t % 4));  // clips on some steps only
    std::ostringstream before, after;
    a.save_state(before);
    const auto acc = a.preview(g);
    const std::vector<float> previewed(acc.begin(), acc.end());
    a.save_state(after);
    REQUIRE(before.str() == after.str());  // nothing changed

    auto all = twin;
    all.set_density(1.0);
    std::vector<std::byte> all_buf(all.max_message_bytes());
    const auto sent = gc::decode(all.compress(g, all_buf).bytes());
    REQUIRE(sent.values.size() == n);
    CAPTURE(t);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(previewed[i] == sent.values[i]);

    const auto ma = a.compress(g, buf);
    const std::vector<std::byte> first(ma.bytes().begin(), ma.bytes().end());
    const auto mt = twin.compress(g, buf);
    REQUIRE(first == std::vector<std::byte>(mt.bytes().begin(), mt.bytes().end()));
  }
}

}  // namespace

TEST_CASE("preview gives what the next compress ranks and changes nothing") {
  preview_matches_compress(gc::correct::none{}, 1.0f);
  preview_matches_compress(gc::correct::error_feedback{.beta = 0.9f, .gamma = 0.5f}, 1.0f);
  preview_matches_compress(gc::correct::momentum{.beta = 0.9f}, 1.0f);
  preview_matches_compress(gc::correct::momentum{.beta = 0.9f, .nesterov = true, .masking = false}, 1.0f);
  preview_matches_compress(gc::correct::low_pass{.beta = 0.5f}, 1.0f);
  // The norm is about 78 at scale 1: steps at scales 1.3..1.9 clip at 100, scale 1 does not.
  preview_matches_compress(gc::correct::clip_norm{.max_norm = 100.0f}, 1.0f);
  preview_matches_compress(gc::correct::chain{gc::correct::clip_norm{.max_norm = 100.0f}, gc::correct::momentum{}},
                           1.0f);
  preview_matches_compress(
      gc::correct::chain{gc::correct::clip_norm{.max_norm = 100.0f}, gc::correct::error_feedback{}}, 1.0f);
}

TEST_CASE("preview rejects a bad gradient by name and changes nothing") {
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = k}, gc::correct::error_feedback{}};
  std::vector<std::byte> buf(c.max_message_bytes());
  auto g = gradient(0);
  for (std::size_t i = 100; i < 100 + k; ++i) g[i] = 3.3e38f;  // these k are sent ...
  g[3] = 3e38f;                                                // ... and this one stays in e
  (void)c.compress(g, buf);
  std::ostringstream before, after;
  c.save_state(before);
  g = gradient(1);
  g[7] = NAN;
  CHECK_THROWS_WITH_AS((void)c.preview(g), "gradcomp: preview: grad[7] = nan is not finite", gc::error);
  CHECK_THROWS_WITH_AS((void)c.preview(std::vector<float>(n - 1)),
                       "gradcomp: preview: grad.size() = 2052 does not match the compressor's n = 2053", gc::error);
  g = gradient(1);
  g[3] = 3e38f;
  CHECK_THROWS_WITH_AS((void)c.preview(g),
                       doctest::Contains("preview: the corrector's value at index 3 overflowed to inf"), gc::error);
  c.save_state(after);
  CHECK(before.str() == after.str());
}
