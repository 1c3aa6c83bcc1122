// Plain, obviously-correct references for the conformance tests. Nothing here includes
// or calls gradcomp: a bug shared by the library and its reference cannot hide.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace reference {

// The sum of `terms` in the order every gradcomp backend adds (docs/design.md): tiles of
// 2^15 terms; in a tile, lane l < 8 adds the terms at l, l + 8, l + 16, ...; the lanes
// combined as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)); the tiles added in order.
inline double ordered_sum(const std::vector<double>& terms) {
  const std::size_t tile = std::size_t{1} << 15;
  double total = 0.0;
  for (std::size_t begin = 0; begin < terms.size(); begin += tile) {
    double lane[8] = {};
    for (std::size_t i = begin; i < std::min(terms.size(), begin + tile); ++i) lane[(i - begin) % 8] += terms[i];
    total += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  return total;
}

// The sum of f(x) over x in v, in that order.
template <class F>
double ordered_sum_of(const std::vector<float>& v, F f) {
  std::vector<double> terms(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) terms[i] = f(static_cast<double>(v[i]));
  return ordered_sum(terms);
}

// The entries a density names of n, as docs/algorithms.md defines them: the smallest k
// in [1, n] with k / n (rounded to double) >= d, found by bisection.
inline std::size_t k_for(double density, std::size_t n) {
  std::size_t low = 1, high = n;  // the answer is in [low, high]
  while (low < high) {
    const std::size_t mid = low + (high - low) / 2;
    if (static_cast<double>(mid) / static_cast<double>(n) >= density) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return low;
}

// The k entries of `order` (indices into x) of largest |x|, ties to the lower index,
// returned ascending: order by (|x| descending, index ascending) and keep the first k.
inline std::vector<std::uint32_t> top_k_of(const std::vector<float>& x, std::vector<std::uint32_t> order,
                                           std::size_t k) {
  k = std::min(k, order.size());
  const auto before = [&](std::uint32_t a, std::uint32_t b) {
    const float fa = std::fabs(x[a]);
    const float fb = std::fabs(x[b]);
    return fa != fb ? fa > fb : a < b;
  };
  // A strict total order: the first k after nth_element are the first k of the sort.
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), before);
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

inline std::vector<std::uint32_t> top_k(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> all(x.size());
  std::iota(all.begin(), all.end(), 0u);
  return top_k_of(x, std::move(all), k);
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

// -- counter-based random numbers (docs/algorithms.md) ---------------------------------

// SplitMix64's finaliser.
inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline std::uint64_t random_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  return mix64(mix64(seed ^ mix64(stream)) + counter);
}
// Uniform in [0, 1) from the top 53 bits.
inline double random_unit(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  return static_cast<double>(random_bits(seed, stream, counter) >> 11) * 0x1.0p-53;
}
// Uniform in [0, bound): the top 32 bits times bound, high half.
inline std::uint32_t random_below(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter,
                                  std::uint32_t bound) {
  return static_cast<std::uint32_t>(((random_bits(seed, stream, counter) >> 32) * bound) >> 32);
}

// -- correctors (docs/algorithms.md "Correctors") -------------------------------------------

// Every corrector of docs/algorithms.md, optionally behind clip_norm: update(g) gives acc and
// leaves each entry's state as if it were not sent; commit(index, sent) applies the sent
// entries. `state` holds the arrays in the order compressor::corrector_state numbers them.
struct corrector {
  enum class kind { none, error_feedback, momentum, low_pass };
  kind type = kind::none;
  float beta = 1.0f;
  float gamma = 1.0f;
  bool nesterov = false;
  bool masking = true;
  float max_norm = std::numeric_limits<float>::infinity();  // clip_norm in front when finite
  int workers = 1;
  unsigned memory_bits = 32;  // correct::compact around it: 8 or 4
  unsigned memory_block = 64;

  std::vector<std::vector<float>> state{};
  std::vector<float> acc{};

  std::size_t arrays() const {
    switch (type) {
      case kind::none:
        return 0;
      case kind::error_feedback:
        return 1;
      case kind::momentum:
        return 2;
      case kind::low_pass:
        return 1;
    }
    return 0;
  }

  // g * min(1, (max_norm / sqrt(workers)) / ||g||), ||g|| summed in double.
  std::vector<float> clipped(std::vector<float> g) const {
    if (!std::isfinite(max_norm)) return g;
    const double norm = std::sqrt(ordered_sum_of(g, [](double x) { return x * x; }));
    const double limit = static_cast<double>(max_norm) / std::sqrt(static_cast<double>(workers));
    const float scale = norm > limit ? static_cast<float>(limit / norm) : 1.0f;
    for (float& x : g) x *= scale;
    return g;
  }

  const std::vector<float>& update(const std::vector<float>& raw) {
    const std::vector<float> g = clipped(raw);
    if (state.empty()) state.assign(arrays(), std::vector<float>(g.size(), 0.0f));
    acc.resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      switch (type) {
        case kind::none:
          acc[i] = g[i];
          break;
        case kind::error_feedback: {
          float& e = state[0][i];
          e = beta * e + gamma * g[i];
          acc[i] = e;
          break;
        }
        case kind::momentum: {
          float& u = state[0][i];
          float& v = state[1][i];
          if (nesterov) {
            u = beta * (u + g[i]);
            v = v + u + g[i];
          } else {
            u = beta * u + g[i];
            v = v + u;
          }
          acc[i] = v;
          break;
        }
        case kind::low_pass:
          acc[i] = state[0][i] + g[i];
          break;
      }
    }
    return acc;
  }

  void commit(const std::vector<std::uint32_t>& index, const std::vector<float>& sent) {
    switch (type) {
      case kind::none:
        break;
      case kind::error_feedback:
        for (std::size_t j = 0; j < index.size(); ++j) state[0][index[j]] -= sent[j];
        break;
      case kind::momentum:
        for (std::size_t j = 0; j < index.size(); ++j) {
          state[1][index[j]] -= sent[j];
          if (masking) state[0][index[j]] = 0.0f;
        }
        break;
      case kind::low_pass: {  // m <- (1 - beta) m + beta (acc - sent), sent = 0 where not sent
        std::vector<float> sent_at(acc.size(), 0.0f);
        for (std::size_t j = 0; j < index.size(); ++j) sent_at[index[j]] = sent[j];
        for (std::size_t i = 0; i < acc.size(); ++i) {
          state[0][i] = (1.0f - beta) * state[0][i] + beta * (acc[i] - sent_at[i]);
        }
        break;
      }
    }
    if (memory_bits != 32) {
      for (auto& x : state) x = stored_in_blocks(x, memory_bits, memory_block);
    }
  }

  // docs/algorithms.md, "Compressed memory": the values a compact state keeps of x.
  static std::vector<float> stored_in_blocks(const std::vector<float>& x, unsigned bits, unsigned block) {
    const double largest = std::ldexp(1.0, static_cast<int>(bits) - 1) - 1.0;
    std::vector<float> out(x.size());
    for (std::size_t begin = 0; begin < x.size(); begin += block) {
      const std::size_t end = std::min(x.size(), begin + block);
      double m = 0.0;
      for (std::size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
      int e = -127;
      while (e < 127 && largest * std::ldexp(1.0, e) < m) ++e;
      const float unit = std::ldexp(1.0f, e);
      float carry = 0.0f;
      for (std::size_t i = begin; i < end; ++i) {
        const float y = x[i] + carry;
        float q = std::clamp(std::nearbyint(y / unit), static_cast<float>(-largest), static_cast<float>(largest));
        q = q == 0.0f ? 0.0f : q;  // an integer code: no negative zero
        carry = y - q * unit;
        out[i] = q * unit;
      }
    }
    return out;
  }
};

// -- selectors (docs/algorithms.md "Selectors") ---------------------------------------------

struct selection {
  std::vector<std::uint32_t> index;  // ascending
  float value_scale = 1.0f;          // factor on the values sent (random_k unbiased)
};

inline std::vector<std::uint32_t> at_least(const std::vector<float>& x, float t) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) >= t) out.push_back(static_cast<std::uint32_t>(i));
  }
  return out;
}

