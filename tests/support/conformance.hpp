// The conformance grid: every selector x corrector x value coding (and every index
// coding), step by step, against a reference written in support/reference.hpp (which
// includes nothing of gradcomp), over awkward inputs: the decoded message, its size and
// index coding, and the corrector's memory after every step, bit for bit.
//
// A test file instantiates it for a Target, which names the backends and moves data
// between the test's host vectors and the backend's memory:
//   backends(), name_of(backend), copy_of(std::vector<T>) -> memory, span(memory),
//   host_copy(std::span<const std::byte>) -> std::vector<std::byte>.
// A new selector adds its case below (the library policy and its reference model made
// from the same parameters) and one line to GRADCOMP_CONFORMANCE_SELECTORS.
#pragma once

#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "inputs.hpp"
#include "reference.hpp"

// The conformance list: every selector case, one line each.
#define GRADCOMP_CONFORMANCE_SELECTORS                                                              \
  conformance::exact_topk_case, conformance::sampled_threshold_case, conformance::chunk_local_case, \
      conformance::random_k_case, conformance::threshold_case, conformance::given_indices_case

namespace conformance {

namespace gc = gradcomp;

// -- selector cases: make(variant, n, density) gives the policy and its reference model,
//    both from the same parameters ------------------------------------------------------

struct exact_topk_case {
  static constexpr int variants = 2;
  static std::string name(int v) { return v == 0 ? "exact_topk{.density}" : "exact_topk{.count}"; }
  struct model {
    std::size_t k;
    reference::selection select(const std::vector<float>& acc, const std::vector<float>&, std::uint64_t) {
      return {reference::top_k(acc, k)};
    }
  };
  static auto make(int v, std::size_t n, double d) {
    if (v == 0) return std::pair{gc::select::exact_topk{.density = d}, model{reference::k_for(d, n)}};
    const std::size_t k = std::min(n, reference::k_for(d, n) + 1);
    return std::pair{gc::select::exact_topk{.count = k}, model{k}};
  }
};

struct sampled_threshold_case {
  static constexpr int variants = 4;
  static std::string name(int v) {
    const char* names[] = {"sampled_threshold{}", "sampled_threshold{.truncate}", "sampled_threshold{.reuse_threshold}",
                           "sampled_threshold{.lower = 0.5, .upper = 2, .max_iters = 3, .truncate, .reuse_threshold}"};
    return names[v];
  }
  struct model : reference::sampled_threshold {
    reference::selection select(const std::vector<float>& acc, const std::vector<float>&, std::uint64_t step) {
      return {reference::sampled_threshold::select(acc, step)};
    }
  };
  static auto make(int v, std::size_t, double d) {
    gc::select::sampled_threshold p{.density = d, .seed = 5};
    if (v == 1) p.truncate = true;
    if (v == 2) p = {.density = d, .sample_ratio = 0.05, .seed = 6, .reuse_threshold = true};
    if (v == 3) {
      p = {.density = d,
           .lower = 0.5f,
           .upper = 2.0f,
           .max_iters = 3,
           .seed = 7,
           .truncate = true,
           .reuse_threshold = true};
    }
    model m;
    m.density = p.density;
    m.sample_ratio = p.sample_ratio;
    m.lower = p.lower;
    m.upper = p.upper;
    m.max_iters = p.max_iters;
    m.seed = p.seed;
    m.truncate = p.truncate;
    m.reuse_threshold = p.reuse_threshold;
    return std::pair{p, m};
  }
};

struct chunk_local_case {
  static constexpr int variants = 3;
  static constexpr std::size_t bins[] = {50, 7, 1000000};
  static std::string name(int v) { return "chunk_local{.bin = " + std::to_string(bins[v]) + "}"; }
  struct model {
    std::size_t bin;
    reference::selection select(const std::vector<float>& acc, const std::vector<float>& g, std::uint64_t) {
      return {reference::chunk_local(acc, g, bin)};
    }
  };
  static auto make(int v, std::size_t, double) {
    return std::pair{gc::select::chunk_local{.bin = bins[v]}, model{bins[v]}};
  }
};

struct random_k_case {
  static constexpr int variants = 2;
  static std::string name(int v) { return v == 0 ? "random_k{}" : "random_k{.unbiased}"; }
  struct model {
    std::size_t k;
    std::uint64_t seed;
    float scale;
    reference::selection select(const std::vector<float>& acc, const std::vector<float>&, std::uint64_t step) {
      return {reference::random_k(acc.size(), k, seed, step), scale};
    }
  };
  static auto make(int v, std::size_t n, double d) {
    const std::size_t k = reference::k_for(d, n);
    const float scale = v == 0 ? 1.0f : static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
    return std::pair{gc::select::random_k{.density = d, .seed = 3u + static_cast<unsigned>(v), .unbiased = v == 1},
                     model{k, 3u + static_cast<unsigned>(v), scale}};
  }
};

struct threshold_case {
  static constexpr int variants = 3;
  static constexpr float taus[] = {1.0f, 0.0f, 1e-30f};
  static std::string name(int v) { return "threshold{.tau = " + std::to_string(taus[v]) + "}"; }
  struct model {
    float tau;
    reference::selection select(const std::vector<float>& acc, const std::vector<float>&, std::uint64_t) {
      return {reference::at_least(acc, tau)};
    }
  };
  static auto make(int v, std::size_t, double) {
    return std::pair{gc::select::threshold{.tau = taus[v]}, model{taus[v]}};
  }
};

// The caller's indices: each i with probability 2 d, drawn by the test before each step.
struct given_indices_case {
  static constexpr int variants = 1;
  static std::string name(int) { return "given_indices"; }
  struct model {
    double d;
    std::vector<std::uint32_t> next;
    void draw(std::size_t n, std::uint64_t step) {
      next.clear();
      for (std::size_t i = 0; i < n; ++i) {
        if (reference::random_unit(77, step, i) < 2.0 * d) next.push_back(static_cast<std::uint32_t>(i));
      }
    }
    reference::selection select(const std::vector<float>&, const std::vector<float>&, std::uint64_t) { return {next}; }
  };
  static auto make(int, std::size_t n, double d) {
    return std::pair{gc::select::given_indices{.max_count = n}, model{d, {}}};
  }
  template <class Compressor>
  static void before_step(Compressor& c, model& m, std::size_t n, std::uint64_t step) {
    m.draw(n, step);
    c.set_indices(m.next);
  }
};

}  // namespace conformance

