// The selectors beyond exact_topk, each against the rule docs/algorithms.md states,
// re-implemented here.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>

#include "support/engine_stages.hpp"
#include "support/inputs.hpp"
#include "support/reference.hpp"

namespace gc = gradcomp;

namespace {

// AdaComp's rule, written plainly: in each bin, i with |acc_i + g_i| >= max |acc| of the bin.
std::vector<std::uint32_t> adacomp_reference(const std::vector<float>& acc, const std::vector<float>& g,
                                             std::size_t bin) {
  const std::size_t n = acc.size();
  std::vector<std::uint32_t> want;
  for (std::size_t b = 0; b < n; b += bin) {
    float gmax = 0.0f;
    for (std::size_t i = b; i < std::min(n, b + bin); ++i) gmax = std::max(gmax, std::fabs(acc[i]));
    for (std::size_t i = b; i < std::min(n, b + bin); ++i) {
      if (std::fabs(acc[i] + g[i]) >= gmax) want.push_back(static_cast<std::uint32_t>(i));
    }
  }
  return want;
}

template <class C>
gc::sparse_vector step(C& c, const std::vector<float>& g) {
  std::vector<std::byte> buf(c.max_message_bytes());
  return gc::decode(c.compress(g, buf).bytes());
}

// True when `sel` is exactly { i : |x_i| >= t } for t = the smallest selected magnitude.
bool is_threshold_set(const std::vector<float>& x, const std::vector<std::uint32_t>& sel) {
  if (sel.empty()) return false;
  float t = std::fabs(x[sel[0]]);
  for (const auto i : sel) t = std::min(t, std::fabs(x[i]));
  std::vector<std::uint32_t> want;
  for (std::uint32_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) >= t) want.push_back(i);
  }
  return want == sel;
}

}  // namespace

TEST_CASE("sampled_threshold keeps the count in [0.8k, 1.3k] on gradient-like data") {
  std::size_t calls = 0, in_bounds = 0, wrong_set = 0;
  for (const auto shape : {inputs::shape::normal, inputs::shape::student_t3, inputs::shape::log_normal}) {
    for (const std::size_t n : {std::size_t{10000}, std::size_t{100000}, std::size_t{1000000}, std::size_t{10000000}}) {
      const auto g = inputs::make(shape, n, 77);
      for (const double d : {1e-4, 1e-3, 1e-2, 1e-1}) {
        gc::compressor c{gc::backend::host{}, n, gc::select::sampled_threshold{.density = d, .seed = 5}};
        const std::size_t k = reference::k_for(d, n);
        for (int t = 0; t < (n >= 10000000 ? 2 : 5); ++t) {  // the step moves the sample's offset
          const auto s = step(c, g);
          ++calls;
          const double count = static_cast<double>(s.indices.size());
          in_bounds += (count >= 0.8 * static_cast<double>(k) && count <= 1.3 * static_cast<double>(k)) ? 1 : 0;
          // The set is {i : |g_i| >= t} for its final threshold, or the exact top-k.
          const bool ok = is_threshold_set(g, s.indices) ||
                          (s.indices.size() == k && n <= 1000000 && s.indices == reference::top_k(g, k));
          wrong_set += ok || (n > 1000000 && is_threshold_set(g, s.indices)) ? 0 : 1;
        }
      }
    }
  }
  MESSAGE(in_bounds, " of ", calls, " calls in bounds");
  CHECK(static_cast<double>(in_bounds) >= 0.99 * static_cast<double>(calls));
  CHECK(wrong_set == 0);
}