// k distinct indices by Floyd's algorithm: for j = n-k .. n-1, t uniform in [0, j] from
// (seed, step, j); take t, or j if t is taken already.
inline std::vector<std::uint32_t> random_k(std::size_t n, std::size_t k, std::uint64_t seed, std::uint64_t step) {
  std::vector<bool> taken(n, false);
  for (std::size_t j = n - k; j < n; ++j) {
    std::uint32_t t = random_below(seed, step, j, static_cast<std::uint32_t>(j + 1));
    if (taken[t]) t = static_cast<std::uint32_t>(j);
    taken[t] = true;
  }
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < n; ++i) {
    if (taken[i]) out.push_back(static_cast<std::uint32_t>(i));
  }
  return out;
}

// AdaComp: H = acc + g; i goes when |H_i| >= max |acc| over its bin.
inline std::vector<std::uint32_t> chunk_local(const std::vector<float>& acc, const std::vector<float>& g,
                                              std::size_t bin) {
  std::vector<std::uint32_t> out;
  const std::size_t n = acc.size();
  bin = std::min(bin, n);
  for (std::size_t begin = 0; begin < n; begin += bin) {
    const std::size_t end = std::min(n, begin + bin);
    float largest = 0.0f;
    for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(acc[i]));
    for (std::size_t i = begin; i < end; ++i) {
      if (std::fabs(acc[i] + g[i]) >= largest) out.push_back(static_cast<std::uint32_t>(i));
    }
  }
  return out;
}

