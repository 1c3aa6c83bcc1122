// The conformance grid (support/conformance.hpp) on backend::host with one and with two
// threads, or, built with GRADCOMP_TEST_KOKKOS, on backend::kokkos<DefaultExecutionSpace>;
// and the properties that hold over many steps.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <string>
#include <vector>

#include "support/engine_stages.hpp"
#include "support/conformance.hpp"
#include "support/inputs.hpp"
#include "support/opaque_host.hpp"
#include "support/reference.hpp"

namespace gc = gradcomp;

#if defined(GRADCOMP_TEST_KOKKOS)
#include <gradcomp/backend/kokkos.hpp>
using backend_under_test = gc::backend::kokkos<Kokkos::DefaultExecutionSpace>;
#else
using backend_under_test = gc::backend::host;
#endif

namespace {

// Host memory: the test's vectors are the backend's.
struct target {
  static std::vector<backend_under_test> backends() {
#if defined(GRADCOMP_TEST_KOKKOS)
    return {backend_under_test{}};
#else
    return {{.threads = 1}, {.threads = 2}};
#endif
  }
  static std::string name_of(const backend_under_test& b) {
#if defined(GRADCOMP_TEST_KOKKOS)
    (void)b;
    return "kokkos<DefaultExecutionSpace>";
#else
    return "host{.threads = " + std::to_string(b.threads) + "}";
#endif
  }
  template <class T>
  static std::vector<T> copy_of(std::vector<T> v) {
    return v;
  }
  template <class T>
  static std::span<T> span(std::vector<T>& v) {
    return v;
  }
  static std::vector<std::byte> host_copy(std::span<const std::byte> bytes) { return {bytes.begin(), bytes.end()}; }
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("every selector x corrector x value coding matches its reference", Selector, grid) {
  conformance::run_grid_for_every_corrector<target, Selector>();
}
TEST_CASE_TEMPLATE_INVOKE(grid, GRADCOMP_CONFORMANCE_SELECTORS);

// A tensor of a million entries, three steps, for the methods with exact selection.
TEST_CASE("a tensor of 2^20 + 3 entries matches its reference") {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  for (const auto s : {inputs::shape::student_t3, inputs::shape::ties}) {
    auto c = gc::compressor{backend_under_test{}, n, gc::select::exact_topk{.density = 1e-3},
                            gc::correct::error_feedback{.beta = 0.5f, .gamma = 2.0f},
                            gc::encode::index_value{.index = gc::index_coding::raw32}};
    reference::corrector memory{.type = conformance::kind::error_feedback, .beta = 0.5f, .gamma = 2.0f};
    std::vector<std::byte> buf(c.max_message_bytes());
    for (std::uint64_t t = 0; t < 3; ++t) {
      const auto g = inputs::make(s, n, 100 + t);
      const gc::message m = c.compress(g, buf);
      const auto& acc = memory.update(g);
      const auto idx = reference::top_k(acc, reference::k_for(1e-3, n));
      std::vector<float> values;
      for (const auto i : idx) values.push_back(acc[i]);
      memory.commit(idx, values);
      const auto want = conformance::expected_raw32_f32(n, idx, values);
      CAPTURE(inputs::name(s));
      REQUIRE(m.bytes().size() == want.size());
      REQUIRE(std::memcmp(m.bytes().data(), want.data(), want.size()) == 0);
      REQUIRE(std::memcmp(c.corrector_state(0).data(), memory.state[0].data(), 4 * n) == 0);
    }
  }
}

TEST_CASE("error feedback conserves the gradient over 100 steps") {
  for (const auto s :
       {inputs::shape::normal, inputs::shape::student_t3, inputs::shape::log_normal, inputs::shape::ties}) {
    const std::size_t n = 4099;
    auto c =
        gc::compressor{backend_under_test{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{}};
    std::vector<std::byte> buf(c.max_message_bytes());
    std::vector<double> gradient_sum(n, 0.0), magnitude_sum(n, 0.0);
    std::vector<float> sent_sum(n, 0.0f);
    for (int t = 0; t < 100; ++t) {
      const auto g = inputs::make(s, n, 1000 + static_cast<std::uint64_t>(t));
      for (std::size_t i = 0; i < n; ++i) {
        gradient_sum[i] += g[i];
        magnitude_sum[i] += std::fabs(g[i]);
      }
      gc::accumulate(gc::backend::host{}, c.compress(g, buf).bytes(), sent_sum, 1.0f);
    }
    const auto residual = c.corrector_state(0);
    std::size_t violations = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double total = static_cast<double>(residual[i]) + static_cast<double>(sent_sum[i]);
      // Float rounding of the running sums: a few ulps of the summed magnitudes.
      violations += std::fabs(total - gradient_sum[i]) > 1e-5 * (magnitude_sum[i] + 1e-30) ? 1 : 0;
    }
    CAPTURE(inputs::name(s));
    CHECK(violations == 0);
  }
}

TEST_CASE("lossless values leave exactly zero residual at sent indices") {
  const std::size_t n = 1000;
  auto c = gc::compressor{backend_under_test{}, n, gc::select::exact_topk{.count = 10}, gc::correct::error_feedback{}};
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto g = inputs::make(inputs::shape::student_t3, n, 5);
  const auto sent = gc::decode(c.compress(g, buf).bytes());
  for (const auto i : sent.indices) CHECK(c.corrector_state(0)[i] == 0.0f);
}

#if !defined(GRADCOMP_TEST_KOKKOS)
// backend::host's corrector engines are fast paths (fused with the selector's pass,
// optimistic clipping order, in-place updates): each must equal the generic algorithm
// that the other backends run (detail/correct/elementwise.hpp, detail/correct/none.hpp)
// instantiated on backend::host, bit for bit, step by step, rejected steps included.
namespace {

template <class Policy>
struct generic_of {
  using type = gc::detail::elementwise_correction<Policy, gc::backend::host>;
};
template <>
struct generic_of<gc::correct::none> {
  using type = gc::detail::no_correction<gc::backend::host>;
};
template <class Policy>
using generic_engine = typename generic_of<Policy>::type;

template <class Case>
void fast_path_matches_generic() {
  for (int variant = 0; variant < Case::variants; ++variant) {
    for (const int threads : {1, 2}) {
      for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70003}}) {
        const auto policy = Case::make(variant).first;
        using policy_type = std::remove_const_t<decltype(policy)>;
        const gc::backend::host be{.threads = threads};
        using fast_type = gc::detail::fast_engine<policy_type, gc::backend::host>;
        fast_type fast(be, policy, n);
        generic_engine<policy_type> generic(be, policy, n);
        // Engines that read a 16-bit gradient as it is get a bfloat16 one every fourth step.
        constexpr bool reads_16_bit =
            gc::detail::corrector_engine_reads<fast_type, policy_type, gc::backend::host, gc::bfloat16>;
        for (std::uint64_t t = 0; t < 8; ++t) {
          const auto shape = inputs::all_shapes[t % std::size(inputs::all_shapes)];
          auto g = inputs::make(shape, n, 7000 + t);
          // Large gradients now and then, so that clip_norm clips (and stops clipping).
          if (t % 3 == 1) {
            for (float& x : g) x *= 1e4f;
          }
          if (t == 5) g[n / 2] = std::numeric_limits<float>::quiet_NaN();  // a rejected step
          const bool narrow = reads_16_bit && t % 4 == 3;
          std::vector<gc::bfloat16> g16(narrow ? n : 0);
          for (std::size_t i = 0; i < g16.size(); ++i) {  // each value's bfloat16, and g its value
            g16[i] = gc::bfloat16{static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g[i]) >> 16)};
            g[i] = gc::to_float(g16[i]);
          }
          // The stage on g, or on its bfloat16 where the step is narrow.
          const auto on_gradient = [&](auto&& stage) {
            if constexpr (reads_16_bit) {
              if (narrow) return stage(std::span<const gc::bfloat16>(g16));
            }
            return stage(std::span<const float>(g));
          };
          const bool in_place = t % 2 == 0;  // compressor::stage forbids in-place updates
          if constexpr (requires { fast.allow_in_place(in_place); }) fast.allow_in_place(in_place);
          CAPTURE(Case::name(variant));
          CAPTURE(threads);
          CAPTURE(n);
          CAPTURE(t);

