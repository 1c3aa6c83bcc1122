// backend::cuda's exact_topk against backend::host's and against a sort, on the
// conformance inputs. Needs a GPU: without one it exits 77, which ctest reports as
// skipped (the CPU-only CI compiles it and skips it).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "../support/inputs.hpp"
#include "../support/reference.hpp"

namespace gc = gradcomp;

namespace {

// The indices host's exact_topk sends for x.
std::vector<std::uint32_t> host_topk(const std::vector<float>& x, gc::select::exact_topk policy) {
  gc::compressor c{gc::backend::host{}, x.size(), policy};
  std::vector<std::byte> buf(c.max_message_bytes());
  return gc::decode(c.compress(x, buf).bytes()).indices;
}

struct device_run {
  std::vector<std::uint32_t> indices;
  bool finite;
};

device_run device_topk(const std::vector<float>& x, gc::select::exact_topk policy) {
  const gc::backend::cuda be{};
  gc::detail::device_buffer<float> acc(x.size());
  gc::detail::cuda_check(cudaMemcpy(acc.data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), "copy");
  const std::size_t k = policy.k(x.size());
  gc::detail::device_buffer<std::uint32_t> out(k);
  gc::detail::engine<gc::select::exact_topk, gc::backend::cuda> engine(be, policy, x.size());
  const std::span<const float> acc_span(acc.data(), x.size());
  const auto chosen = engine.select(policy, {acc_span, acc_span, 0}, std::span<std::uint32_t>(out.data(), k));
  device_run r{std::vector<std::uint32_t>(chosen.count), chosen.finite};
  gc::detail::cuda_check(cudaMemcpy(r.indices.data(), out.data(), chosen.count * sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost),
                         "copy back");
  return r;
}

}  // namespace

TEST_CASE("cuda exact_topk equals host exact_topk and a sort on every conformance shape") {
  for (const auto shape : {inputs::shape::normal, inputs::shape::student_t3, inputs::shape::log_normal,
                           inputs::shape::ties, inputs::shape::all_zero, inputs::shape::tiny_and_signed_zero,
                           inputs::shape::sparse_spikes}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, (std::size_t{1} << 20) + 3,
                                std::size_t{10'000'000}}) {
      const auto x = inputs::make(shape, n, 11);
      for (const double d : {0.001, 0.01, 0.3, 1.0}) {
        CAPTURE(inputs::name(shape));
        CAPTURE(n);
        CAPTURE(d);
        const gc::select::exact_topk policy{.density = d};
        const auto got = device_topk(x, policy);
        CHECK(got.finite);
        CHECK(got.indices == host_topk(x, policy));
        if (n <= (std::size_t{1} << 20) + 3) CHECK(got.indices == reference::top_k(x, policy.k(n)));
      }
    }
  }
}

TEST_CASE("cuda exact_topk flags a NaN or an infinity anywhere") {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{4095}, std::size_t{99'999}}) {
      auto x = inputs::make(inputs::shape::normal, 100'000, 3);
      x[at] = bad;
      CHECK_FALSE(device_topk(x, {.density = 0.01}).finite);
    }
  }
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
