// Index and value codings: exact round trips, IEEE rounding against independent
// references, stated error bounds, unbiasedness, and a hardened decoder for each.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <random>

#include "support/engine_stages.hpp"
#include "support/inputs.hpp"
#include "support/reference.hpp"

namespace gc = gradcomp;
using gc::index_coding;
using gc::value_coding;

namespace {

constexpr index_coding index_codings[] = {index_coding::raw32, index_coding::delta_bitpack, index_coding::bitmap,
                                          index_coding::automatic};
constexpr value_coding value_codings[] = {value_coding::f32,  value_coding::f16,     value_coding::bf16,
                                          value_coding::int8, value_coding::ternary, value_coding::qsgd,
                                          value_coding::int4};

// A message carrying exactly `indices` of `x`, through the public API (given_indices).
std::vector<std::byte> message_of(const std::vector<float>& x, const std::vector<std::uint32_t>& indices,
                                  gc::encode::index_value enc, std::uint64_t steps = 1) {
  gc::compressor c{gc::backend::host{}, x.size(),
                   gc::select::given_indices{.max_count = std::max<std::size_t>(indices.size(), 1)},
                   gc::correct::none{}, enc};
  c.set_indices(indices);
  std::vector<std::byte> buf(c.max_message_bytes());
  gc::message m;
  for (std::uint64_t t = 0; t < steps; ++t) m = c.compress(x, buf);
  return {m.bytes().begin(), m.bytes().end()};
}

std::vector<std::uint32_t> random_subset(std::size_t n, double density, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution keep(density);
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (keep(rng)) out.push_back(i);
  }
  return out;
}

// Nearest bfloat16 to f, ties to even, by comparing the two neighbours in double; IEEE
// rounds magnitudes from the midpoint 0x1.FFp127 up to infinity, we saturate instead.
std::uint16_t reference_bfloat(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if (std::fabs(static_cast<double>(f)) >= 0x1.FFp127)
    return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7F7Fu);
  const std::uint32_t lo = x & 0xFFFF0000u;  // truncated: toward zero
  const std::uint32_t hi = lo + 0x10000u;    // one bfloat step away from zero
  const double d_lo = std::fabs(static_cast<double>(f) - static_cast<double>(std::bit_cast<float>(lo)));
  const double d_hi = std::fabs(static_cast<double>(std::bit_cast<float>(hi)) - static_cast<double>(f));
  const std::uint32_t pick = d_lo < d_hi ? lo : d_hi < d_lo ? hi : (((lo >> 16) & 1u) ? hi : lo);
  return static_cast<std::uint16_t>(pick >> 16);
}

std::vector<float> float_classes() {
  std::vector<float> v;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 4099) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (std::isfinite(f)) v.push_back(f);
  }
  for (const float f : {0.0f,
                        -0.0f,
                        65504.0f,
                        65519.99f,
                        65520.0f,
                        -65520.0f,
                        1e10f,
                        -3.4e38f,
                        3.4028235e38f,
                        0x1.0p-14f,
                        0x1.0p-24f,
                        0x1.0p-25f,
                        0x1.8p-25f,
                        0x1.0p-26f,
                        0x1.FFCp-15f,
                        1.0f + 0x1.0p-11f,
                        1.0f + 0x1.8p-11f,
                        1.0f + 0x1.0p-8f,
                        1.0f + 0x1.8p-8f,
                        std::numeric_limits<float>::denorm_min()}) {
    v.push_back(f);
  }
  return v;
}

}  // namespace