TEST_CASE("sampled_threshold: same seed and step give the same result; tiny n is exact") {
  const auto g = inputs::make(inputs::shape::student_t3, 200000, 8);
  const gc::select::sampled_threshold policy{.density = 0.001, .seed = 42};
  gc::compressor a{gc::backend::host{.threads = 1}, g.size(), policy};
  gc::compressor b{gc::backend::host{.threads = 2}, g.size(), policy};
  std::set<std::size_t> counts;
  for (int t = 0; t < 6; ++t) {
    const auto sa = step(a, g);
    CHECK(sa.indices == step(b, g).indices);
    counts.insert(sa.indices.size());
  }
  CHECK(counts.size() > 1);  // the offset moves with the step, so estimates differ

  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{150}}) {
    const auto x = inputs::make(inputs::shape::normal, n, 3);
    gc::compressor c{gc::backend::host{}, n, gc::select::sampled_threshold{.density = 0.01}};
    CHECK(step(c, x).indices == reference::top_k(x, reference::k_for(0.01, n)));
  }
}

TEST_CASE("sampled_threshold with truncate sends the top of C, at most k") {
  const auto g = inputs::make(inputs::shape::log_normal, 300000, 4);
  gc::compressor c{gc::backend::host{}, g.size(), gc::select::sampled_threshold{.density = 0.002, .truncate = true}};
  const std::size_t k = reference::k_for(0.002, g.size());
  for (int t = 0; t < 5; ++t) {
    const auto s = step(c, g);
    CHECK(s.indices.size() <= k);
    CHECK(s.indices.size() >= k * 8 / 10);
    CHECK(s.indices == reference::top_k(g, s.indices.size()));
  }
}

TEST_CASE("sampled_threshold reuses its threshold, and checkpoints carry it") {
  const std::size_t n = 500000;
  const gc::select::sampled_threshold policy{.density = 0.001, .reuse_threshold = true};
  gc::compressor c{gc::backend::host{}, n, policy, gc::correct::error_feedback{}};
  for (int t = 0; t < 4; ++t) (void)step(c, inputs::make(inputs::shape::student_t3, n, 10 + t));
  std::stringstream saved;
  c.save_state(saved);
  gc::compressor restored{gc::backend::host{}, n, policy, gc::correct::error_feedback{}};
  restored.load_state(saved);
  const std::size_t k = reference::k_for(0.001, n);
  for (int t = 4; t < 12; ++t) {
    const auto g = inputs::make(inputs::shape::student_t3, n, 10 + t);
    const auto s = step(c, g);
    CHECK(s.indices == step(restored, g).indices);
    CHECK(s.indices.size() >= k * 8 / 10);
    CHECK(s.indices.size() <= k * 13 / 10);
  }
}

namespace {

// The steps of a compressor run one after the other, as without fusion: the corrector's
// pass, then the selector on the finished acc (sampling it directly, collecting in a
// pass of its own), the encoder and the commit. Returns the indices of each step.
template <class Selector, class Corrector>
std::vector<std::vector<std::uint32_t>> unfused_steps(std::size_t n, Selector s, Corrector c,
                                                      const std::vector<std::vector<float>>& grads) {
  const gc::backend::host host{};
  const gc::encode::index_value e{};
  gc::detail::engine_for<Selector, gc::backend::host> select(host, s, n);
  gc::detail::engine_for<Corrector, gc::backend::host> correct(host, c, n);
  gc::detail::engine_for<gc::encode::index_value, gc::backend::host> encode(host, e, n, s.max_selected(n));
  std::vector<std::uint32_t> index(s.max_selected(n));
  std::vector<float> sent(index.size());
  std::vector<std::byte> buf(e.max_bytes(n, index.size()));
  std::vector<std::vector<std::uint32_t>> out;
  for (std::uint64_t step = 0; step < grads.size(); ++step) {
    const auto& g = grads[step];
    REQUIRE(support::update_now(correct, host, c, g));
    const auto acc = correct.acc(g);
    const auto chosen = support::select_now(select, host, s, {acc, g, step}, index);
    REQUIRE(chosen.finite);
    const std::span<const std::uint32_t> idx(index.data(), chosen.count);
    support::encode_now(encode, host, e, {acc, idx, step, chosen.value_scale}, buf, sent);
    support::commit_now(correct, host, c, idx, std::span<const float>(sent.data(), chosen.count));
    correct.accept();
    select.accept();
    out.emplace_back(idx.begin(), idx.end());
  }
  return out;
}

}  // namespace