          CAPTURE(narrow);

          std::vector<float> preview_fast(n), preview_generic(n);
          const bool preview_ok =
              on_gradient([&](auto grad) { return support::preview_now(fast, be, policy, grad, preview_fast); });
          REQUIRE(on_gradient([&](auto grad) {
                    return support::preview_now(generic, be, policy, grad, preview_generic);
                  }) == preview_ok);
          if (preview_ok) REQUIRE(std::memcmp(preview_fast.data(), preview_generic.data(), 4 * n) == 0);

          const bool ok = on_gradient([&](auto grad) { return support::update_now(fast, be, policy, grad); });
          REQUIRE(on_gradient([&](auto grad) { return support::update_now(generic, be, policy, grad); }) == ok);
          REQUIRE(ok == (t != 5));
          if (!ok) continue;  // rejected: nothing committed, nothing accepted
          const auto acc_fast = fast.acc(g);
          const auto acc_generic = generic.acc(g);
          REQUIRE(std::memcmp(acc_fast.data(), acc_generic.data(), 4 * n) == 0);

          std::vector<std::uint32_t> index;
          std::vector<float> sent;
          for (std::uint32_t i = 0; i < n; ++i) {
            if ((i * 2654435761u + t) % 7 == 0) {
              index.push_back(i);
              sent.push_back(t % 2 == 1 ? acc_fast[i] * 0.5f : acc_fast[i]);  // lossy and lossless values
            }
          }
          support::commit_now(fast, be, policy, index, sent);
          support::commit_now(generic, be, policy, index, sent);
          fast.accept();
          generic.accept();
          for (std::size_t a = 0; a != policy_type::state_arrays; ++a) {
            REQUIRE(std::memcmp(fast.committed(a).data(), generic.committed(a).data(), 4 * n) == 0);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("backend::host's corrector fast paths equal the generic algorithm on backend::host") {
  fast_path_matches_generic<conformance::none_case>();
  fast_path_matches_generic<conformance::clip_norm_case>();
  fast_path_matches_generic<conformance::error_feedback_case>();
  fast_path_matches_generic<conformance::momentum_case>();
  fast_path_matches_generic<conformance::low_pass_case>();
  fast_path_matches_generic<
      conformance::clipped_case<gc::correct::error_feedback, conformance::kind::error_feedback>>();
  fast_path_matches_generic<conformance::clipped_case<gc::correct::momentum, conformance::kind::momentum>>();
}
#endif

#if !defined(GRADCOMP_TEST_KOKKOS)
namespace {
// A selector's fast path and its generic algorithm select the same entries from `in`,
// standalone, and both see a finite input.
template <class Fast, class Generic, class Policy>
void require_same_selection(const gc::backend::host& be, Fast& fast, Generic& generic, const Policy& policy,
                            const gc::detail::select_input& in) {
  const std::size_t n = in.acc.size();
  std::vector<std::uint32_t> out_fast(n), out_generic(n, 0xFFFFFFFFu);
  const auto a = support::select_now(fast, be, policy, in, out_fast);
  const auto b = support::select_now(generic, be, policy, in, out_generic);
  REQUIRE(a.finite);
  REQUIRE(b.finite);
  REQUIRE(a.count == b.count);
  REQUIRE(std::equal(out_fast.begin(), out_fast.begin() + static_cast<std::ptrdiff_t>(a.count), out_generic.begin()));
}
}  // namespace
#endif

#if !defined(GRADCOMP_TEST_KOKKOS)
// backend::host's threshold engine (collecting in the corrector's pass, SIMD skipping)
// against the generic compaction (detail/select/threshold.hpp) on backend::host.
TEST_CASE("backend::host's threshold fast path equals the generic algorithm on backend::host") {
  for (const int threads : {1, 2}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70003}}) {
      for (const auto shape : inputs::all_shapes) {
        for (const float tau : {0.0f, 1e-30f, 0.5f, 1.0f, 3.0f}) {
          const gc::backend::host be{.threads = threads};
          const gc::select::threshold policy{.tau = tau};
          gc::detail::fast_engine<gc::select::threshold, gc::backend::host> fast(be, policy, n);
          gc::detail::threshold_selection<gc::backend::host> generic(be, policy, n);
          const auto acc = inputs::make(shape, n, 31);
          CAPTURE(threads);
          CAPTURE(n);
          CAPTURE(inputs::name(shape));
          CAPTURE(tau);
          require_same_selection(be, fast, generic, policy, {acc, acc, 0});
        }
      }
    }
  }
}
#endif

#if !defined(GRADCOMP_TEST_KOKKOS)
// backend::host's sampled_threshold engine (sampling directly, collecting by thread
// slices, ranking in place) against the generic algorithm
// (detail/select/sampled_threshold.hpp) on backend::host and on opaque_host, step after
// accepted step so that a reused threshold carries over, the exact fallback (n = 1, 7)
// included (opaque_host: support/opaque_host.hpp, the path backend::cuda takes).
template <class Backend>
void require_sampled_threshold_fast_path_equals(const std::string& generic_name) {
  using case_type = conformance::sampled_threshold_case;
  for (int variant = 0; variant < case_type::variants; ++variant) {
    for (const int threads : {1, 2}) {
      for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70003}}) {
        for (const double density : {0.001, 0.05, 0.5}) {
          const gc::backend::host be{.threads = threads};
          const auto policy = case_type::make(variant, n, density).first;
          gc::detail::fast_engine<gc::select::sampled_threshold, gc::backend::host> fast(be, policy, n);
          const Backend generic_be{be};
          gc::detail::sampled_threshold_selection<Backend> generic(generic_be, policy, n);
          for (std::uint64_t t = 0; t < 6; ++t) {
            const auto shape =
                inputs::all_shapes[(t + static_cast<std::uint64_t>(variant)) % std::size(inputs::all_shapes)];
            const auto acc = inputs::make(shape, n, 500 + t);
            CAPTURE(generic_name);
            CAPTURE(case_type::name(variant));
            CAPTURE(threads);
            CAPTURE(n);
            CAPTURE(density);
            CAPTURE(t);
            std::vector<std::uint32_t> out_fast(n), out_generic(n, 0xFFFFFFFFu);
            const auto a = support::select_now(fast, be, policy, {acc, acc, t}, out_fast);
            const auto b = support::select_now(generic, generic_be, policy, {acc, acc, t}, out_generic);
            REQUIRE(a.count == b.count);
            REQUIRE(std::equal(out_fast.begin(), out_fast.begin() + static_cast<std::ptrdiff_t>(a.count),
                               out_generic.begin()));
            fast.accept();
            generic.accept();
            REQUIRE(fast.saved_state() == generic.saved_state());  // the carried threshold
          }
        }
      }
    }
  }
}