// The grid's test cases named by their selector ("...<conformance::exact_topk_case>"),
// so that ctest can run them side by side (tests/CMakeLists.txt).
TYPE_TO_STRING(conformance::exact_topk_case);
TYPE_TO_STRING(conformance::sampled_threshold_case);
TYPE_TO_STRING(conformance::chunk_local_case);
TYPE_TO_STRING(conformance::random_k_case);
TYPE_TO_STRING(conformance::threshold_case);
TYPE_TO_STRING(conformance::given_indices_case);

namespace conformance {

// -- corrector cases --------------------------------------------------------------------

using kind = reference::corrector::kind;

struct none_case {
  static constexpr int variants = 1;
  static std::string name(int) { return "none"; }
  static auto make(int) { return std::pair{gc::correct::none{}, reference::corrector{}}; }
};

struct clip_norm_case {
  static constexpr int variants = 2;
  static constexpr float norms[] = {1.0f, 1e3f};
  static std::string name(int v) { return "clip_norm{.max_norm = " + std::to_string(norms[v]) + "}"; }
  static auto make(int v) {
    return std::pair{gc::correct::clip_norm{.max_norm = norms[v]}, reference::corrector{.max_norm = norms[v]}};
  }
};

struct error_feedback_case {
  static constexpr int variants = 2;
  static std::string name(int v) { return v == 0 ? "error_feedback{}" : "error_feedback{.beta = 0.5, .gamma = 2}"; }
  static auto make(int v) {
    const gc::correct::error_feedback p =
        v == 0 ? gc::correct::error_feedback{} : gc::correct::error_feedback{.beta = 0.5f, .gamma = 2.0f};
    return std::pair{p, reference::corrector{.type = kind::error_feedback, .beta = p.beta, .gamma = p.gamma}};
  }
};

struct momentum_case {
  static constexpr int variants = 3;
  static std::string name(int v) {
    const char* names[] = {"momentum{}", "momentum{.beta = 0.5, .nesterov, .masking = false}", "momentum{.nesterov}"};
    return names[v];
  }
  static auto make(int v) {
    gc::correct::momentum p{};
    if (v == 1) p = {.beta = 0.5f, .nesterov = true, .masking = false};
    if (v == 2) p = {.nesterov = true};
    return std::pair{
        p, reference::corrector{.type = kind::momentum, .beta = p.beta, .nesterov = p.nesterov, .masking = p.masking}};
  }
};

struct low_pass_case {
  static constexpr int variants = 2;
  static std::string name(int v) { return v == 0 ? "low_pass{.beta = 0.5}" : "low_pass{.beta = 1}"; }
  static auto make(int v) {
    const gc::correct::low_pass p{.beta = v == 0 ? 0.5f : 1.0f};
    return std::pair{p, reference::corrector{.type = kind::low_pass, .beta = p.beta}};
  }
};

// clip_norm in front of a stateful corrector (DGC's chain)
template <class Last, kind Kind>
struct clipped_case {
  static constexpr int variants = 3;
  static constexpr float norms[] = {1.0f, 1e3f, std::numeric_limits<float>::infinity()};
  static std::string name(int v) {
    return "chain{clip_norm{.max_norm = " + std::to_string(norms[v]) + ", .workers = 4}, " + Last{}.name() + "}";
  }
  static auto make(int v) {
    const gc::correct::clip_norm clip{.max_norm = norms[v], .workers = 4};
    const Last last{};
    reference::corrector model{.type = Kind, .beta = last.beta, .max_norm = clip.max_norm, .workers = clip.workers};
    if constexpr (Kind == kind::momentum) model.nesterov = last.nesterov;
    return std::pair{gc::correct::chain{clip, last}, model};
  }
};

// The state of `Case`'s corrector stored in 8 or 4 bits (correct::compact), blocks of
// 8 to 64 entries (variants alternate between them).
template <class Case>
struct compact_case {
  static constexpr int variants = 2 * Case::variants;
  static constexpr unsigned bits[] = {8, 4};
  static constexpr unsigned blocks[] = {64, 24};  // a power of two (a shift finds the block) and not
  static std::string name(int v) {
    return "compact{" + Case::name(v / 2) + ", .bits = " + std::to_string(bits[v % 2]) +
           ", .block = " + std::to_string(blocks[v % 2]) + "}";
  }
  static auto make(int v) {
    auto [inner, model] = Case::make(v / 2);
    model.memory_bits = bits[v % 2];
    model.memory_block = blocks[v % 2];
    return std::pair{gc::correct::compact<decltype(inner)>{.inner = inner, .bits = bits[v % 2], .block = blocks[v % 2]},
                     model};
  }
};

// -- the runs: shapes x sizes x densities x value codings x index codings ---------------

struct value_case {
  gc::value_coding coding;
  reference::values model;
  std::uint32_t levels;
};
inline const value_case value_cases[] = {
    {gc::value_coding::f32, reference::values::f32, 16},         {gc::value_coding::f16, reference::values::f16, 16},
    {gc::value_coding::bf16, reference::values::bf16, 16},       {gc::value_coding::int8, reference::values::int8, 16},
    {gc::value_coding::ternary, reference::values::ternary, 16}, {gc::value_coding::qsgd, reference::values::qsgd, 3},
    {gc::value_coding::qsgd, reference::values::qsgd, 65536},    {gc::value_coding::int4, reference::values::int4, 16}};
inline const gc::index_coding index_cases[] = {gc::index_coding::automatic, gc::index_coding::raw32,
                                               gc::index_coding::delta_bitpack, gc::index_coding::bitmap};
constexpr std::uint64_t qsgd_seed = 11;

// What the compressor is given: float32, or the input rounded to binary16 or bfloat16
// (the reference models the rounded values).
enum class gradient_type { f32, f16, bf16 };
inline std::string name(gradient_type t) {
  return t == gradient_type::f32 ? "f32" : t == gradient_type::f16 ? "f16" : "bf16";
}

struct run {
  gradient_type gradient;
  inputs::shape shape;
  std::size_t n;
  double density;
  int steps;
  int variant;  // which variant of the selector and of the corrector
  gc::index_coding index;
  value_case value;
  bool checksum;  // a CRC-32C in the header (every third run)
};

// Every value coding meets every shape at n = 1, 7, 1000 and one shape at n = 70003
// (three host tiles, so two threads split the work); the gradient type, the index
// coding and the variants rotate so that each meets every value coding.
inline std::vector<run> runs() {
  const gradient_type gradients[] = {gradient_type::f32, gradient_type::f16, gradient_type::bf16};
  std::vector<run> out;
  int counter = 0;
  for (std::size_t vc = 0; vc < std::size(value_cases); ++vc) {
    for (std::size_t s = 0; s < std::size(inputs::all_shapes); ++s) {
      const double small_densities[] = {0.2, 0.5, 1.0};
      const double mid_densities[] = {0.01, 0.05, 0.3};
      out.push_back({gradients[(vc + s) % 3], inputs::all_shapes[s], 1, 0.5, 3, counter, index_cases[(vc + s) % 4],
                     value_cases[vc], counter % 3 == 2});
      ++counter;
      out.push_back({gradients[(vc + s + 1) % 3], inputs::all_shapes[s], 7, small_densities[s % 3], 6, counter,
                     index_cases[(vc + s + 1) % 4], value_cases[vc], counter % 3 == 2});
      ++counter;
      out.push_back({gradients[(vc + s + 2) % 3], inputs::all_shapes[s], 1000, mid_densities[s % 3], 6, counter,
                     index_cases[(vc + s + 2) % 4], value_cases[vc], counter % 3 == 2});
      ++counter;
    }
    // Large messages, with a checksum every other value coding (many of its kilobyte pieces).
    out.push_back({gradients[vc % 3], inputs::all_shapes[vc % std::size(inputs::all_shapes)], 70003,
                   vc % 2 == 0 ? 0.001 : 0.01, 3, counter++, index_cases[vc % 4], value_cases[vc], vc % 2 == 1});
  }
  return out;
}

inline std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

inline reference::indices as_reference(gc::index_coding c) {
  switch (c) {
    case gc::index_coding::raw32:
      return reference::indices::raw32;
    case gc::index_coding::delta_bitpack:
      return reference::indices::delta_bitpack;
    default:
      return reference::indices::bitmap;
  }
}
inline gc::index_coding as_library(reference::indices c) {
  switch (c) {
    case reference::indices::raw32:
      return gc::index_coding::raw32;
    case reference::indices::delta_bitpack:
      return gc::index_coding::delta_bitpack;
    case reference::indices::bitmap:
      return gc::index_coding::bitmap;
  }
  return gc::index_coding::automatic;
}

// The message bytes as the documented layout (message.hpp) says they must be, raw32/f32.
inline std::vector<std::byte> expected_raw32_f32(std::size_t n, const std::vector<std::uint32_t>& idx,
                                                 const std::vector<float>& values) {
  std::vector<std::byte> out(56 + 8 * idx.size());
  auto put = [&](std::size_t at, auto v) { std::memcpy(out.data() + at, &v, sizeof(v)); };
  std::memcpy(out.data(), "GCMP", 4);
  put(4, std::uint16_t{1});
  put(6, std::uint8_t{1});  // raw32
  put(7, std::uint8_t{1});  // f32
  put(16, std::uint64_t{n});
  put(24, std::uint64_t{idx.size()});
  put(32, std::uint64_t{4 * idx.size()});
  put(40, std::uint64_t{4 * idx.size()});
  for (std::size_t j = 0; j < idx.size(); ++j) {
    put(56 + 4 * j, idx[j]);
    put(56 + 4 * idx.size() + 4 * j, values[j]);
  }
  return out;
}

// The first way in which a step's message and the corrector's memory differ from the
// reference's, or "" when they agree bit for bit.
template <class Compressor>
std::string difference(const Compressor& c, std::size_t count, const std::vector<std::byte>& bytes, const run& r,
                       const std::vector<std::uint32_t>& index, const std::vector<float>& sent,
                       const reference::corrector& memory) {
  std::ostringstream out;
  if (count != index.size()) {
    out << "count " << count << ", reference " << index.size();
    return out.str();
  }
  const reference::indices coding =
      r.index == gc::index_coding::automatic ? reference::smallest_index_coding(r.n, index) : as_reference(r.index);
  const std::size_t size = 56 + reference::index_section_bytes(coding, r.n, index) +
                           reference::value_section_bytes(r.value.model, index.size(), r.value.levels);
  if (bytes.size() != size) out << "message of " << bytes.size() << " bytes, reference " << size << "; ";
  if (static_cast<gc::index_coding>(std::to_integer<std::uint8_t>(bytes[6])) != as_library(coding)) {
    out << "index coding " << std::to_integer<int>(bytes[6]) << ", reference " << gc::to_string(as_library(coding))
        << "; ";
  }
  const gc::sparse_vector s = gc::decode(bytes);
  if (s.n != r.n || s.indices != index) out << "decoded indices differ; ";
  for (std::size_t j = 0; j < sent.size() && j < s.values.size(); ++j) {
    if (bits(s.values[j]) != bits(sent[j])) {
      out << "value " << j << " (index " << index[j] << ") is " << s.values[j] << ", reference " << sent[j] << "; ";
      break;
    }
  }
  if (std::to_integer<std::uint32_t>(bytes[8]) != (r.checksum ? 1u : 0u)) out << "checksum flag differs; ";
  std::uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + 12, 4);
  if (crc != (r.checksum ? reference::message_crc32c(bytes) : 0u)) out << "checksum differs; ";
  if (r.index == gc::index_coding::raw32 && r.value.coding == gc::value_coding::f32) {
    auto want = expected_raw32_f32(r.n, index, sent);
    if (r.checksum) {
      want[8] = std::byte{1};
      std::memcpy(want.data() + 12, &crc, 4);
    }
    if (bytes.size() != want.size() || std::memcmp(bytes.data(), want.data(), want.size()) != 0) {
      out << "bytes differ from the raw32/f32 layout; ";
    }
  }
  for (std::size_t a = 0; a < memory.arrays(); ++a) {
    const auto state = c.corrector_state(a);
    for (std::size_t i = 0; i < r.n; ++i) {
      if (bits(state[i]) != bits(memory.state[a][i])) {
        out << "corrector state " << a << " at " << i << " is " << state[i] << ", reference " << memory.state[a][i];
        break;
      }
    }
  }
  return out.str();
}