TEST_CASE(
    "sampled_threshold behind a corrector: sampling ahead and collecting in its pass select as the plain steps do") {
  using gc::correct::chain;
  using gc::correct::clip_norm;
  using gc::correct::momentum;
  for (const auto shape : {inputs::shape::normal, inputs::shape::log_normal}) {
    for (const std::size_t n : {std::size_t{10000}, std::size_t{300007}}) {
      // Gradients whose norm jumps: clip_norm clips some steps and not others, so the
      // corrector runs its norm-first (in place) and its optimistic passes, and re-runs.
      std::vector<std::vector<float>> grads;
      for (int t = 0; t < 8; ++t) {
        auto g = inputs::make(shape, n, 40 + static_cast<std::uint64_t>(t));
        const float scale = (t % 3 == 1) ? 100.0f : 0.01f;
        for (auto& x : g) x *= scale;
        grads.push_back(std::move(g));
      }
      for (const double d : {0.001, 0.01}) {
        for (const bool truncate : {false, true}) {
          CAPTURE(n);
          CAPTURE(d);
          CAPTURE(truncate);
          const gc::select::sampled_threshold s{.density = d, .seed = 9, .truncate = truncate};
          auto check = [&](auto corrector) {
            gc::compressor c{gc::backend::host{}, n, s, corrector};
            const auto want = unfused_steps(n, s, corrector, grads);
            for (std::size_t t = 0; t < grads.size(); ++t) CHECK(step(c, grads[t]).indices == want[t]);
          };
          check(gc::correct::error_feedback{});
          check(momentum{.beta = 0.9f});
          check(chain{clip_norm{.max_norm = 5.0f}, momentum{.beta = 0.9f}});
        }
      }
    }
  }
}

TEST_CASE("chunk_local follows AdaComp's rule, short last bin and straddling bins included") {
  for (const std::size_t bin :
       {std::size_t{1}, std::size_t{7}, std::size_t{50}, std::size_t{500}, std::size_t{70001}}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{49}, std::size_t{1003}, std::size_t{200003}}) {
      CAPTURE(bin);
      CAPTURE(n);
      gc::compressor c{gc::backend::host{}, n, gc::select::chunk_local{.bin = bin}, gc::correct::error_feedback{}};
      std::vector<float> residual(n, 0.0f);
      for (int t = 0; t < 3; ++t) {
        const auto g = inputs::make(inputs::shape::student_t3, n, 20 + static_cast<std::uint64_t>(t));
        std::vector<float> acc(n);
        for (std::size_t i = 0; i < n; ++i) acc[i] = residual[i] + g[i];
        const auto want = adacomp_reference(acc, g, bin);
        const auto s = step(c, g);
        REQUIRE(s.indices == want);
        for (std::size_t j = 0; j < want.size(); ++j) {
          REQUIRE(s.values[j] == acc[want[j]]);
          acc[want[j]] = 0.0f;
        }
        residual = acc;
      }
    }
  }
}

TEST_CASE("chunk_local without a corrector: threads write their runs in place, any thread count") {
  // acc = g, so the rule keeps |2 g_i| >= max |g| of the bin.
  for (const int threads : {1, 2, 3, 5}) {
    for (const std::size_t bin : {std::size_t{1}, std::size_t{7}, std::size_t{50}, std::size_t{70001}}) {
      for (const std::size_t n :
           {std::size_t{1}, std::size_t{4}, std::size_t{49}, std::size_t{1003}, std::size_t{200003}}) {
        CAPTURE(threads);
        CAPTURE(bin);
        CAPTURE(n);
        gc::compressor c{gc::backend::host{.threads = threads}, n, gc::select::chunk_local{.bin = bin}};
        const auto g = inputs::make(inputs::shape::normal, n, 77);
        const auto want = adacomp_reference(g, g, bin);
        const auto s = step(c, g);
        REQUIRE(s.indices == want);
        for (std::size_t j = 0; j < want.size(); ++j) REQUIRE(s.values[j] == g[want[j]]);
      }
    }
  }
}