// DGC's hierarchical selection, steps 1-4 of docs/algorithms.md, with .truncate and
// .reuse_threshold; `last_t` is the final threshold of the previous step.
struct sampled_threshold {
  double density = 0.0;
  double sample_ratio = 0.01;
  float lower = 0.8f;
  float upper = 1.3f;
  int max_iters = 10;
  std::uint64_t seed = 0;
  bool truncate = false;
  bool reuse_threshold = false;

  bool has_last = false;
  float last_t = 0.0f;

  std::vector<std::uint32_t> select(const std::vector<float>& acc, std::uint64_t step) {
    const std::size_t n = acc.size();
    const std::size_t k = k_for(density, n);
    const auto by_ratio = static_cast<std::size_t>(std::ceil(static_cast<double>(n) * sample_ratio));
    const auto by_density = static_cast<std::size_t>(std::min(static_cast<double>(n), std::ceil(2.0 / density)));
    const std::size_t m = std::max(by_ratio, by_density);
    const double low = static_cast<double>(lower) * static_cast<double>(k);
    const double high = static_cast<double>(upper) * static_cast<double>(k);
    std::vector<std::uint32_t> c;
    float t = 0.0f;
    if (m >= n) {  // step 1's fallback: exact top-k, whose k-th magnitude is the threshold
      c = top_k(acc, k);
      t = std::fabs(acc[c[0]]);
      for (const auto i : c) t = std::min(t, std::fabs(acc[i]));
    } else {
      bool reused = false;
      if (reuse_threshold && has_last) {
        t = last_t;
        c = at_least(acc, t);
        reused = static_cast<double>(c.size()) >= low && static_cast<double>(c.size()) <= high;
      }
      if (!reused) {
        const std::size_t stride = n / m;
        const std::size_t offset = random_below(seed, step, 0, static_cast<std::uint32_t>(stride));
        std::vector<float> sample;
        for (std::size_t j = 0; j < m; ++j) sample.push_back(std::fabs(acc[offset + j * stride]));
        std::sort(sample.begin(), sample.end(), [](float a, float b) { return a > b; });
        const std::size_t r = k_for(density, m);
        t = sample[r - 1];
        c = at_least(acc, t);
        for (int it = 0; it < max_iters; ++it) {
          const auto size = static_cast<double>(c.size());
          if (size > high || size >= low) break;
          t = t * lower;
          c = at_least(acc, t);
        }
      }
      if (static_cast<double>(c.size()) > high || (truncate && c.size() > k)) {
        c = top_k_of(acc, c, k);
        t = std::fabs(acc[c[0]]);
        for (const auto i : c) t = std::min(t, std::fabs(acc[i]));
      }
    }
    has_last = true;
    last_t = t;
    return c;
  }
};

