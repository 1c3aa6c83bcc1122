// The conformance grid (support/conformance.hpp) on backend::cuda: the same selector x
// corrector x value coding list as on the host and Kokkos, against the same reference.
// Needs a GPU (exit 77 without one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/gradcomp.hpp>

#include <span>
#include <string>
#include <vector>

#include "../support/conformance.hpp"

namespace {

// Device memory: the test's vectors are copied in, the messages copied out.
struct target {
  static std::vector<gradcomp::backend::cuda> backends() { return {gradcomp::backend::cuda{}}; }
  static std::string name_of(const gradcomp::backend::cuda&) { return "cuda"; }
  template <class T>
  static thrust::device_vector<T> copy_of(const std::vector<T>& v) {
    return device::copy_of(v);
  }
  template <class T>
  static gradcomp::device_span<T> span(thrust::device_vector<T>& v) {
    return device::span_of(v);
  }
  static std::vector<std::byte> host_copy(gradcomp::device_span<const std::byte> bytes) {
    return device::host_copy(bytes);
  }
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("cuda: every selector x corrector x value coding matches its reference", Selector, grid) {
  conformance::run_grid_for_every_corrector<target, Selector>();
}
TEST_CASE_TEMPLATE_INVOKE(grid, GRADCOMP_CONFORMANCE_SELECTORS);

namespace {

// Runs one selector engine to the queued protocol on device copies of acc and g:
// the count from the status, and the indices.
template <class Engine, class Policy>
std::vector<std::uint32_t> queued_indices(Engine& engine, const gradcomp::backend::cuda& be, const Policy& policy,
                                          thrust::device_vector<float>& acc, thrust::device_vector<float>& g) {
  thrust::device_vector<std::uint32_t> out(acc.size(), 0xFFFFFFFFu);
  thrust::device_vector<gradcomp::detail::step_status> status(1);
  const auto a = device::raw_span_of(acc);
  engine.select(be, policy, {a, device::raw_span_of(g), 0}, device::raw_span_of(out),
                device::raw_span_of(status).data());
  const std::uint32_t count = device::host_copy(status)[0].count;
  auto indices = device::host_copy(out);
  REQUIRE(count <= indices.size());
  indices.resize(count);
  return indices;
}

}  // namespace

// backend::cuda's exact_topk (the device radix select) and chunk_local (a tiled pass that
// marks the hits, reduce-by-key for bins wider than a tile, then one compaction) are
// fast paths: each must select what the generic algorithm over the backend primitives
// (detail/select/<name>.hpp) selects on backend::cuda. chunk_local's bins: one entry,
// tiles whose edges split a word of the hits' bits (3, 50, 2,047), a bin of exactly a
// tile (2,048), the widest bins (past a tile), one bin of all n.
TEST_CASE("cuda: the exact_topk and chunk_local fast paths equal the generic algorithms on backend::cuda") {
  namespace gc = gradcomp;
  const gc::backend::cuda be{};
  for (const std::size_t n : {std::size_t{7}, std::size_t{1000}, std::size_t{70003}, std::size_t{300000}}) {
    for (std::size_t s = 0; s < std::size(inputs::all_shapes); ++s) {
      auto acc = device::copy_of(inputs::make(inputs::all_shapes[s], n, 2100 + s));
      auto g = device::copy_of(inputs::make(inputs::all_shapes[(s + 3) % std::size(inputs::all_shapes)], n, 2200 + s));
      CAPTURE(n);
      CAPTURE(inputs::name(inputs::all_shapes[s]));
      for (const std::size_t k : {std::size_t{1}, n / 1000 + 1, n / 7 + 1, n}) {
        const gc::select::exact_topk policy{.count = k};
        gc::detail::fast_engine<gc::select::exact_topk, gc::backend::cuda> fast(be, policy, n);
        gc::detail::exact_topk_selection<gc::backend::cuda> generic(be, policy, n);
        CAPTURE(k);
        REQUIRE(queued_indices(fast, be, policy, acc, acc) == queued_indices(generic, be, policy, acc, acc));
      }
      for (const std::size_t bin : {std::size_t{1}, std::size_t{3}, std::size_t{50}, std::size_t{2047},
                                    std::size_t{2048}, std::size_t{2049}, std::size_t{5000}, n}) {
        const gc::select::chunk_local policy{.bin = bin};
        gc::detail::fast_engine<gc::select::chunk_local, gc::backend::cuda> fast(be, policy, n);
        gc::detail::chunk_local_selection<gc::backend::cuda> generic(be, policy, n);
        CAPTURE(bin);
        REQUIRE(queued_indices(fast, be, policy, acc, g) == queued_indices(generic, be, policy, acc, g));
      }
    }
  }
}

int main(int argc, char** argv) { return device::run_tests(argc, argv); }