// The generic algorithm's expansion (Kokkos's parallel scan, a GPU's threads) writes its
// bins in any order and side by side, each from its own offset: a bin's writer may write
// its hits and nothing past them, or a bin written before the one after it would
// overwrite that one's indices.
TEST_CASE(
    "chunk_local's bin writers for the generic expansion, the host's and a device's, write its hits and nothing past "
    "them") {
  constexpr std::uint32_t untouched = 0xFFFFFFFFu;
  // With ties, g is zero and acc holds repeated magnitudes: the hits are the entries that
  // equal their bin's largest |acc|.
  for (const bool ties : {false, true}) {
    for (const std::size_t bin : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{7}, std::size_t{50}}) {
      for (const std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{49}, std::size_t{1003}}) {
        CAPTURE(bin);
        CAPTURE(n);
        CAPTURE(ties);
        const auto acc = inputs::make(ties ? inputs::shape::ties : inputs::shape::normal, n, 31);
        const auto g = inputs::make(ties ? inputs::shape::all_zero : inputs::shape::student_t3, n, 32);
        const std::size_t bins = (n + bin - 1) / bin;
        const gc::detail::chunk_local_bins body{acc.data(), g.data(), n, bin, nullptr};
        std::vector<std::size_t> offset(bins + 1, 0);
        for (std::size_t b = 0; b < bins; ++b) offset[b + 1] = offset[b] + body(b, nullptr);
        std::vector<std::uint32_t> out(offset[bins] + 8, untouched);
        const gc::detail::chunk_local_bins writing{acc.data(), g.data(), n, bin, out.data() + out.size()};
        for (std::size_t b = bins; b-- > 0;) {  // the last bin first: any order must do
          REQUIRE(writing(b, out.data() + offset[b]) == offset[b + 1] - offset[b]);
        }
        for (std::size_t j = offset[bins]; j < out.size(); ++j) REQUIRE(out[j] == untouched);
        // A device writes with the plain loops (the host, with its SIMD kernel above).
        std::vector<std::uint32_t> plain(out.size(), untouched);
        for (std::size_t b = bins; b-- > 0;) {
          const std::size_t first = b * bin, len = std::min(bin, n - first);
          REQUIRE(gc::detail::chunk_local_bin_loops(acc.data() + first, g.data() + first, len, first,
                                                    plain.data() + offset[b],
                                                    plain.data() + plain.size()) == offset[b + 1] - offset[b]);
        }
        CHECK(plain == out);
        out.resize(offset[bins]);
        CHECK(out == adacomp_reference(acc, g, bin));
      }
    }
  }
}

TEST_CASE("random_k picks k distinct indices from the seed and step alone") {
  const std::size_t n = 100003;
  const gc::select::random_k policy{.density = 0.01, .seed = 9};
  gc::compressor a{gc::backend::host{}, n, policy};
  gc::compressor b{gc::backend::host{}, n, policy, gc::correct::error_feedback{}};  // other data, other memory
  gc::compressor other_seed{gc::backend::host{}, n, gc::select::random_k{.density = 0.01, .seed = 10}};
  std::vector<std::uint32_t> previous;
  for (int t = 0; t < 5; ++t) {
    const auto sa = step(a, inputs::make(inputs::shape::normal, n, static_cast<std::uint64_t>(t)));
    const auto sb = step(b, inputs::make(inputs::shape::ties, n, 99 + static_cast<std::uint64_t>(t)));
    REQUIRE(sa.indices.size() == reference::k_for(0.01, n));
    CHECK(std::adjacent_find(sa.indices.begin(), sa.indices.end(), std::greater_equal<>()) == sa.indices.end());
    CHECK(sa.indices == sb.indices);
    CHECK(sa.indices != step(other_seed, inputs::make(inputs::shape::normal, n, 0)).indices);
    CHECK(sa.indices != previous);
    previous = sa.indices;
  }
}

