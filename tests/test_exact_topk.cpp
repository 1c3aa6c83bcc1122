// exact_topk against the sort-based reference on every input shape and awkward size.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include "support/inputs.hpp"
#include "support/reference.hpp"

namespace gc = gradcomp;

namespace {

std::vector<std::uint32_t> select_with_library(const std::vector<float>& x, gc::select::exact_topk policy,
                                               int threads) {
  gc::compressor c{gc::backend::host{.threads = threads}, x.size(), policy};
  std::vector<std::byte> buf(c.max_message_bytes());
  const gc::message m = c.compress(x, buf);
  return gc::decode(m.bytes()).indices;
}

}  // namespace

TEST_CASE("exact_topk selects the reference top-k on every shape and size") {
  const double densities[] = {1e-4, 1e-3, 1e-2, 0.3, 1.0};
  for (const auto s : inputs::all_shapes) {
    for (const std::size_t n : inputs::awkward_sizes) {
      const auto x = inputs::make(s, n, 42);
      for (const double d : densities) {
        const std::size_t k = reference::k_for(d, n);
        if (n > 100000 && k > 20000 && k < n) continue;  // the reference sort is the slow part
        CAPTURE(inputs::name(s));
        CAPTURE(n);
        CAPTURE(d);
        const auto want = reference::top_k(x, k);
        CHECK(select_with_library(x, {.density = d}, 2) == want);
      }
    }
  }
}

TEST_CASE("exact_topk by count, including k = 1 and k = n") {
  for (const auto s : inputs::all_shapes) {
    const auto x = inputs::make(s, 1000, 7);
    for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{999}, std::size_t{1000}}) {
      CAPTURE(inputs::name(s));
      CAPTURE(k);
      CHECK(select_with_library(x, {.count = k}, 2) == reference::top_k(x, k));
    }
  }
}

TEST_CASE("exact_topk resolves ties by the lower index across tile boundaries") {
  // 5 * 2^15 + 11 elements all of equal magnitude with alternating signs: the choice is
  // decided purely by index, across several host tiles.
  const std::size_t n = 5 * (std::size_t{1} << 15) + 11;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.5f : 1.5f);
  for (const std::size_t k : {std::size_t{1}, std::size_t{40000}, std::size_t{100000}}) {
    const auto got = select_with_library(x, {.count = k}, 2);
    REQUIRE(got.size() == k);
    CHECK(got.front() == 0);
    CHECK(got.back() == k - 1);
  }
}

TEST_CASE("exact_topk is identical with one and two threads") {
  for (const auto s : inputs::all_shapes) {
    const auto x = inputs::make(s, (std::size_t{1} << 20) + 3, 3);
    CAPTURE(inputs::name(s));
    CHECK(select_with_library(x, {.density = 1e-3}, 1) == select_with_library(x, {.density = 1e-3}, 2));
  }
}

TEST_CASE("exact_topk on random small cases against the reference") {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng() % 5000;
    const auto s = inputs::all_shapes[rng() % std::size(inputs::all_shapes)];
    const auto x = inputs::make(s, n, rng());
    const std::size_t k = 1 + rng() % n;
    CAPTURE(n);
    CAPTURE(k);
    CAPTURE(inputs::name(s));
    REQUIRE(select_with_library(x, {.count = k}, 1 + static_cast<int>(trial % 2)) == reference::top_k(x, k));
  }
}
