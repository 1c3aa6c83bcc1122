// The conformance grid (support/conformance.hpp) on backend::host with one and with two
// threads, or, built with GRADCOMP_TEST_KOKKOS, on backend::kokkos<DefaultExecutionSpace>;
// and the properties that hold over many steps.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "support/conformance.hpp"
#include "support/inputs.hpp"
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
  for (const auto s : {inputs::shape::normal, inputs::shape::student_t3, inputs::shape::log_normal, inputs::shape::ties}) {
    const std::size_t n = 4099;
    auto c = gc::compressor{backend_under_test{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{}};
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
