// Bad parameters raise gradcomp::error naming the parameter and value; a rejected call
// changes neither the output buffer nor the compressor.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <limits>
#include <sstream>

#include "support/inputs.hpp"

namespace gc = gradcomp;
using doctest::Contains;

namespace {
constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_value = std::numeric_limits<float>::infinity();

template <class C>
std::string snapshot(const C& c) {
  std::ostringstream out;
  c.save_state(out);
  return out.str();
}
}  // namespace

TEST_CASE("constructor parameters are checked by name") {
  using gc::select::exact_topk;
  const gc::backend::host h{};
  CHECK_THROWS_WITH_AS(gc::compressor(h, 100, exact_topk{.density = 0.0}), Contains("density must be in (0, 1], got 0"),
                       gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 100, exact_topk{.density = -0.5}), Contains("got -0.5"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 100, exact_topk{.density = 1.5}), Contains("got 1.5"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 100, exact_topk{.density = std::nan("")}), Contains("density"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 100, exact_topk{.count = 101}),
                       Contains("count must be in [1, n = 100], got 101"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 100, exact_topk{.density = 0.1, .count = 3}), Contains("not both"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, 0, exact_topk{.density = 0.1}),
                       Contains("n must be in [1, 4294967295], got 0"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(h, std::size_t{1} << 33, exact_topk{.density = 0.1}), Contains("got 8589934592"),
                       gc::error);
  CHECK_THROWS_WITH_AS(
      gc::compressor(h, 10, exact_topk{.density = 0.1}, gc::correct::error_feedback{.beta = inf_value}),
      Contains("beta must be finite"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(gc::backend::host{.threads = -1}, 10, exact_topk{.density = 0.1}),
                       Contains("threads must be >= 0, got -1"), gc::error);
  try {
    gc::compressor(h, 100, exact_topk{.density = 2.0});
  } catch (const gc::error& e) {
    CHECK(e.code() == gc::errc::invalid_argument);
  }
}

TEST_CASE("a rejected compress leaves the buffer and the state untouched") {
  const std::size_t n = 5000;
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{}};
  std::vector<std::byte> buf(c.max_message_bytes(), std::byte{0xAB});
  (void)c.compress(inputs::make(inputs::shape::normal, n, 1), buf);  // some residual to protect
  std::fill(buf.begin(), buf.end(), std::byte{0xAB});
  const auto state_before = snapshot(c);
  const auto buf_before = buf;

  auto g = inputs::make(inputs::shape::normal, n, 2);
  SUBCASE("NaN in the gradient") {
    g[4321] = nan_value;
    CHECK_THROWS_WITH_AS(c.compress(g, buf), Contains("grad[4321] = nan is not finite"), gc::error);
  }
  SUBCASE("infinity in the gradient") {
    g[0] = -inf_value;
    CHECK_THROWS_WITH_AS(c.compress(g, buf), Contains("grad[0] = -inf"), gc::error);
  }
  SUBCASE("overflow of the accumulated value") {
    // gamma = 2 doubles a finite gradient of float max into infinity inside the corrector.
    gc::compressor doubled{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01},
                           gc::correct::error_feedback{.gamma = 2.0f}};
    (void)doubled.compress(inputs::make(inputs::shape::normal, n, 1), buf);
    std::fill(buf.begin(), buf.end(), std::byte{0xAB});
    const auto doubled_before = snapshot(doubled);
    g[17] = std::numeric_limits<float>::max();
    CHECK_THROWS_WITH_AS(doubled.compress(g, buf), Contains("value at index 17 overflowed to inf"), gc::error);
    CHECK(snapshot(doubled) == doubled_before);
  }
  SUBCASE("infinity and NaN in a half or bfloat16 gradient") {
    std::vector<gc::half> h(n);  // +0
    std::vector<gc::bfloat16> b(n);
    h[77] = {0x7C00};  // +inf in binary16
    b[5] = {0xFFC0};   // a NaN in bfloat16
    CHECK_THROWS_WITH_AS(c.compress(h, buf), Contains("grad[77] = inf is not finite"), gc::error);
    CHECK_THROWS_WITH_AS(c.stage(b, buf), Contains("grad[5] = -nan is not finite"), gc::error);
    CHECK_THROWS_WITH_AS(c.preview(h), Contains("preview: grad[77] = inf"), gc::error);
    CHECK_FALSE(c.has_staged());
  }
  SUBCASE("wrong length of a 16-bit gradient") {
    CHECK_THROWS_WITH_AS(c.compress(std::vector<gc::bfloat16>(n + 1), buf),
                         Contains("compress: grad.size() = 5001 does not match the compressor's n = 5000"), gc::error);
    CHECK_THROWS_WITH_AS(c.preview(std::vector<gc::half>(3)), Contains("preview: grad.size() = 3"), gc::error);
  }
  SUBCASE("wrong gradient length") {
    g.pop_back();
    CHECK_THROWS_WITH_AS(c.compress(g, buf), Contains("grad.size() = 4999 does not match the compressor's n = 5000"),
                         gc::error);
  }
  SUBCASE("buffer too small") {
    std::vector<std::byte> small(c.max_message_bytes() - 1, std::byte{0xAB});
    try {
      (void)c.compress(g, small);
      FAIL("accepted a small buffer");
    } catch (const gc::error& e) {
      CHECK(e.code() == gc::errc::buffer_too_small);
      CHECK(std::string(e.what()).find("out.size() = " + std::to_string(small.size())) != std::string::npos);
    }
    CHECK(std::all_of(small.begin(), small.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
  }
  CHECK(snapshot(c) == state_before);
  CHECK(buf == buf_before);
  CHECK(c.step() == 1);
}

TEST_CASE("while clipping, the dgc step updates in place and still rejects without loss") {
  // Clipping every step: the norm pass runs first, and with a finite gradient and a
  // bounded result the new state overwrites the committed one.
  const std::size_t n = 5000;
  auto make = [&](float beta) {
    return gc::presets::dgc(gc::backend::host{}, n, {.momentum = beta, .max_norm = 1.0f},
                            gc::select::exact_topk{.density = 0.01});
  };
  std::vector<std::byte> buf;
  SUBCASE("a NaN after in-place steps") {
    auto c = make(0.9f);
    auto twin = make(0.9f);
    buf.resize(c.max_message_bytes());
    for (int t = 0; t < 3; ++t) {
      const auto g = inputs::make(inputs::shape::normal, n, 40 + static_cast<std::uint64_t>(t));
      (void)c.compress(g, buf);
      (void)twin.compress(g, buf);
    }
    std::fill(buf.begin(), buf.end(), std::byte{0xAB});
    const auto before = snapshot(c);
    auto g = inputs::make(inputs::shape::normal, n, 50);
    g[777] = nan_value;
    CHECK_THROWS_WITH_AS(c.compress(g, buf), Contains("grad[777] = nan is not finite"), gc::error);
    CHECK(snapshot(c) == before);
    CHECK(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
    // and the next step is the twin's, which never saw the NaN
    const auto next = inputs::make(inputs::shape::normal, n, 51);
    std::vector<std::byte> other(buf.size());
    const auto a = c.compress(next, buf);
    const auto b = twin.compress(next, other);
    CHECK(std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin(), b.bytes().end()));
  }
  SUBCASE("an overflow the bound foresees: the step runs double-buffered and is rejected") {
    // beta = 1e30: u grows by 1e30 a step; the third update would overflow.
    auto c = make(1e30f);
    buf.resize(c.max_message_bytes());
    (void)c.compress(inputs::make(inputs::shape::normal, n, 1), buf);
    (void)c.compress(inputs::make(inputs::shape::normal, n, 2), buf);
    const auto before = snapshot(c);
    CHECK_THROWS_WITH_AS(c.compress(inputs::make(inputs::shape::normal, n, 3), buf), Contains("overflowed to"),
                         gc::error);
    CHECK(snapshot(c) == before);
  }
}

TEST_CASE("set_density validates and applies from the next step") {
  const std::size_t n = 10000;
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.001}};
  const auto small_bytes = c.max_message_bytes();
  CHECK_THROWS_WITH_AS(c.set_density(0.0), Contains("density must be in (0, 1], got 0"), gc::error);
  CHECK_THROWS_WITH_AS(c.set_density(1.0001), Contains("got 1.0001"), gc::error);
  CHECK(c.max_message_bytes() == small_bytes);
  c.set_density(0.25);
  CHECK(c.max_message_bytes() > small_bytes);
  std::vector<std::byte> buf(c.max_message_bytes());
  CHECK(c.compress(inputs::make(inputs::shape::normal, n, 3), buf).count() == 2500);
  c.set_density(0.01);
  CHECK(c.compress(inputs::make(inputs::shape::normal, n, 4), buf).count() == 100);
}