// -- value codings (docs/algorithms.md "Encoders") ------------------------------------------

// v rounded to nearest even in a binary format of `digits` significant bits whose
// smallest normal exponent is `min_exponent`, saturating at +-largest.
inline float round_to_format(float v, int digits, int min_exponent, double largest) {
  if (v == 0.0f) return v;
  int e = 0;
  std::frexp(static_cast<double>(v), &e);  // |v| in [2^(e-1), 2^e)
  const int quantum = std::max(e - 1, min_exponent) - (digits - 1);
  const double r = std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(v), -quantum)), quantum);
  if (std::fabs(r) > largest) return static_cast<float>(std::copysign(largest, r));
  return static_cast<float>(r);
}

// The 16 bits of a value representable in binary16 (round_to_format(v, 11, -14, 65504)).
inline std::uint16_t binary16_bits(float v) {
  const std::uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
  const double a = std::fabs(static_cast<double>(v));
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  if (e - 1 < -14) return static_cast<std::uint16_t>(sign | static_cast<unsigned>(std::ldexp(a, 24)));  // m 2^-24
  const auto fraction = static_cast<unsigned>(std::ldexp(a, -(e - 1)) * 1024.0 - 1024.0);
  return static_cast<std::uint16_t>(sign | static_cast<unsigned>((e - 1 + 15) << 10) | fraction);
}

// The 16 bits of a value representable in bfloat16: the top half of its binary32.
inline std::uint16_t bfloat16_bits(float v) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<std::uint16_t>(bits >> 16);
}

enum class values { f32, f16, bf16, int8, ternary, qsgd, int4 };

