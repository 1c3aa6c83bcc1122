// What an extreme gradient, a bad parameter, a doctored checkpoint or a non-canonical
// message must not do: brick a compressor, overflow, wrap around or slip past the
// decoder. Each case reproduces one found by an attack on an installed gradcomp.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "support/engine_stages.hpp"
#include "support/inputs.hpp"

namespace gc = gradcomp;
using gc::index_coding;
using gc::value_coding;

namespace {

constexpr float big = std::numeric_limits<float>::max();
constexpr float tiny = std::numeric_limits<float>::denorm_min();

const value_coding all_values[] = {value_coding::f32,     value_coding::f16,  value_coding::bf16, value_coding::int8,
                                   value_coding::ternary, value_coding::qsgd, value_coding::int4};
const index_coding all_indices[] = {index_coding::automatic, index_coding::raw32, index_coding::delta_bitpack,
                                    index_coding::bitmap};

// Gradients at the edges of float: the largest finite values, denormals, and both.
std::vector<std::vector<float>> extreme_gradients(std::size_t n) {
  std::vector<std::vector<float>> out;
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = (i % 2 ? -big : big) * (i % 3 == 0 ? 1.0f : 0.71f);
  out.push_back(g);
  for (std::size_t i = 0; i < n; ++i) g[i] = (i % 2 ? -tiny : tiny) * static_cast<float>(1 + i % 5);
  out.push_back(g);
  for (std::size_t i = 0; i < n; ++i) g[i] = i % 7 == 0 ? (i % 2 ? -big : big) : (i % 2 ? -tiny : tiny);
  out.push_back(g);
  g.assign(n, 0.0f);
  g[n / 2] = -big;
  g[n / 3] = big;
  g[n - 1] = 2.42e38f;
  out.push_back(g);
  return out;
}

bool all_finite(std::span<const float> x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

// Compresses `g`, decodes the message, and checks that the receiver accepts it, that
// the memory stays finite, and that the compressor goes on (a zero gradient next).
template <class Compressor>
void round_trip(Compressor& c, const std::vector<float>& g) {
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(g, buf);
  const gc::sparse_vector s = gc::decode(m.bytes());  // throws if the decoder refuses it
  CHECK(all_finite(s.values));
  std::vector<float> dense(g.size(), 0.0f);
  gc::accumulate(gc::backend::host{}, m.bytes(), dense, 1.0f);
  for (std::size_t a = 0; a != Compressor::corrector_type::state_arrays; ++a) CHECK(all_finite(c.corrector_state(a)));
  const std::vector<float> zero(g.size(), 0.0f);
  for (int t = 0; t < 3; ++t) {
    const auto next = c.compress(zero, buf);
    CHECK_NOTHROW((void)gc::decode(next.bytes()));
  }
}

}  // namespace

TEST_CASE("the encoder never writes what its decoder refuses, and extreme gradients never brick a compressor") {
  const std::size_t n = 1000;
  for (const auto& g : extreme_gradients(n)) {
    for (const auto vc : all_values) {
      for (const auto ic : all_indices) {
        CAPTURE(gc::to_string(vc));
        CAPTURE(gc::to_string(ic));
        const gc::encode::index_value e{.index = ic, .value = vc, .levels = 5};
        gc::compressor topk{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.05},
                            gc::correct::error_feedback{}, e};
        round_trip(topk, g);
        gc::compressor everything{gc::backend::host{}, n, gc::select::threshold{.tau = 0.0f},
                                  gc::correct::error_feedback{}, e};
        round_trip(everything, g);
        gc::compressor rescaled{gc::backend::host{}, n, gc::select::random_k{.density = 0.01, .unbiased = true},
                                gc::correct::error_feedback{}, e};
        round_trip(rescaled, g);
      }
    }
  }
}

TEST_CASE("the reported overflows: qsgd's norm, int8's scale, random_k's n/k") {
  {  // two values of +-2.42e38: their norm exceeds the largest float
    gc::compressor c{gc::backend::host{}, 2, gc::select::exact_topk{.count = 2}, gc::correct::error_feedback{},
                     gc::encode::index_value{.value = value_coding::qsgd}};
    round_trip(c, {2.42e38f, -2.42e38f});
  }
  {  // max|v| = FLT_MAX: 127 * (FLT_MAX / 127) rounds to infinity
    gc::compressor c{gc::backend::host{}, 3, gc::select::exact_topk{.count = 3}, gc::correct::error_feedback{},
                     gc::encode::index_value{.value = value_coding::int8}};
    round_trip(c, {big, -1.0f, 3.0f});
  }
  {  // n = 1000, density 0.001: 1000 * 1e37 overflows
    gc::compressor c{gc::backend::host{}, 1000, gc::select::random_k{.density = 0.001, .unbiased = true},
                     gc::correct::error_feedback{}};
    round_trip(c, std::vector<float>(1000, 1e37f));
  }
}

