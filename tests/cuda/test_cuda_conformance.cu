// The conformance grid (support/conformance.hpp) on backend::cuda: the same selector x
// corrector x value coding list as on the host and Kokkos, against the same reference.
// Needs a GPU (exit 77 without one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// The first `count` entries of `out`.
std::vector<std::uint32_t> first_of(const thrust::device_vector<std::uint32_t>& out, std::uint32_t count) {
  auto indices = device::host_copy(out);
  REQUIRE(count <= indices.size());
  indices.resize(count);
  return indices;
}

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
  return first_of(out, device::host_copy(status)[0].count);
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
    if (n > device::largest_size) continue;
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

namespace {

// Keeps the i whose hash is a multiple of k (k = 1: every i).
struct every_kth_hash {
  std::uint64_t k;
  __host__ __device__ bool operator()(std::size_t i) const { return (i * 2654435761ull + 7) % k == 0; }
};

// The ascending i < n that `keep` keeps, by backend::cuda::compact (as many as the
// count it wrote; nothing written past them).
// `workspace`: one for n, or a larger one a call before left as it was.
template <class Keep>
std::vector<std::uint32_t> compacted(const gradcomp::backend::cuda& be, std::size_t n, const Keep& keep,
                                     thrust::device_vector<std::byte>* workspace = nullptr) {
  thrust::device_vector<std::uint32_t> out(n, 0xFFFFFFFFu);
  thrust::device_vector<std::uint32_t> count(1, 0xDEADu);
  thrust::device_vector<std::byte> own;
  if (workspace == nullptr) {
    own.resize(be.template compact_workspace<Keep>(n));
    workspace = &own;
  }
  be.compact(n, keep, thrust::raw_pointer_cast(out.data()), device::raw_span_of(*workspace),
             thrust::raw_pointer_cast(count.data()));
  const std::uint32_t kept = device::host_copy(count)[0];
  const auto all = device::host_copy(out);  // filled with 0xFFFFFFFF: nothing written past the kept
  CHECK(std::all_of(all.begin() + std::min<std::size_t>(kept, n), all.end(),
                    [](std::uint32_t i) { return i == 0xFFFFFFFFu; }));
  return first_of(out, kept);
}

}  // namespace

// compact marks each kept index as a bit (a warp's ballot per 32 indices, eight runs of
// 32 per round, rounds grid-stride past about 2 M indices on an H100) and expands the
// words: sizes around a word, a warp's round and a block's, and past one grid's round.
TEST_CASE("cuda: compact keeps exactly what a host loop keeps, ascending") {
  namespace gc = gradcomp;
  const gc::backend::cuda be{};
  // One workspace for the largest n, dirty to begin with, reused at every size after
  // (sparse_allreduce compacts regions of several sizes in one workspace).
  const std::size_t largest = std::min<std::size_t>(device::largest_size, 10'000'001);
  thrust::device_vector<std::byte> reused(be.compact_workspace<every_kth_hash>(largest), std::byte{0xFF});
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{255}, std::size_t{256},
        std::size_t{257}, std::size_t{2049}, std::size_t{70003}, (std::size_t{1} << 20) + 3, std::size_t{10'000'001}}) {
    if (n > largest) continue;
    CAPTURE(n);
    for (const std::uint64_t k : {std::uint64_t{1}, std::uint64_t{3}, std::uint64_t{1000}, std::uint64_t{1} << 40}) {
      CAPTURE(k);
      const every_kth_hash keep{k};
      std::vector<std::uint32_t> expected;
      for (std::size_t i = 0; i < n; ++i) {
        if (keep(i)) expected.push_back(static_cast<std::uint32_t>(i));
      }
      REQUIRE(compacted(be, n, keep) == expected);
      REQUIRE(compacted(be, n, keep, &reused) == expected);
    }
    const auto x = inputs::make(inputs::shape::log_normal, n, 77);
    auto acc = device::copy_of(x);
    const float tau = 1.5f;
    std::vector<std::uint32_t> expected;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::fabs(x[i]) >= tau) expected.push_back(static_cast<std::uint32_t>(i));
    }
    const gc::detail::magnitude_at_least keep{thrust::raw_pointer_cast(acc.data()), gc::detail::magnitude_key(tau)};
    REQUIRE(compacted(be, n, keep) == expected);
  }
}

int main(int argc, char** argv) { return device::run_tests(argc, argv); }