TEST_CASE("random_k is uniform (chi-square, fixed seed)") {
  const std::size_t n = 100, k = 10, steps = 20000;
  gc::compressor c{gc::backend::host{}, n, gc::select::random_k{.density = 0.1, .seed = 1234}};
  std::vector<double> hits(n, 0.0);
  const std::vector<float> g(n, 1.0f);
  std::vector<std::byte> buf(c.max_message_bytes());
  for (std::size_t t = 0; t < steps; ++t) {
    for (const auto i : gc::decode(c.compress(g, buf).bytes()).indices) hits[i] += 1.0;
  }
  const double expected = static_cast<double>(steps * k) / static_cast<double>(n);
  double chi2 = 0.0;
  for (const double h : hits) chi2 += (h - expected) * (h - expected) / expected;
  MESSAGE("chi-square with 99 degrees of freedom: ", chi2);
  CHECK(chi2 < 148.2);  // p = 0.001 critical value
  CHECK(chi2 > 59.0);   // p = 0.999: suspiciously even would be a bug too
}

TEST_CASE("random_k unbiased scales values by n/k") {
  const std::size_t n = 1000;
  const auto g = inputs::make(inputs::shape::normal, n, 1);
  gc::compressor c{gc::backend::host{}, n, gc::select::random_k{.density = 0.05, .unbiased = true}};
  const auto s = step(c, g);
  for (std::size_t j = 0; j < s.indices.size(); ++j) CHECK(s.values[j] == g[s.indices[j]] * 20.0f);
}

TEST_CASE("threshold sends exactly |acc| >= tau, possibly nothing") {
  const auto g = inputs::make(inputs::shape::student_t3, 100003, 2);
  for (const float tau : {0.0f, 0.5f, 3.0f, 1e30f}) {
    gc::compressor c{gc::backend::host{}, g.size(), gc::select::threshold{.tau = tau}};
    std::vector<std::uint32_t> want;
    for (std::uint32_t i = 0; i < g.size(); ++i) {
      if (std::fabs(g[i]) >= tau) want.push_back(i);
    }
    CAPTURE(tau);
    CHECK(step(c, g).indices == want);
  }
  CHECK_THROWS_WITH_AS(gc::compressor(gc::backend::host{}, 10, gc::select::threshold{.tau = -1.0f}),
                       doctest::Contains("tau must be finite and >= 0, got -1"), gc::error);
}

TEST_CASE("given_indices sends the caller's set and rejects bad ones whole") {
  const std::size_t n = 1000;
  const auto g = inputs::make(inputs::shape::normal, n, 3);
  gc::compressor c{gc::backend::host{}, n, gc::select::given_indices{.max_count = 4}, gc::correct::error_feedback{}};
  CHECK(step(c, g).indices.empty());
  const std::vector<std::uint32_t> set{3, 10, 999};
  c.set_indices(set);
  const auto s = step(c, g);
  CHECK(s.indices == set);
  CHECK(s.values[1] == 2.0f * g[10]);  // residual of step 1 plus step 2
  const std::vector<std::uint32_t> too_many{1, 2, 3, 4, 5}, unsorted{5, 4}, repeated{5, 5}, out_of_range{1, 1000};
  CHECK_THROWS_WITH_AS(c.set_indices(too_many), doctest::Contains("5 indices exceed the selector's capacity of 4"),
                       gc::error);
  CHECK_THROWS_WITH_AS(c.set_indices(unsorted), doctest::Contains("indices[1] = 4 does not exceed indices[0] = 5"),
                       gc::error);
  CHECK_THROWS_AS(c.set_indices(repeated), gc::error);
  CHECK_THROWS_WITH_AS(c.set_indices(out_of_range), doctest::Contains("indices[1] = 1000 is not below n = 1000"),
                       gc::error);
  CHECK(step(c, g).indices == set);
}

