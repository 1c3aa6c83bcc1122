// Selection throughput: every selector on N float32 at two densities, next to the
// baselines users reach for (nth_element, partial_sort, a heap, torch.topk) and the
// streaming read of the gradient, all measured in the same run.
//
// Selectors run standalone (the selection step given acc = g, as with correct::none),
// so each does its own passes over memory; inside a compressor the first pass is fused
// into the corrector's (see pipeline.cpp).
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <numeric>
#include <queue>

#include "bench_common.hpp"

#if GRADCOMP_BENCH_TORCH
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "support/engine_stages.hpp"
#endif

namespace gc = gradcomp;

namespace {

std::size_t n_of(const benchmark::State& s) { return static_cast<std::size_t>(s.range(0)); }
double density_of(const benchmark::State& s) { return static_cast<double>(s.range(1)) * 1e-4; }
std::size_t k_of(const benchmark::State& s) { return gc::select::exact_topk{.density = density_of(s)}.k(n_of(s)); }

void account(benchmark::State& state, std::size_t sent) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) * 4);
  state.counters["sent"] = static_cast<double>(sent);
}

// One selector engine, standalone: select() runs all of its passes.
template <class Policy>
void run_selector(benchmark::State& state, const Policy& policy) {
  const auto& g = bench::gradient(n_of(state));
  const gc::backend::host host{};
  gc::detail::engine_for<Policy, gc::backend::host> engine(host, policy, g.size());
  std::vector<std::uint32_t> out(policy.max_selected(g.size()));
  std::uint64_t step = 0;
  std::size_t sent = 0;
  for (auto _ : state) {
    sent = support::select_now(engine, host, policy, {g, g, step++}, out).count;
    benchmark::DoNotOptimize(out.data());
  }
  account(state, sent);
}

void BM_exact_topk(benchmark::State& s) { run_selector(s, gc::select::exact_topk{.density = density_of(s)}); }
void BM_sampled_threshold(benchmark::State& s) {
  run_selector(s, gc::select::sampled_threshold{.density = density_of(s)});
}
void BM_sampled_threshold_reuse(benchmark::State& s) {
  // Steady state of reuse_threshold: last step's threshold is kept (accept()).
  const auto& g = bench::gradient(n_of(s));
  const gc::select::sampled_threshold policy{.density = density_of(s), .reuse_threshold = true};
  const gc::backend::host host{};
  gc::detail::engine_for<gc::select::sampled_threshold, gc::backend::host> engine(host, policy, g.size());
  std::vector<std::uint32_t> out(policy.max_selected(g.size()));
  std::uint64_t step = 0;
  std::size_t sent = 0;
  for (auto _ : s) {
    sent = support::select_now(engine, host, policy, {g, g, step++}, out).count;
    engine.accept();
  }
  account(s, sent);
}
void BM_chunk_local(benchmark::State& s) { run_selector(s, gc::select::chunk_local{.bin = 50}); }
void BM_random_k(benchmark::State& s) { run_selector(s, gc::select::random_k{.density = density_of(s)}); }
void BM_threshold(benchmark::State& s) {
  // tau at the k-th magnitude, so it sends what the others send.
  const auto& g = bench::gradient(n_of(s));
  std::vector<float> a(g.size());
  std::transform(g.begin(), g.end(), a.begin(), [](float x) { return std::fabs(x); });
  const std::size_t k = k_of(s);
  std::nth_element(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(k - 1), a.end(), std::greater<>());
  run_selector(s, gc::select::threshold{.tau = a[k - 1]});
}

// -- baselines -------------------------------------------------------------------------