TEST_CASE("presets and policies validate every parameter by name") {
  for (const double d : {std::nan(""), 0.0, -0.1, 1.5, static_cast<double>(INFINITY)}) {
    CAPTURE(d);
    CHECK_THROWS_WITH_AS((void)gc::presets::scalecom(gc::backend::host{}, 100, {.density = d}),
                         doctest::Contains("scalecom: density must be in (0, 1], got"), gc::error);
  }
  // A bin longer than the tensor is one bin: no wrap-around, and a NaN is still found.
  const std::size_t n = 1000;
  gc::compressor huge_bin{gc::backend::host{}, n, gc::select::chunk_local{.bin = ~std::size_t{0} - 5},
                          gc::correct::error_feedback{}};
  gc::compressor one_bin{gc::backend::host{}, n, gc::select::chunk_local{.bin = n}, gc::correct::error_feedback{}};
  std::vector<std::byte> a(huge_bin.max_message_bytes()), b(one_bin.max_message_bytes());
  for (std::uint64_t t = 0; t < 3; ++t) {
    const auto g = inputs::make(inputs::shape::student_t3, n, t);
    const auto x = huge_bin.compress(g, a);
    const auto y = one_bin.compress(g, b);
    CHECK(std::vector<std::byte>(x.bytes().begin(), x.bytes().end()) ==
          std::vector<std::byte>(y.bytes().begin(), y.bytes().end()));
  }
  auto g = inputs::make(inputs::shape::student_t3, n, 9);
  g[500] = NAN;
  CHECK_THROWS_WITH_AS((void)huge_bin.compress(g, a), doctest::Contains("grad[500] = nan is not finite"), gc::error);
}

TEST_CASE("ratio_plan meets its budget for volumes spanning any range of doubles") {
  const double mean = 0.01;
  const double floor = 0.001;
  // The reported cases: before, the densities summed to 1.001, 2 and 1.001 against 0.02.
  const std::vector<std::vector<double>> reported{{1, 1e70}, {1e-310, 1}, {1e300, 1e-300}};
  for (const auto& w : reported) {
    const auto d = gc::schedule::ratio_plan(w, mean, floor);
    // Closed form with two workers: the smaller volume is held at the floor, the other
    // takes the rest of the budget (it is far below lambda * w = 1).
    const std::size_t small = w[0] < w[1] ? 0 : 1;
    CHECK(d[small] == floor);
    CHECK(d[1 - small] == doctest::Approx(2 * mean - floor).epsilon(1e-12));
    CHECK(d[0] + d[1] <= 2 * mean);
  }
  // Volumes log-uniform over 1e-300 .. 1e300: within budget, bounds, and d_i = lambda w_i
  // for every worker strictly between the bounds (one lambda for all).
  std::uint64_t state = 7;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> w(2 + trial % 9);
    for (auto& v : w) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = std::pow(10.0, -300.0 + 600.0 * static_cast<double>(state >> 11) * 0x1.0p-53);
    }
    const double m = trial % 3 == 0 ? 0.5 : mean;
    const auto d = gc::schedule::ratio_plan(w, m, floor);
    double sum = 0.0, lambda = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      sum += d[i];
      CHECK(d[i] >= floor);
      CHECK(d[i] <= 1.0);
      if (d[i] > floor && d[i] < 1.0) {
        const double l = std::log(d[i]) - std::log(w[i]);
        if (lambda == 0.0) lambda = l;
        CHECK(l == doctest::Approx(lambda).epsilon(1e-9));
      }
    }
    CHECK(sum <= m * static_cast<double>(w.size()));
    CHECK(sum == doctest::Approx(m * static_cast<double>(w.size())).epsilon(1e-9));
  }
}