TEST_CASE("backend::host's sampled_threshold fast path equals the generic algorithm, host-readable or not") {
  require_sampled_threshold_fast_path_equals<gc::backend::host>("host");
  require_sampled_threshold_fast_path_equals<opaque_host>("opaque host");
}

#endif

#if !defined(GRADCOMP_TEST_KOKKOS)
// backend::host's exact_topk engine (a SIMD radix select) against the generic algorithm
// (detail/select/exact_topk.hpp) on backend::host: sizes on both sides of the sampled
// bracket's threshold (2^16), counts from 1 to n, ties (the "ties" and "zeros" shapes)
// and inputs on which the sample's bracket misses (a sorted ramp whose every 512th
// entry sits apart).
TEST_CASE("backend::host's exact_topk fast path equals the generic algorithm on backend::host") {
  for (const int threads : {1, 2}) {
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70003}, std::size_t{300000}}) {
      for (const std::size_t k : {std::size_t{1}, std::size_t{2}, n / 1000 + 1, n / 7 + 1, n - n / 3, n}) {
        for (std::size_t s = 0; s <= std::size(inputs::all_shapes); ++s) {
          std::vector<float> acc;
          if (s < std::size(inputs::all_shapes)) {
            acc = inputs::make(inputs::all_shapes[s], n, 900 + s);
          } else {  // the sample (every 512th entry) holds the largest values only
            acc.resize(n);
            for (std::size_t i = 0; i < n; ++i)
              acc[i] = i % 512 == 0 ? 1e3f + static_cast<float>(i) : 1.0f / (1.0f + static_cast<float>(i % 977));
          }
          const gc::backend::host be{.threads = threads};
          const gc::select::exact_topk policy{.count = std::min(k, n)};
          gc::detail::fast_engine<gc::select::exact_topk, gc::backend::host> fast(be, policy, n);
          gc::detail::exact_topk_selection<gc::backend::host> generic(be, policy, n);
          CAPTURE(threads);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(s);
          require_same_selection(be, fast, generic, policy, {acc, acc, 0});
        }
      }
    }
  }
}
#endif