// What a user writes without gradcomp: copy magnitudes, nth_element for the threshold,
// then a compaction pass (ties broken by index, as exact_topk does).
void BM_nth_element(benchmark::State& state) {
  const auto& g = bench::gradient(n_of(state));
  const std::size_t k = k_of(state);
  std::vector<float> a(g.size());
  std::vector<std::uint32_t> out(k);
  for (auto _ : state) {
    std::transform(g.begin(), g.end(), a.begin(), [](float x) { return std::fabs(x); });
    std::nth_element(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(k - 1), a.end(), std::greater<>());
    const float t = a[k - 1];
    std::size_t above = 0;
    for (const float x : g) above += std::fabs(x) > t ? 1 : 0;
    std::size_t ties = k - above, w = 0;
    for (std::uint32_t i = 0; i < g.size() && w < k; ++i) {
      const float m = std::fabs(g[i]);
      if (m > t || (m == t && ties > 0)) {
        ties -= m == t ? 1 : 0;
        out[w++] = i;
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  account(state, k);
}

void BM_partial_sort(benchmark::State& state) {
  const auto& g = bench::gradient(n_of(state));
  const std::size_t k = k_of(state);
  std::vector<std::uint32_t> order(g.size());
  for (auto _ : state) {
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](std::uint32_t a, std::uint32_t b) {
                        const float fa = std::fabs(g[a]), fb = std::fabs(g[b]);
                        return fa != fb ? fa > fb : a < b;
                      });
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
    benchmark::DoNotOptimize(order.data());
  }
  account(state, k);
}

void BM_heap_topk(benchmark::State& state) {
  const auto& g = bench::gradient(n_of(state));
  const std::size_t k = k_of(state);
  using entry = std::pair<float, std::uint32_t>;  // min-heap on (|g|, -index)
  auto worse = [](const entry& a, const entry& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::vector<entry> heap;
  std::vector<std::uint32_t> out(k);
  for (auto _ : state) {
    heap.clear();
    for (std::uint32_t i = 0; i < g.size(); ++i) {
      const entry e{std::fabs(g[i]), i};
      if (heap.size() < k) {
        heap.push_back(e);
        std::push_heap(heap.begin(), heap.end(), worse);
      } else if (worse(e, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), worse);
        heap.back() = e;
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
    for (std::size_t j = 0; j < k; ++j) out[j] = heap[j].second;
    std::sort(out.begin(), out.end());
    benchmark::DoNotOptimize(out.data());
  }
  account(state, k);
}

#if GRADCOMP_BENCH_TORCH
void BM_torch_topk(benchmark::State& state) {
  const auto& g = bench::gradient(n_of(state));
  const std::size_t k = k_of(state);
  at::set_num_threads(omp_get_max_threads());
  const torch::Tensor t =
      torch::from_blob(const_cast<float*>(g.data()), {static_cast<std::int64_t>(g.size())}, torch::kFloat32);
  for (auto _ : state) {
    auto [values, indices] = torch::topk(t.abs(), static_cast<std::int64_t>(k));
    benchmark::DoNotOptimize(indices.data_ptr());
  }
  account(state, k);
}
#endif

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t n : {1'000'000, 10'000'000, 25'000'000, 100'000'000}) {
    for (const std::int64_t d : {10, 100}) b->Args({n, d});  // density in units of 1e-4
  }
  b->ArgNames({"N", "d_1e4"})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
}

void read_sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t n : {1'000'000, 10'000'000, 25'000'000, 100'000'000}) b->Arg(n);
  b->ArgName("N")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
}

}  // namespace

BENCHMARK(bench::BM_read)->Name("read")->Apply(read_sizes);
BENCHMARK(BM_nth_element)->Name("nth_element")->Apply(sizes);
BENCHMARK(BM_partial_sort)->Name("partial_sort")->Apply(sizes);
BENCHMARK(BM_heap_topk)->Name("heap_topk")->Apply(sizes);
#if GRADCOMP_BENCH_TORCH
BENCHMARK(BM_torch_topk)->Name("torch_topk")->Apply(sizes);
#endif
BENCHMARK(BM_exact_topk)->Name("exact_topk")->Apply(sizes);
BENCHMARK(BM_sampled_threshold)->Name("sampled_threshold")->Apply(sizes);
BENCHMARK(BM_sampled_threshold_reuse)->Name("sampled_threshold_reuse")->Apply(sizes);
BENCHMARK(BM_chunk_local)->Name("chunk_local")->Apply(sizes);
BENCHMARK(BM_random_k)->Name("random_k")->Apply(sizes);
BENCHMARK(BM_threshold)->Name("threshold")->Apply(sizes);

int main(int argc, char** argv) { return bench::run_main(argc, argv, "nth_element"); }