namespace {

// A checkpoint record (detail/step/state_io.hpp) opened up: where its density and arrays sit,
// and how to seal it again with a recomputed CRC, as an attacker would.
struct record {
  std::string bytes;
  explicit record(const auto& c) {
    std::ostringstream out;
    c.save_state(out);
    bytes = out.str();
  }
  std::size_t signature_end() const {
    std::uint32_t length = 0;
    std::memcpy(&length, bytes.data() + 8, 4);
    return 12 + length;
  }
  std::size_t density_at() const { return signature_end() + 16; }
  // Byte offset of element i of array a (each array: u64 length, then floats).
  std::size_t element_at(std::size_t a, std::size_t i) const {
    std::size_t at = density_at() + 8 + 4;
    for (std::size_t k = 0; k < a; ++k) {
      std::uint64_t len = 0;
      std::memcpy(&len, bytes.data() + at, 8);
      at += 8 + 4 * len;
    }
    return at + 8 + 4 * i;
  }
  template <class T>
  void put(std::size_t at, T v) {
    std::memcpy(bytes.data() + at, &v, sizeof v);
    const std::uint32_t crc = gc::detail::crc32c(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size() - 4);
    std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  }
};

template <class Compressor>
std::string state_of(const Compressor& c) {
  return record(c).bytes;
}

// `doctored` must be refused by `c`, naming `what`, and change nothing.
template <class Compressor>
void refused(Compressor& c, const std::string& doctored, const char* what) {
  const std::string before = state_of(c);
  std::istringstream in(doctored);
  CHECK_THROWS_WITH_AS(c.load_state(in), doctest::Contains(what), gc::error);
  CHECK(state_of(c) == before);
}

template <class Compressor>
void non_finite_memory_is_refused(Compressor c) {
  CAPTURE(c.corrector().name());
  const std::size_t n = c.size();
  std::vector<std::byte> buf(c.max_message_bytes());
  for (std::uint64_t t = 0; t < 3; ++t) (void)c.compress(inputs::make(inputs::shape::normal, n, t), buf);
  for (std::size_t a = 0; a != Compressor::corrector_type::state_arrays; ++a) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
      record r(c);
      r.put(r.element_at(a, n - 1), bad);
      refused(c, r.bytes, "load_state: the corrector's array");
    }
  }
  // The memory is intact: the next step is accepted.
  CHECK_NOTHROW((void)c.compress(inputs::make(inputs::shape::normal, n, 9), buf));
}

}  // namespace

TEST_CASE("load_state refuses memory that compress could never have left") {
  const std::size_t n = 777;
  const gc::select::exact_topk s{.density = 0.01};
  non_finite_memory_is_refused(gc::compressor{gc::backend::host{}, n, s, gc::correct::error_feedback{}});
  non_finite_memory_is_refused(gc::compressor{gc::backend::host{}, n, s, gc::correct::error_feedback{.beta = 0.5f}});
  non_finite_memory_is_refused(gc::compressor{gc::backend::host{}, n, s, gc::correct::momentum{}});
  non_finite_memory_is_refused(gc::compressor{gc::backend::host{}, n, s, gc::correct::momentum{.nesterov = true}});
  non_finite_memory_is_refused(gc::compressor{gc::backend::host{}, n, s, gc::correct::low_pass{.beta = 0.3f}});
  non_finite_memory_is_refused(
      gc::compressor{gc::backend::host{}, n, s,
                     gc::correct::chain{gc::correct::clip_norm{.max_norm = 1.0f}, gc::correct::momentum{}}});
  non_finite_memory_is_refused(gc::presets::dgc(gc::backend::host{}, n, {.density = 0.01, .max_norm = 1.0f}));
  non_finite_memory_is_refused(gc::presets::topk_ef(gc::backend::host{}, n));
  non_finite_memory_is_refused(gc::presets::randomk_ef(gc::backend::host{}, n));
  non_finite_memory_is_refused(gc::presets::adacomp(gc::backend::host{}, n));
  non_finite_memory_is_refused(gc::presets::scalecom(gc::backend::host{}, n, {.density = 0.01, .beta = 0.5f}));
}

TEST_CASE("load_state refuses densities outside (0, 1]") {
  auto c = gc::presets::dgc(gc::backend::host{}, 5000, {.density = 0.01});
  for (const double d : {-0.5, std::nan(""), -static_cast<double>(INFINITY), 2.0, static_cast<double>(INFINITY)}) {
    CAPTURE(d);
    record r(c);
    r.put(r.density_at(), d);
    refused(c, r.bytes, "load_state: the saved density");
  }
  // A selector without a density accepts only 0 there.
  auto local = gc::presets::adacomp(gc::backend::host{}, 5000);
  record r(local);
  r.put(r.density_at(), 0.5);
  refused(local, r.bytes, "belongs to no parameter of chunk_local");
}

TEST_CASE("dgc with clipping: a NaN in the saved velocity is refused, and the in-place step stays safe") {
  const std::size_t n = 4099;
  auto c = gc::presets::dgc(gc::backend::host{}, n, {.density = 0.01, .max_norm = 1.0f});
  std::vector<std::byte> buf(c.max_message_bytes());
  // Large gradients: every step clips, so the next takes the norm first and may run in place.
  for (std::uint64_t t = 0; t < 4; ++t) {
    auto g = inputs::make(inputs::shape::normal, n, t);
    for (auto& v : g) v *= 100.0f;
    (void)c.compress(g, buf);
  }
  record r(c);
  r.put(r.element_at(1, n - 1), std::numeric_limits<float>::quiet_NaN());  // the last v entry
  refused(c, r.bytes, "load_state: the corrector's array 1 holds nan at index 4098");
  auto g = inputs::make(inputs::shape::normal, n, 7);
  for (auto& v : g) v *= 100.0f;
  g[n - 1] = NAN;
  const std::string before = state_of(c);
  CHECK_THROWS_AS((void)c.compress(g, buf), gc::error);
  CHECK(state_of(c) == before);
}