// CRC-32C (reflected polynomial 0x82F63B78, start and final xor ~0) of a message with its
// checksum field (bytes 12 to 15) read as zero, bit by bit.
inline std::uint32_t message_crc32c(const std::vector<std::byte>& message) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < message.size(); ++i) {
    c ^= (i >= 12 && i < 16) ? 0u : std::to_integer<std::uint32_t>(message[i]);
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

// What the receiver decodes for values v of one message; `levels` and `seed` are qsgd's.
inline std::vector<float> sent_values(values coding, const std::vector<float>& v, std::uint32_t levels,
                                      std::uint64_t seed, std::uint64_t step) {
  std::vector<float> out(v.size());
  switch (coding) {
    case values::f32:
      return v;
    case values::f16:
      for (std::size_t j = 0; j < v.size(); ++j) out[j] = round_to_format(v[j], 11, -14, 65504.0);
      return out;
    case values::bf16:
      for (std::size_t j = 0; j < v.size(); ++j) out[j] = round_to_format(v[j], 8, -126, 0x1.FEp127);
      return out;
    case values::int8: {  // scale = max|v| / 127, lowered until 127 * scale is finite
      float largest = 0.0f;
      for (const float x : v) largest = std::max(largest, std::fabs(x));
      float scale = largest / 127.0f;
      while (!std::isfinite(127.0f * scale)) scale = std::nextafter(scale, 0.0f);
      for (std::size_t j = 0; j < v.size(); ++j) {
        // q is an integer in [-127, 127] on the wire: there is no -0
        const int q = scale > 0.0f ? static_cast<int>(std::clamp(std::nearbyint(v[j] / scale), -127.0f, 127.0f)) : 0;
        out[j] = static_cast<float>(q) * scale;
      }
      return out;
    }
    case values::int4: {  // blocks of 128: scale = the block's max|v| / 7 (as int8's), q in [-7, 7]
      for (std::size_t first = 0; first < v.size(); first += 128) {
        const std::size_t last = std::min(v.size(), first + 128);
        float largest = 0.0f;
        for (std::size_t j = first; j < last; ++j) largest = std::max(largest, std::fabs(v[j]));
        float scale = largest / 7.0f;
        while (!std::isfinite(7.0f * scale)) scale = std::nextafter(scale, 0.0f);
        for (std::size_t j = first; j < last; ++j) {
          const int q = scale > 0.0f ? static_cast<int>(std::clamp(std::nearbyint(v[j] / scale), -7.0f, 7.0f)) : 0;
          out[j] = static_cast<float>(q) * scale;
        }
      }
      return out;
    }
    case values::ternary: {  // sign times the mean magnitude
      const double sum = ordered_sum_of(v, [](double x) { return std::fabs(x); });
      const float scale = v.empty() ? 0.0f : static_cast<float>(sum / static_cast<double>(v.size()));
      for (std::size_t j = 0; j < v.size(); ++j) out[j] = std::signbit(v[j]) ? -scale : scale;
      return out;
    }
    case values::qsgd: {  // |v| / ||v|| rounded stochastically to levels, times ||v||
      const double squares = ordered_sum_of(v, [](double x) { return x * x; });
      const auto norm =
          static_cast<float>(std::min(std::sqrt(squares), static_cast<double>(std::numeric_limits<float>::max())));
      for (std::size_t j = 0; j < v.size(); ++j) {
        std::uint32_t level = 0;
        if (norm > 0.0f) {
          const double r = std::fabs(static_cast<double>(v[j])) / norm * levels;
          const double below = std::floor(r);
          level = static_cast<std::uint32_t>(below) + (random_unit(seed, step, j) < r - below ? 1u : 0u);
          level = std::min(level, levels);
        }
        const float magnitude = norm * (static_cast<float>(level) / static_cast<float>(levels));
        out[j] = std::signbit(v[j]) ? -magnitude : magnitude;
      }
      return out;
    }
  }
  return out;
}

// -- index codings (docs/wire-format.md) -----------------------------------------------

enum class indices { raw32, delta_bitpack, bitmap };

inline std::size_t index_section_bytes(indices coding, std::size_t n, const std::vector<std::uint32_t>& index) {
  switch (coding) {
    case indices::raw32:
      return 4 * index.size();
    case indices::bitmap:
      return (n + 7) / 8;
    case indices::delta_bitpack: {  // blocks of 128 gaps: a width byte, then the gaps at that width
      std::size_t bytes = 0;
      std::uint64_t next = 0;  // previous index + 1
      for (std::size_t start = 0; start < index.size(); start += 128) {
        const std::size_t len = std::min<std::size_t>(128, index.size() - start);
        std::uint64_t widest = 0;
        for (std::size_t j = start; j < start + len; ++j) {
          widest = std::max<std::uint64_t>(widest, index[j] - next);
          next = std::uint64_t{index[j]} + 1;
        }
        unsigned width = 0;
        while ((widest >> width) != 0) ++width;
        bytes += 1 + (len * width + 7) / 8;
      }
      return bytes;
    }
  }
  return 0;
}

// The coding `auto` picks: bitmap when smaller than raw32 and no larger than
// delta_bitpack, else delta_bitpack when no larger than raw32, else raw32.
inline indices smallest_index_coding(std::size_t n, const std::vector<std::uint32_t>& index) {
  const auto raw = index_section_bytes(indices::raw32, n, index);
  const auto bitmap = index_section_bytes(indices::bitmap, n, index);
  const auto delta = index_section_bytes(indices::delta_bitpack, n, index);
  if (bitmap < raw && bitmap <= delta) return indices::bitmap;
  return delta <= raw ? indices::delta_bitpack : indices::raw32;
}

inline std::size_t value_section_bytes(values coding, std::size_t count, std::uint32_t levels) {
  switch (coding) {
    case values::f32:
      return 4 * count;
    case values::f16:
    case values::bf16:
      return 2 * count;
    case values::int8:
      return count;
    case values::ternary:
      return (count + 7) / 8;
    case values::int4: {  // per block of 128 entries: a 4-byte scale and 4 bits an entry
      const std::size_t rest = count % 128;
      return count / 128 * (4 + 64) + (rest != 0 ? 4 + (rest + 1) / 2 : 0);
    }
    case values::qsgd: {  // a sign bit and a level in [0, levels]
      unsigned level_bits = 0;
      while ((levels >> level_bits) != 0) ++level_bits;
      return (count * (1 + level_bits) + 7) / 8;
    }
  }
  return 0;
}

}  // namespace reference
