// The conformance testbed: every compressor configuration, step by step, against a
// reference written here (support/reference.hpp), over the awkward inputs.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <cstring>

#include "support/inputs.hpp"
#include "support/reference.hpp"

namespace gc = gradcomp;

// The same testbed runs for every backend: built once as is, once with
// GRADCOMP_TEST_KOKKOS for backend::kokkos<DefaultExecutionSpace>.
#if defined(GRADCOMP_TEST_KOKKOS)
#include <gradcomp/backend/kokkos.hpp>
using backend_under_test = gc::backend::kokkos<Kokkos::DefaultExecutionSpace>;
#else
using backend_under_test = gc::backend::host;
#endif

namespace {

// The conformance messages are checked byte for byte against the raw32/f32 layout.
const gc::encode::index_value raw32_f32{.index = gc::index_coding::raw32, .value = gc::value_coding::f32};

// Each configuration pairs a library compressor with its reference model.
struct topk_plain {
  static auto make(std::size_t n, double d) {
    return gc::compressor{backend_under_test{}, n, gc::select::exact_topk{.density = d}, gc::correct::none{}, raw32_f32};
  }
  struct model {
    std::pair<std::vector<std::uint32_t>, std::vector<float>> step(const std::vector<float>& g, std::size_t k) {
      auto idx = reference::top_k(g, k);
      std::vector<float> v;
      for (auto i : idx) v.push_back(g[i]);
      return {idx, v};
    }
  };
};

struct topk_error_feedback {
  static auto make(std::size_t n, double d) {
    return gc::compressor{backend_under_test{}, n, gc::select::exact_topk{.density = d}, gc::correct::error_feedback{},
                          raw32_f32};
  }
  struct model : reference::topk_error_feedback {};
};

struct topk_decayed_feedback {
  static auto make(std::size_t n, double d) {
    return gc::compressor{backend_under_test{}, n, gc::select::exact_topk{.density = d},
                          gc::correct::error_feedback{.beta = 0.5f, .gamma = 2.0f}, raw32_f32};
  }
  struct model : reference::topk_error_feedback {
    model() {
      beta = 0.5f;
      gamma = 2.0f;
    }
  };
};

// The message bytes as the documented layout (message.hpp) says they must be.
std::vector<std::byte> expected_message(std::size_t n, const std::vector<std::uint32_t>& idx,
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

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("compressor matches its reference step by step", Config, conformance) {
  const double densities[] = {1e-3, 0.05, 1.0};
  for (const auto s : inputs::all_shapes) {
    for (const std::size_t n : inputs::awkward_sizes) {
      for (const double d : densities) {
        if (n > 100000 && d > 0.01) continue;
        CAPTURE(inputs::name(s));
        CAPTURE(n);
        CAPTURE(d);
        auto c = Config::make(n, d);
        typename Config::model ref;
        std::vector<std::byte> buf(c.max_message_bytes());
        const int steps = n > 100000 ? 3 : 12;
        for (int t = 0; t < steps; ++t) {
          const auto g = inputs::make(s, n, 100 + static_cast<std::uint64_t>(t));
          const gc::message m = c.compress(g, buf);
          const auto [idx, values] = ref.step(g, reference::k_for(d, n));
          const auto bytes = expected_message(n, idx, values);
          REQUIRE(m.count() == idx.size());
          REQUIRE(m.bytes().size() == bytes.size());
          REQUIRE(std::memcmp(m.bytes().data(), bytes.data(), bytes.size()) == 0);
        }
        CHECK(c.step() == static_cast<std::uint64_t>(steps));
      }
    }
  }
}
TEST_CASE_TEMPLATE_INVOKE(conformance, topk_plain, topk_error_feedback, topk_decayed_feedback);

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