TEST_CASE("every selector rejects non-finite gradients without a corrector too") {
  // With correct::none, full-scan selectors check finiteness in their own pass; the
  // others rely on the corrector's. Either way: an error, untouched buffer and state.
  const std::size_t n = 200003;
  auto check = [&](auto c, const char* name) {
    CAPTURE(name);
    std::vector<std::byte> buf(c.max_message_bytes(), std::byte{0x5A});
    const auto before = buf;
    for (const std::size_t at : {std::size_t{0}, std::size_t{512}, std::size_t{777}, n - 1}) {
      for (const float bad : {nan_value, inf_value, -inf_value}) {
        auto g = inputs::make(inputs::shape::normal, n, at);
        g[at] = bad;
        try {
          (void)c.compress(g, buf);
          FAIL("accepted a non-finite gradient");
        } catch (const gc::error& e) {
          CHECK(e.code() == gc::errc::non_finite);
        }
        CHECK(buf == before);
        CHECK(c.step() == 0);
      }
    }
  };
  const gc::backend::host h{};
  check(gc::compressor{h, n, gc::select::exact_topk{.density = 0.001}}, "exact_topk");
  check(gc::compressor{h, n, gc::select::exact_topk{.density = 1.0}}, "exact_topk k = n");
  check(gc::compressor{h, n, gc::select::sampled_threshold{.density = 0.001}}, "sampled_threshold");
  check(gc::compressor{h, n, gc::select::threshold{.tau = 1.0f}}, "threshold");
  check(gc::compressor{h, n, gc::select::chunk_local{}}, "chunk_local");
  check(gc::compressor{h, n, gc::select::random_k{.density = 0.001}}, "random_k");
  check(gc::compressor{h, n, gc::select::exact_topk{.density = 0.001}, gc::correct::momentum{}}, "momentum");
}
