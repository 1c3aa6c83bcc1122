// backend::cuda's exact_topk (the multi-pass radix select) against a sort, on the
// conformance inputs, and its non-finite flag. Needs a GPU (exit 77 without one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/gradcomp.hpp>

#include <limits>
#include <vector>

#include "../support/inputs.hpp"
#include "../support/reference.hpp"

namespace gc = gradcomp;

namespace {

// The indices the CUDA compressor sends for x (no corrector, raw indices).
std::vector<std::uint32_t> device_topk(const std::vector<float>& x, gc::select::exact_topk policy) {
  gc::compressor c{gc::backend::cuda{}, x.size(), policy, gc::correct::none{},
                   gc::encode::index_value{.index = gc::index_coding::raw32}};
  auto g = device::copy_of(x);
  thrust::device_vector<std::byte> out(c.max_message_bytes());
  const auto m = c.compress(device::span_of(g), device::span_of(out));
  return gc::decode(gc::backend::cuda{}, m.bytes()).indices;
}

}  // namespace

// Every density on every shape at every size on a GPU. On the emulated device ten
// million elements took nine tenths of this test's time (2026-12-01): there each shape
// runs one of the densities in turn at that size, so that every shape and every density
// still run at it.
TEST_CASE("cuda exact_topk equals a sort on every conformance shape") {
  const double densities[] = {0.001, 0.01, 0.3, 1.0};
  for (std::size_t s = 0; s != std::size(inputs::all_shapes); ++s) {
    const auto shape = inputs::all_shapes[s];
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{7}, std::size_t{1000}, (std::size_t{1} << 20) + 3, std::size_t{10'000'000}}) {
      const auto x = inputs::make(shape, n, 11);
      for (std::size_t i = 0; i != std::size(densities); ++i) {
        if (n == 10'000'000 && device::emulated && i != s % std::size(densities)) continue;
        const double d = densities[i];
        CAPTURE(inputs::name(shape));
        CAPTURE(n);
        CAPTURE(d);
        const gc::select::exact_topk policy{.density = d};
        CHECK(device_topk(x, policy) == reference::top_k(x, policy.k(n)));
      }
    }
  }
}

// One block sorts the chosen indices up to 8,192 of them, CUB's device sort above: k on
// both sides, n a power of two (the padding's extra bit) and not.
TEST_CASE("cuda exact_topk's sort of the chosen indices on both sides of one block's room") {
  for (const auto shape : {inputs::shape::normal, inputs::shape::ties}) {
    for (const std::size_t n : {std::size_t{1} << 20, (std::size_t{1} << 20) + 3}) {
      const auto x = inputs::make(shape, n, 5);
      for (const std::size_t k : {std::size_t{8191}, std::size_t{8192}, std::size_t{8193}}) {
        CAPTURE(inputs::name(shape));
        CAPTURE(n);
        CAPTURE(k);
        CHECK(device_topk(x, {.count = k}) == reference::top_k(x, k));
      }
    }
  }
}

TEST_CASE("cuda exact_topk rejects a NaN or an infinity anywhere") {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{4095}, std::size_t{99'999}}) {
      auto x = inputs::make(inputs::shape::normal, 100'000, 3);
      x[at] = bad;
      CHECK_THROWS_AS(device_topk(x, {.density = 0.01}), gc::error);
    }
  }
}

int main(int argc, char** argv) { return device::run_tests(argc, argv); }