#if !defined(GRADCOMP_TEST_KOKKOS)
// backend::host's chunk_local engine (bins inside the corrector's tiles, straddling
// bins stitched in select) against the generic expansion over the bins
// (detail/select/chunk_local.hpp) on backend::host, with g apart from acc.
TEST_CASE("backend::host's chunk_local fast path equals the generic algorithm on backend::host") {
  for (const int threads : {1, 2}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70003}}) {
      for (const std::size_t bin :
           {std::size_t{1}, std::size_t{7}, std::size_t{50}, std::size_t{5000}, std::size_t{100000}}) {
        for (std::size_t s = 0; s < std::size(inputs::all_shapes); ++s) {
          const gc::backend::host be{.threads = threads};
          const gc::select::chunk_local policy{.bin = bin};
          gc::detail::fast_engine<gc::select::chunk_local, gc::backend::host> fast(be, policy, n);
          gc::detail::chunk_local_selection<gc::backend::host> generic(be, policy, n);
          const auto acc = inputs::make(inputs::all_shapes[s], n, 1300 + s);
          const auto g = inputs::make(inputs::all_shapes[(s + 3) % std::size(inputs::all_shapes)], n, 1400 + s);
          CAPTURE(threads);
          CAPTURE(n);
          CAPTURE(bin);
          CAPTURE(inputs::name(inputs::all_shapes[s]));
          require_same_selection(be, fast, generic, policy, {acc, g, 0});
        }
      }
    }
  }
}
#endif