TEST_CASE("index codings round-trip exactly with f32 values") {
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{130}, std::size_t{100003}}) {
    const auto x = inputs::make(inputs::shape::student_t3, n, 1);
    for (const double density : {0.0, 0.001, 0.05, 0.5, 1.0}) {
      auto subset = random_subset(n, density, n + static_cast<std::uint64_t>(density * 1000));
      if (density > 0 && subset.empty()) subset.push_back(static_cast<std::uint32_t>(n - 1));
      for (const auto coding : index_codings) {
        CAPTURE(n);
        CAPTURE(density);
        CAPTURE(gc::to_string(coding));
        const auto s = gc::decode(message_of(x, subset, {.index = coding}));
        REQUIRE(s.indices == subset);
        for (std::size_t j = 0; j < subset.size(); ++j) REQUIRE(s.values[j] == x[subset[j]]);
      }
    }
  }
}

TEST_CASE("delta_bitpack handles gaps of every width, up to the full 32 bits") {
  const std::size_t n = 0xFFFFFFFFu;  // the largest tensor a message can describe
  std::vector<std::uint32_t> indices;
  std::uint64_t at = 0;
  for (unsigned width = 0; width <= 31 && at < n; ++width) {
    for (int r = 0; r < 5 && at < n; ++r) {
      indices.push_back(static_cast<std::uint32_t>(at));
      at += (std::uint64_t{1} << width);
    }
  }
  indices.push_back(0xFFFFFFFEu);
  // Write the message from its entries: a tensor of 2^32 - 1 floats does not fit this machine.
  const gc::encode::index_value policy{.index = index_coding::delta_bitpack};
  const std::vector<float> values(indices.size(), 1.0f);
  std::vector<float> sent(indices.size());
  std::vector<std::byte> message(policy.max_bytes(n, indices.size()));
  message.resize(support::encode_message(policy, n, indices, values, message, sent, 0));
  const gc::message_header h = gc::detail::read_header(message, message.size());
  CHECK(h.index_bytes == reference::index_section_bytes(reference::indices::delta_bitpack, n, indices));
  CHECK(gc::decode(message).indices == indices);
}

TEST_CASE("auto picks the smallest index coding") {
  const std::size_t n = 50000;
  const auto x = inputs::make(inputs::shape::normal, n, 2);
  for (const double density : {0.0001, 0.01, 0.03, 0.2, 0.9}) {
    const auto subset = random_subset(n, density, 3);
    std::size_t smallest = SIZE_MAX;
    for (const auto coding : {index_coding::raw32, index_coding::delta_bitpack, index_coding::bitmap}) {
      smallest = std::min(smallest, message_of(x, subset, {.index = coding}).size());
    }
    CAPTURE(density);
    CHECK(message_of(x, subset, {.index = index_coding::automatic}).size() == smallest);
  }
}

TEST_CASE("half and bfloat16 gradients widen exactly: all 65,536 patterns of each") {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    CAPTURE(bits);
    // binary16: sign, 5 exponent bits (bias 15), 10 fraction bits; exponent 0 is subnormal.
    const std::uint32_t e = (bits >> 10) & 0x1Fu;
    const double fraction = static_cast<double>(bits & 0x3FFu) / 1024.0;
    double value = e == 0 ? std::ldexp(fraction, -14) : std::ldexp(1.0 + fraction, static_cast<int>(e) - 15);
    if (e == 31) value = (bits & 0x3FFu) == 0 ? HUGE_VAL : std::nan("");
    if (bits & 0x8000u) value = -value;
    const float widened = gc::to_float(gc::half{static_cast<std::uint16_t>(bits)});
    if (std::isnan(value)) {
      REQUIRE(std::isnan(widened));
    } else {
      REQUIRE(std::bit_cast<std::uint32_t>(widened) == std::bit_cast<std::uint32_t>(static_cast<float>(value)));
    }
    // bfloat16: the top 16 bits of the binary32.
    REQUIRE(std::bit_cast<std::uint32_t>(gc::to_float(gc::bfloat16{static_cast<std::uint16_t>(bits)})) == bits << 16);
  }
}

