// DGC's warm-up and DAGC's ratio plan against their closed forms.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <numeric>

namespace gc = gradcomp;

TEST_CASE("warmup gives 25%, 6.25%, 1.5625%, 0.390625%, then the final density") {
  const gc::schedule::warmup w{};
  CHECK(w.by_epoch(0) == 0.25);
  CHECK(w.by_epoch(1) == 0.0625);
  CHECK(w.by_epoch(2) == 0.015625);
  CHECK(w.by_epoch(3) == 0.00390625);
  CHECK(w.by_epoch(4) == 0.001);
  CHECK(w.by_epoch(100) == 0.001);
  CHECK(w.by_step(0, 50) == 0.25);
  CHECK(w.by_step(100, 50) == doctest::Approx(0.015625));
  CHECK(w.by_step(75, 50) == doctest::Approx(0.25 * std::pow(0.25, 1.5)));
  CHECK(w.by_step(25, 50) < w.by_step(24, 50));
  CHECK_THROWS_WITH_AS((void)w.by_step(1, 0), doctest::Contains("steps_per_epoch must be >= 1, got 0"), gc::error);
  CHECK_THROWS_WITH_AS((void)gc::schedule::warmup{.factor = 1.5}.by_epoch(0),
                       doctest::Contains("factor must be in (0, 1], got 1.5"), gc::error);
}

TEST_CASE("warmup drives a compressor through set_density") {
  const std::size_t n = 10000;
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.25}};
  const gc::schedule::warmup w{};
  std::vector<float> g(n, 1.0f);
  for (std::uint64_t epoch = 0; epoch < 6; ++epoch) {
    c.set_density(w.by_epoch(epoch));
    std::vector<std::byte> buf(c.max_message_bytes());
    const std::size_t want[] = {2500, 625, 157, 40, 10, 10};
    CHECK(c.compress(g, buf).count() == want[epoch]);
  }
}

TEST_CASE("ratio plan: budget, bounds, monotonicity and the closed form") {
  const std::vector<double> w{1.0, 2.0, 3.0, 10.0};
  const double mean = 0.01, d_min = 0.001;
  const auto d = gc::schedule::ratio_plan(w, mean, d_min);
  REQUIRE(d.size() == w.size());
  CHECK(std::accumulate(d.begin(), d.end(), 0.0) == doctest::Approx(mean * 4).epsilon(1e-12));
  for (std::size_t i = 0; i < d.size(); ++i) {
    CHECK(d[i] >= d_min);
    CHECK(d[i] <= 1.0);
    if (i > 0) CHECK(d[i] >= d[i - 1]);
  }
  // No bound binds: d_i = W * mean * w_i / sum(w).
  const double sum_w = std::accumulate(w.begin(), w.end(), 0.0);
  for (std::size_t i = 0; i < d.size(); ++i) CHECK(d[i] == doctest::Approx(4 * mean * w[i] / sum_w).epsilon(1e-12));

  // Bounds bind: tiny workers get min_density, the rest share what is left.
  const std::vector<double> skewed{1.0, 1.0, 1000.0};
  const auto ds = gc::schedule::ratio_plan(skewed, 0.4, 0.1);
  CHECK(ds[0] == doctest::Approx(0.1));
  CHECK(ds[1] == doctest::Approx(0.1));
  CHECK(ds[2] == doctest::Approx(1.0));
  CHECK(std::accumulate(ds.begin(), ds.end(), 0.0) == doctest::Approx(1.2));

  // Its objective beats the uniform plan at the same budget.
  auto objective = [&](const std::vector<double>& dd) {
    double o = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) o += w[i] * w[i] * (1.0 / dd[i] - 1.0);
    return o;
  };
  CHECK(objective(d) < objective(std::vector<double>(4, mean)));

  CHECK_THROWS_WITH_AS(gc::schedule::ratio_plan(std::vector<double>{1.0, -2.0}, 0.1, 0.01),
                       doctest::Contains("volumes[1] must be finite and > 0, got -2"), gc::error);
  CHECK_THROWS_WITH_AS(gc::schedule::ratio_plan(w, 0.01, 0.02),
                       doctest::Contains("min_density must be in (0, mean_density = 0.01], got 0.02"), gc::error);
}