TEST_CASE("selector parameters are validated by name") {
  const gc::backend::host h{};
  using gc::select::sampled_threshold;
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, sampled_threshold{.density = 0}),
                       doctest::Contains("density must be in (0, 1], got 0"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, sampled_threshold{.density = 0.1, .sample_ratio = 2}),
                       doctest::Contains("sample_ratio"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, sampled_threshold{.density = 0.1, .lower = 1.0f}),
                       doctest::Contains("lower must be in (0, 1), got 1"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, sampled_threshold{.density = 0.1, .upper = 0.5f}),
                       doctest::Contains("upper must be finite and >= 1, got 0.5"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, sampled_threshold{.density = 0.1, .max_iters = 0}),
                       doctest::Contains("max_iters must be >= 1, got 0"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, gc::select::chunk_local{.bin = 0}),
                       doctest::Contains("bin must be >= 1, got 0"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, gc::select::random_k{.density = 1.5}),
                       doctest::Contains("random_k: density must be in (0, 1], got 1.5"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 10, gc::select::given_indices{.max_count = 11}),
                       doctest::Contains("max_count must be in [1, n = 10], got 11"), gc::error);
}

TEST_CASE("a density names the count it says: decimal fractions of n included, for every selector with one") {
  // 100 * 0.07 is 7.000000000000001 in double, and ceil of it 8: the count is 7.
  CHECK(gc::select::exact_topk{.density = 0.07}.k(100) == 7);
  CHECK(gc::select::random_k{.density = 0.07}.k(100) == 7);
  CHECK(gc::select::sampled_threshold{.density = 0.07}.k(100) == 7);
  CHECK(gc::select::given_indices{.density = 0.07}.max_selected(100) == 7);
  // Against the bisection of support/reference.hpp, over the quotients m / n and the
  // densities next to them.
  for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{100}, std::size_t{1000},
                              std::size_t{3001}, std::size_t{65537}}) {
    for (std::size_t m = 1; m <= n; m += 1 + n / 211) {
      const double quotient = static_cast<double>(m) / static_cast<double>(n);
      for (const double d : {quotient, std::nextafter(quotient, 0.0), std::nextafter(quotient, 2.0)}) {
        if (!(d > 0.0 && d <= 1.0)) continue;
        CAPTURE(n);
        CAPTURE(d);
        const std::size_t want = reference::k_for(d, n);
        CHECK(gc::select::exact_topk{.density = d}.k(n) == want);
        CHECK(gc::select::random_k{.density = d}.k(n) == want);
        CHECK(gc::select::given_indices{.density = d}.max_selected(n) == want);
      }
      CHECK(gc::select::exact_topk{.density = static_cast<double>(m) / static_cast<double>(n)}.k(n) == m);
    }
  }
  for (const char* text : {"0.07", "0.001", "0.3", "0.0123", "0.9", "0.01"}) {
    const double d = std::stod(text);
    for (const std::size_t n : {std::size_t{100}, std::size_t{1000}, std::size_t{10000}, std::size_t{25000000}}) {
      CAPTURE(text);
      CAPTURE(n);
      CHECK(gc::select::exact_topk{.density = d}.k(n) == reference::k_for(d, n));
    }
  }
  // What a compressor sends.
  gc::compressor c{gc::backend::host{}, 100, gc::select::exact_topk{.density = 0.07}, gc::correct::error_feedback{}};
  CHECK(step(c, inputs::make(inputs::shape::normal, 100, 1)).indices.size() == 7);
}