TEST_CASE("f16 equals IEEE round-to-nearest-even (saturating) on every input class") {
  const auto v = float_classes();
  std::vector<std::uint32_t> all(v.size());
  std::iota(all.begin(), all.end(), 0u);
  const auto s = gc::decode(message_of(v, all, {.index = index_coding::raw32, .value = value_coding::f16}));
  std::size_t mismatches = 0;
  for (std::size_t j = 0; j < v.size(); ++j) {
    // Reference: the compiler's _Float16 conversion (IEEE, round to nearest even); we
    // saturate where IEEE overflows to infinity.
    float want = static_cast<float>(static_cast<_Float16>(v[j]));
    if (std::isinf(want)) want = std::copysign(65504.0f, v[j]);
    mismatches += std::bit_cast<std::uint32_t>(s.values[j]) == std::bit_cast<std::uint32_t>(want) ? 0 : 1;
  }
  CHECK(mismatches == 0);
  MESSAGE(v.size(), " values checked");
}

TEST_CASE("bf16 equals IEEE round-to-nearest-even (saturating) on every input class") {
  const auto v = float_classes();
  std::vector<std::uint32_t> all(v.size());
  std::iota(all.begin(), all.end(), 0u);
  const auto s = gc::decode(message_of(v, all, {.index = index_coding::raw32, .value = value_coding::bf16}));
  std::size_t mismatches = 0;
  for (std::size_t j = 0; j < v.size(); ++j) {
    const float want = std::bit_cast<float>(static_cast<std::uint32_t>(reference_bfloat(v[j])) << 16);
    mismatches += std::bit_cast<std::uint32_t>(s.values[j]) == std::bit_cast<std::uint32_t>(want) ? 0 : 1;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("int8 and ternary stay within their stated error") {
  for (const auto shape :
       {inputs::shape::normal, inputs::shape::log_normal, inputs::shape::ties, inputs::shape::all_zero}) {
    const auto x = inputs::make(shape, 5000, 4);
    const auto subset = random_subset(x.size(), 0.1, 5);
    float largest = 0.0f;
    double magnitude = 0.0;
    for (const auto i : subset) {
      largest = std::max(largest, std::fabs(x[i]));
      magnitude += std::fabs(static_cast<double>(x[i]));
    }
    CAPTURE(inputs::name(shape));
    const auto q = gc::decode(message_of(x, subset, {.value = value_coding::int8}));
    const float scale = largest / 127.0f;
    for (std::size_t j = 0; j < subset.size(); ++j) {
      REQUIRE(std::fabs(q.values[j] - x[subset[j]]) <= 0.5f * scale * (1.0f + 1e-5f));
      REQUIRE(std::fabs(q.values[j] / (scale > 0 ? scale : 1.0f)) <= 127.0f + 1e-3f);
    }
    const auto t = gc::decode(message_of(x, subset, {.value = value_coding::ternary}));
    const auto mean = static_cast<float>(magnitude / static_cast<double>(subset.size()));
    for (std::size_t j = 0; j < subset.size(); ++j) {
      REQUIRE(std::fabs(t.values[j]) == mean);
      REQUIRE(std::signbit(t.values[j]) == std::signbit(x[subset[j]]));
    }
  }
}

TEST_CASE("qsgd is unbiased in expectation (seeded statistical test)") {
  const std::size_t n = 64;
  const auto x = inputs::make(inputs::shape::student_t3, n, 6);
  std::vector<std::uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  const std::uint32_t levels = 4;
  gc::compressor c{gc::backend::host{}, n, gc::select::given_indices{.max_count = n}, gc::correct::none{},
                   gc::encode::index_value{.value = value_coding::qsgd, .levels = levels, .seed = 77}};
  c.set_indices(all);
  std::vector<std::byte> buf(c.max_message_bytes());
  const int trials = 20000;
  std::vector<double> mean(n, 0.0);
  double norm = 0.0;
  for (const float v : x) norm += static_cast<double>(v) * v;
  norm = std::sqrt(norm);
  for (int t = 0; t < trials; ++t) {
    const auto s = gc::decode(c.compress(x, buf).bytes());
    for (std::size_t j = 0; j < n; ++j) {
      const double level = std::fabs(s.values[j]) / norm * levels;
      REQUIRE(std::fabs(level - std::round(level)) < 1e-4);  // on the grid
      mean[j] += s.values[j] / trials;
    }
  }
  // Each draw deviates by at most norm / levels, so the mean's standard error is below
  // norm / levels / (2 sqrt(trials)); allow five of them.
  const double tolerance = 5.0 * norm / levels / (2.0 * std::sqrt(static_cast<double>(trials)));
  for (std::size_t j = 0; j < n; ++j) CHECK(std::fabs(mean[j] - x[j]) < tolerance);
}

TEST_CASE("quantisation error stays in the residual") {
  const std::size_t n = 3000;
  for (const auto value : value_codings) {
    gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.05}, gc::correct::error_feedback{},
                     gc::encode::index_value{.value = value}};
    std::vector<std::byte> buf(c.max_message_bytes());
    const auto g = inputs::make(inputs::shape::student_t3, n, 8);
    const auto s = gc::decode(c.compress(g, buf).bytes());
    CAPTURE(gc::to_string(value));
    for (std::size_t j = 0; j < s.indices.size(); ++j) {
      REQUIRE(c.corrector_state(0)[s.indices[j]] == g[s.indices[j]] - s.values[j]);
    }
  }
}