namespace {

std::vector<std::byte> bytes_of(const gc::message& m) { return {m.bytes().begin(), m.bytes().end()}; }

void reseal(std::vector<std::byte>& m) {
  std::uint32_t flags = 0;
  std::memcpy(&flags, m.data() + 8, 4);
  if (flags & 1u) {
    const std::uint32_t crc = gc::detail::message_checksum(m);
    std::memcpy(m.data() + 12, &crc, 4);
  }
}

bool refused_message(const std::vector<std::byte>& m, const char* what) {
  try {
    (void)gc::decode(m);
  } catch (const gc::error& e) {
    return std::string(e.what()).find(what) != std::string::npos;
  }
  return false;
}

}  // namespace

TEST_CASE("bit-packed sections must have zero padding bits") {
  const std::size_t n = 1000;
  const auto g = inputs::make(inputs::shape::student_t3, n, 3);
  for (const auto vc : {value_coding::ternary, value_coding::qsgd, value_coding::f32}) {
    CAPTURE(gc::to_string(vc));
    // A count whose one delta block leaves padding bits in its last byte (and 1-bit or
    // qsgd fields leave some in the value section's).
    for (std::size_t count = 9; count < 17; ++count) {
      CAPTURE(count);
      gc::compressor c{
          gc::backend::host{}, n, gc::select::exact_topk{.count = count}, gc::correct::none{},
          gc::encode::index_value{.index = index_coding::delta_bitpack, .value = vc, .levels = 3, .checksum = true}};
      std::vector<std::byte> buf(c.max_message_bytes());
      const auto good = bytes_of(c.compress(g, buf));
      REQUIRE_NOTHROW((void)gc::decode(good));
      const auto width = static_cast<unsigned>(good[56]);
      if (count * width % 8 == 0) continue;
      std::uint64_t index_bytes = 0, value_bytes = 0;
      std::memcpy(&index_bytes, good.data() + 32, 8);
      std::memcpy(&value_bytes, good.data() + 40, 8);
      auto m = good;
      m[56 + index_bytes - 1] |= std::byte{0x80};  // the top bit of the block's last byte
      reseal(m);
      CHECK(refused_message(m, "message delta_bitpack block 0 has nonzero padding bits"));
      const unsigned field = vc == value_coding::ternary ? 1 : vc == value_coding::qsgd ? 3 : 32;
      if (count * field % 8 != 0) {
        m = good;
        m[56 + index_bytes + value_bytes - 1] |= std::byte{0x80};
        reseal(m);
        CHECK(refused_message(m, "value section has nonzero padding bits after its"));
      }
      break;
    }
  }
}

TEST_CASE("count + 1 with a recomputed checksum: refused, or the canonical message of what it decodes to") {
  // Dense selections, so that delta widths are small and padding has room for a gap.
  // A tampered count either breaks the section sizes or reads one more entry out of
  // zero padding; in that case the message is exactly what the encoder writes for
  // those entries (zero padding makes the form canonical), so nothing non-canonical
  // is accepted. Telling it from a genuine message takes a key, not a checksum.
  int refused = 0, canonical = 0;
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    const std::size_t n = 500 + 37 * seed;
    const gc::encode::index_value e{
        .index = index_coding::delta_bitpack, .value = value_coding::ternary, .checksum = true};
    gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = 3 + seed % 40 + n / (2 + seed % 5)},
                     gc::correct::none{}, e};
    std::vector<std::byte> buf(c.max_message_bytes());
    auto m = bytes_of(c.compress(inputs::make(inputs::shape::student_t3, n, seed), buf));
    std::uint64_t count = 0;
    std::memcpy(&count, m.data() + 24, 8);
    ++count;
    std::memcpy(m.data() + 24, &count, 8);
    reseal(m);
    gc::sparse_vector s;
    try {
      s = gc::decode(m);
    } catch (const gc::error&) {
      ++refused;
      continue;
    }
    std::vector<std::byte> again(e.max_bytes(n, s.indices.size()));
    std::vector<float> sent(s.indices.size());
    const std::size_t bytes = support::encode_message(e, n, s.indices, s.values, again, sent, 0);
    again.resize(bytes);
    CHECK(again == m);
    ++canonical;
  }
  CHECK(refused + canonical == 100);
  MESSAGE(refused, " refused, ", canonical, " canonical");
}