// The input of step `step` of run r, rounded to the run's gradient type.
inline std::vector<float> gradient(const run& r, std::uint64_t step) {
  std::vector<float> g = inputs::make(r.shape, r.n, 100 + step);
  for (float& v : g) {
    if (r.gradient == gradient_type::f16) v = reference::round_to_format(v, 11, -14, 65504.0);
    if (r.gradient == gradient_type::bf16) v = reference::round_to_format(v, 8, -126, 0x1.FEp127);
  }
  return g;
}

// compress(g) with g in backend memory as the run's gradient type.
template <class Target, class Compressor, class Out>
typename Compressor::message_type compress(Compressor& c, gradient_type type, const std::vector<float>& g, Out& out) {
  if (type == gradient_type::f16) {
    std::vector<gc::half> h;
    for (const float v : g) h.push_back({reference::binary16_bits(v)});
    auto in_backend = Target::copy_of(h);
    return c.compress(Target::span(in_backend), Target::span(out));
  }
  if (type == gradient_type::bf16) {
    std::vector<gc::bfloat16> b;
    for (const float v : g) b.push_back({reference::bfloat16_bits(v)});
    auto in_backend = Target::copy_of(b);
    return c.compress(Target::span(in_backend), Target::span(out));
  }
  auto in_backend = Target::copy_of(g);
  return c.compress(Target::span(in_backend), Target::span(out));
}