TEST_CASE("at density 0.001, f16 values and delta indices make a message 1000x smaller") {
  const std::size_t n = 25000000;
  const auto g = inputs::make(inputs::shape::student_t3, n, 9);
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.001}, gc::correct::error_feedback{},
                   gc::encode::index_value{.index = index_coding::automatic, .value = value_coding::f16}};
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(g, buf);
  MESSAGE("message of ", m.count(), " entries: ", m.bytes().size(), " bytes, ratio ", m.ratio());
  CHECK(m.ratio() >= 1000.0);
  CHECK(static_cast<int>(m.bytes()[6]) == static_cast<int>(index_coding::delta_bitpack));
}

TEST_CASE("encoder parameters are validated") {
  CHECK_THROWS_WITH_AS(gc::compressor(gc::backend::host{}, 10, gc::select::exact_topk{.count = 1}, gc::correct::none{},
                                      gc::encode::index_value{.value = value_coding::qsgd, .levels = 0}),
                       doctest::Contains("levels must be in [1, 65536], got 0"), gc::error);
  CHECK_THROWS_WITH_AS(gc::compressor(gc::backend::host{}, 10, gc::select::exact_topk{.count = 1}, gc::correct::none{},
                                      gc::encode::index_value{.index = static_cast<index_coding>(9)}),
                       doctest::Contains("index coding 9 is not supported"), gc::error);
}

// -- hardening, every coding -----------------------------------------------------------

namespace {
void require_rejected(const std::vector<std::byte>& bytes, std::size_t n) {
  CHECK_THROWS_AS(gc::decode(bytes), gc::error);
  std::vector<float> dense(n, 7.0f);
  CHECK_THROWS_AS(gc::accumulate(gc::backend::host{}, bytes, dense, 1.0f), gc::error);
  CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 7.0f; }));
}
template <class T>
std::vector<std::byte> with(std::vector<std::byte> b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
  return b;
}
}  // namespace

TEST_CASE("truncations and bit flips are caught for every coding") {
  const std::size_t n = 333;
  const auto x = inputs::make(inputs::shape::normal, n, 10);
  const auto subset = random_subset(n, 0.08, 11);
  for (const auto ic : {index_coding::raw32, index_coding::delta_bitpack, index_coding::bitmap}) {
    for (const auto vc : value_codings) {
      CAPTURE(gc::to_string(ic));
      CAPTURE(gc::to_string(vc));
      const auto good = message_of(x, subset, {.index = ic, .value = vc, .checksum = true});
      CHECK_NOTHROW(gc::decode(good));
      for (std::size_t len = 0; len < good.size(); ++len) {
        require_rejected(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)), n);
      }
      for (std::size_t bit = 0; bit < 8 * good.size(); bit += 3) {
        auto b = good;
        b[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
        require_rejected(b, n);
      }
    }
  }
}