TEST_CASE("given_indices with a density: set_density moves its capacity, and a set that no longer fits is dropped") {
  const std::size_t n = 1000;
  const auto g = inputs::make(inputs::shape::normal, n, 5);
  gc::compressor c{gc::backend::host{}, n, gc::select::given_indices{.density = 0.004}, gc::correct::error_feedback{}};
  CHECK(c.max_message_bytes() == c.encoder().max_bytes(n, 4));
  const std::vector<std::uint32_t> four{1, 2, 3, 4}, six{1, 2, 3, 4, 5, 6};
  CHECK_THROWS_WITH_AS(c.set_indices(six), doctest::Contains("6 indices exceed the selector's capacity of 4"),
                       gc::error);
  c.set_indices(four);
  c.set_density(0.006);  // grows: the set stays
  CHECK(step(c, g).indices == four);
  c.set_indices(six);
  CHECK(step(c, g).indices == six);
  c.set_density(0.002);  // shrinks below the set: dropped, nothing sent
  CHECK(step(c, g).indices.empty());
  CHECK_THROWS_WITH_AS(c.set_density(0.0),
                       doctest::Contains("given_indices: set density (in (0, 1]) or max_count (in [1, n = 1000]); "
                                         "both are 0"),
                       gc::error);
  CHECK_THROWS_WITH_AS(c.set_density(-0.5), doctest::Contains("given_indices: density must be in (0, 1], got -0.5"),
                       gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(gc::backend::host{}, 10, gc::select::given_indices{}),
                       doctest::Contains("set density (in (0, 1]) or max_count (in [1, n = 10]); both are 0"),
                       gc::error);
  CHECK_THROWS_WITH_AS(
      gc::compressor(gc::backend::host{}, 10, gc::select::given_indices{.max_count = 2, .density = 0.5}),
      doctest::Contains("set density or max_count, not both"), gc::error);
  // A checkpoint keeps the density.
  std::stringstream saved;
  c.save_state(saved);
  gc::compressor d{gc::backend::host{}, n, gc::select::given_indices{.density = 0.5}, gc::correct::error_feedback{}};
  d.load_state(saved);
  CHECK(d.selector().density == 0.002);
}

namespace {

// Converts to any field's type: T{fill, fill, ...} compiles for as many fields as T has
// (an aggregate), which counts them without settings().
struct fill {
  template <class U>
  operator U() const;  // NOLINT: implicit on purpose
};
template <class T, class... Fills>
constexpr std::size_t field_count() {
  if constexpr (requires { T{Fills{}..., fill{}}; }) {
    return field_count<T, Fills..., fill>();
  } else {
    return sizeof...(Fills);
  }
}

// Every field of T is one of its settings, once, under a name of its own.
template <class T>
void check_settings_cover_every_field() {
  std::set<std::string> names;
  std::set<const void*> members;
  T object{};
  std::size_t count = 0;
  gc::for_each_setting(object, [&](const char* name, auto& member) {
    names.insert(name);
    members.insert(&member);
    ++count;
  });
  CAPTURE(typeid(T).name());
  CHECK(count == field_count<T>());
  CHECK(names.size() == count);
  CHECK(members.size() == count);
}

}  // namespace

TEST_CASE("every policy and preset names each of its fields as a setting, once") {
  check_settings_cover_every_field<gc::select::exact_topk>();
  check_settings_cover_every_field<gc::select::sampled_threshold>();
  check_settings_cover_every_field<gc::select::chunk_local>();
  check_settings_cover_every_field<gc::select::random_k>();
  check_settings_cover_every_field<gc::select::threshold>();
  check_settings_cover_every_field<gc::select::given_indices>();
  check_settings_cover_every_field<gc::correct::error_feedback>();
  check_settings_cover_every_field<gc::correct::momentum>();
  check_settings_cover_every_field<gc::correct::low_pass>();
  check_settings_cover_every_field<gc::correct::clip_norm>();
#define CHECK_PRESET(M, S, DESCRIPTION) check_settings_cover_every_field<gc::presets::M##_options>();
  GRADCOMP_PRESETS(CHECK_PRESET)
#undef CHECK_PRESET
  // Read through a setting, the member's value; written through it, the member changes.
  gc::presets::dgc_options dgc{};
  gc::for_each_setting(dgc, [](const char* name, auto& member) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(member)>, float>) {
      if (std::string(name) == "momentum") member = 0.5f;
    }
  });
  CHECK(dgc.momentum == 0.5f);
}