// Gives the compressor's workspace back; what it still holds then as workspace, if that
// is more than a few per-tile and per-thread bytes (empty if not).
template <class Compressor>
std::string released(Compressor& c) {
  c.release_workspace();
  const std::size_t left = c.memory_bytes().workspace;
  std::size_t allowed = (std::size_t{1} << 16) + c.size() / 64;
  if constexpr (std::is_same_v<typename Compressor::selector_type, gc::select::given_indices>) {
    allowed += 4 * c.selector().max_selected(c.size());  // the index set stays
  }
  if (left <= allowed) return {};
  return "release_workspace() left " + std::to_string(left) + " bytes of workspace (allowed " +
         std::to_string(allowed) + ")";
}

template <class Selector, class Compressor, class Model>
void before_step(Compressor& c, Model& m, std::size_t n, std::uint64_t step) {
  if constexpr (requires { Selector::before_step(c, m, n, step); }) Selector::before_step(c, m, n, step);
}

template <class Target, class Selector, class Corrector>
void run_grid() {
  for (const auto& backend : Target::backends()) {
    for (const run& r : runs()) {
      const int selector_variant = r.variant % Selector::variants;
      const int corrector_variant = (r.variant / Selector::variants) % Corrector::variants;
      auto [selector, selector_model] = Selector::make(selector_variant, r.n, r.density);
      auto [corrector, memory] = Corrector::make(corrector_variant);
      const gc::encode::index_value encoder{.index = r.index,
                                            .value = r.value.coding,
                                            .levels = r.value.levels,
                                            .seed = qsgd_seed,
                                            .checksum = r.checksum};
      gc::compressor c{backend, r.n, selector, corrector, encoder};
      auto out = Target::template copy_of<std::byte>(std::vector<std::byte>(c.max_message_bytes()));
      for (int t = 0; t < r.steps; ++t) {
        const auto step = static_cast<std::uint64_t>(t);
        const auto g = gradient(r, step);
        before_step<Selector>(c, selector_model, r.n, step);
        const auto m = compress<Target>(c, r.gradient, g, out);

        const std::vector<float>& acc = memory.update(g);
        const reference::selection chosen = selector_model.select(acc, g, step);
        std::vector<float> values;
        for (const auto i : chosen.index) {
          const float max = std::numeric_limits<float>::max();
          values.push_back(std::clamp(acc[i] * chosen.value_scale, -max, max));
        }
        const auto sent = reference::sent_values(r.value.model, values, r.value.levels, qsgd_seed, step);
        memory.commit(chosen.index, sent);

        std::string diff = difference(c, m.count(), Target::host_copy(m.bytes()), r, chosen.index, sent, memory);
        // Every other run gives its workspace back after odd steps: the next step
        // allocates it again and must write what the model writes all the same.
        if (diff.empty() && r.variant % 2 == 1 && t % 2 == 1) diff = released(c);
        if (!diff.empty()) {
          FAIL(Target::name_of(backend) << ", " << Selector::name(selector_variant) << ", "
                                        << Corrector::name(corrector_variant) << ", " << encoder.name() << ", "
                                        << name(r.gradient) << " gradient, " << inputs::name(r.shape) << ", n = " << r.n
                                        << ", density = " << r.density << ", step " << t << ": " << diff);
        }
      }
      REQUIRE(c.step() == static_cast<std::uint64_t>(r.steps));
    }
  }
}

// Every corrector case behind `Selector`, on every backend of `Target`.
template <class Target, class Selector>
void run_grid_for_every_corrector() {
  run_grid<Target, Selector, none_case>();
  run_grid<Target, Selector, clip_norm_case>();
  run_grid<Target, Selector, error_feedback_case>();
  run_grid<Target, Selector, momentum_case>();
  run_grid<Target, Selector, low_pass_case>();
  run_grid<Target, Selector, clipped_case<gc::correct::error_feedback, kind::error_feedback>>();
  run_grid<Target, Selector, clipped_case<gc::correct::momentum, kind::momentum>>();
  run_grid<Target, Selector, compact_case<error_feedback_case>>();
  run_grid<Target, Selector, compact_case<clipped_case<gc::correct::momentum, kind::momentum>>>();
  run_grid<Target, Selector, compact_case<low_pass_case>>();
}

}  // namespace conformance