TEST_CASE("hostile sections are rejected for every coding") {
  const std::size_t n = 333;
  const auto x = inputs::make(inputs::shape::normal, n, 12);
  const std::vector<std::uint32_t> subset{2, 40, 41, 300, 331};
  const std::size_t h = gc::message_header::size;

  const auto delta = message_of(x, subset, {.index = index_coding::delta_bitpack});
  require_rejected(with<std::uint8_t>(delta, h, 33), n);  // bit width beyond 32
  require_rejected(with<std::uint8_t>(delta, h, 32), n);  // block overruns the section
  const auto bitmap = message_of(x, subset, {.index = index_coding::bitmap});
  require_rejected(with<std::uint8_t>(bitmap, h + 41, 0x80), n);  // padding bit beyond n = 333
  require_rejected(with<std::uint8_t>(bitmap, h + 10, 0xFF), n);  // more bits than count
  require_rejected(with<std::uint8_t>(bitmap, h + 0, 0x00), n);   // fewer bits than count

  const std::size_t values_at = h + 20;  // raw32 indices of 5 entries
  const auto f16 = message_of(x, subset, {.index = index_coding::raw32, .value = value_coding::f16});
  require_rejected(with<std::uint16_t>(f16, values_at, 0x7C00), n);      // +inf
  require_rejected(with<std::uint16_t>(f16, values_at + 2, 0xFE01), n);  // NaN
  const auto bf16 = message_of(x, subset, {.index = index_coding::raw32, .value = value_coding::bf16});
  require_rejected(with<std::uint16_t>(bf16, values_at, 0x7F80), n);
  const auto int8 = message_of(x, subset, {.index = index_coding::raw32, .value = value_coding::int8});
  require_rejected(with<std::int8_t>(int8, values_at + 1, -128), n);
  require_rejected(with<float>(int8, 48, -1.0f), n);  // negative scale
  require_rejected(with<float>(int8, 48, INFINITY), n);
  require_rejected(with<std::uint32_t>(int8, 52, 3), n);  // a parameter int8 does not take
  const auto qsgd = message_of(x, subset, {.index = index_coding::raw32, .value = value_coding::qsgd, .levels = 5});
  require_rejected(with<std::uint32_t>(qsgd, 52, 0), n);           // zero levels
  require_rejected(with<std::uint32_t>(qsgd, 52, 1u << 20), n);    // too many levels
  require_rejected(with<std::uint8_t>(qsgd, values_at, 0xFE), n);  // level 7 > 5 in the first 4-bit field
  const auto f32 = message_of(x, subset, {.index = index_coding::raw32});
  require_rejected(with<float>(f32, 48, 1.0f), n);  // f32 takes no scale
  // int4: one block of 5 entries, its scale at values_at, the fields in the 3 bytes after.
  const auto int4 = message_of(x, subset, {.index = index_coding::raw32, .value = value_coding::int4});
  REQUIRE(int4.size() == values_at + 4 + 3);
  require_rejected(with<std::uint8_t>(int4, values_at + 4, 0x08), n);  // -8 in the first field
  require_rejected(with<float>(int4, values_at, -1.0f), n);            // negative scale
  require_rejected(with<float>(int4, values_at, INFINITY), n);         // infinite scale
  require_rejected(with<float>(int4, values_at, -0.0f), n);            // the encoder writes +0
  require_rejected(with<std::uint8_t>(int4, values_at + 6, 0x17), n);  // padding nibble after entry 5
  require_rejected(with<float>(int4, 48, 1.0f), n);                    // the header carries no scale
}

TEST_CASE("int4: blocks of 128, each its scale and its 4-bit fields, as the wire format says") {
  // 130 entries: a full block (scale 7 / 7 = 1: the fields are the values) and a block of 2.
  std::vector<float> x(130);
  for (std::size_t i = 0; i < 128; ++i) x[i] = static_cast<float>(static_cast<int>(i % 15) - 7);  // -7 .. 7
  x[5] = 2.4f;                                                                                    // rounds to 2
  x[6] = -2.5f;                                                                                   // ties to even: -2
  x[128] = 0.5f;
  x[129] = -14.0f;  // the second block's scale is 2: 0.5 / 2 rounds to 0, -14 / 2 = -7
  std::vector<std::uint32_t> all(x.size());
  std::iota(all.begin(), all.end(), 0u);
  const auto m = message_of(x, all, {.index = index_coding::raw32, .value = value_coding::int4});
  const std::size_t at = gc::message_header::size + 4 * x.size();
  REQUIRE(m.size() == at + (4 + 64) + (4 + 1));
  float scale = 0.0f;
  std::memcpy(&scale, m.data() + at, 4);
  CHECK(scale == 1.0f);
  const auto field = [&](std::size_t block_at, std::size_t e) {
    const unsigned byte = std::to_integer<unsigned>(m[block_at + 4 + e / 2]);
    const unsigned nibble = (e % 2 == 0 ? byte : byte >> 4) & 0xFu;
    return static_cast<int>(nibble) - (nibble >= 8 ? 16 : 0);
  };
  for (std::size_t i = 0; i < 128; ++i) {
    CAPTURE(i);
    CHECK(field(at, i) == (i == 5 ? 2 : i == 6 ? -2 : static_cast<int>(i % 15) - 7));
  }
  std::memcpy(&scale, m.data() + at + 68, 4);
  CHECK(scale == 2.0f);
  CHECK(field(at + 68, 0) == 0);
  CHECK(field(at + 68, 1) == -7);
  const auto s = gc::decode(m);
  CHECK(s.values[5] == 2.0f);
  CHECK(s.values[6] == -2.0f);
  CHECK(s.values[128] == 0.0f);
  CHECK(s.values[129] == -14.0f);
}

TEST_CASE("int4 stays within half its block's scale") {
  for (const auto shape : {inputs::shape::normal, inputs::shape::log_normal, inputs::shape::ties}) {
    const auto x = inputs::make(shape, 5000, 9);
    const auto subset = random_subset(x.size(), 0.2, 10);
    const auto q = gc::decode(message_of(x, subset, {.value = value_coding::int4}));
    CAPTURE(inputs::name(shape));
    for (std::size_t first = 0; first < subset.size(); first += 128) {
      float largest = 0.0f;
      for (std::size_t j = first; j < std::min(subset.size(), first + 128); ++j) {
        largest = std::max(largest, std::fabs(x[subset[j]]));
      }
      for (std::size_t j = first; j < std::min(subset.size(), first + 128); ++j) {
        REQUIRE(std::fabs(q.values[j] - x[subset[j]]) <= 0.5f * largest / 7.0f * (1.0f + 1e-5f));
      }
    }
  }
}

TEST_CASE("random corruption of every coding never escapes validation") {
  std::mt19937_64 rng(2718);
  const std::size_t n = 700;
  const auto x = inputs::make(inputs::shape::student_t3, n, 13);
  const auto subset = random_subset(n, 0.1, 14);
  for (const auto ic : {index_coding::raw32, index_coding::delta_bitpack, index_coding::bitmap}) {
    for (const auto vc : value_codings) {
      const auto good = message_of(x, subset, {.index = ic, .value = vc});
      for (int trial = 0; trial < 2000; ++trial) {
        auto b = good;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<std::byte>(rng());
        std::vector<float> dense(n, 0.0f);
        const auto before = dense;
        try {
          gc::accumulate(gc::backend::host{}, b, dense, 1.0f);
          for (const float v : dense) REQUIRE(std::isfinite(v));
        } catch (const gc::error&) {
          REQUIRE(dense == before);
        }
      }
    }
  }
}
