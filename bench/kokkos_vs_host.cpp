// backend::kokkos<Serial> against backend::host with one thread: every selector on
// N = 2.5e7 float32 at density 0.001, standalone (the selection given acc = g).
// Family "host" is the baseline: "speed-up vs host" below 1 means Kokkos is slower.
#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/gradcomp.hpp>

#include "bench_common.hpp"

namespace gc = gradcomp;

namespace {

constexpr std::int64_t n = 25'000'000;
constexpr double density = 0.001;
const char* const selectors[] = {"exact_topk", "sampled_threshold", "chunk_local", "random_k", "threshold"};

template <class Backend, class Policy>
void run(benchmark::State& state, const Backend& be, const Policy& policy) {
  const auto& g = bench::gradient(n);
  gc::detail::engine<Policy, Backend> engine(be, policy, g.size());
  auto out = be.template allocate<std::uint32_t>(policy.max_selected(g.size()));
  std::uint64_t step = 0;
  std::size_t sent = 0;
  for (auto _ : state) {
    sent = engine.select(policy, {g, g, step++}, std::span<std::uint32_t>(out.data(), out.size())).count;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * n * 4);
  state.counters["sent"] = static_cast<double>(sent);
}

template <class Backend>
void BM_backend(benchmark::State& state, const Backend& be) {
  state.SetLabel(selectors[state.range(0)]);
  switch (state.range(0)) {
    case 0: return run(state, be, gc::select::exact_topk{.density = density});
    case 1: return run(state, be, gc::select::sampled_threshold{.density = density});
    case 2: return run(state, be, gc::select::chunk_local{.bin = 50});
    case 3: return run(state, be, gc::select::random_k{.density = density});
    default: {
      const auto& g = bench::gradient(n);  // tau at the k-th magnitude
      std::vector<float> a(g.size());
      std::transform(g.begin(), g.end(), a.begin(), [](float x) { return std::fabs(x); });
      const auto k = static_cast<std::size_t>(density * n);
      std::nth_element(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(k - 1), a.end(), std::greater<>());
      return run(state, be, gc::select::threshold{.tau = a[k - 1]});
    }
  }
}

void BM_host(benchmark::State& s) { BM_backend(s, gc::backend::host{.threads = 1}); }
void BM_kokkos(benchmark::State& s) { BM_backend(s, gc::backend::kokkos<Kokkos::Serial>{}); }

}  // namespace

BENCHMARK(bench::BM_read)->Name("read")->Arg(n)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_host)->Name("host")->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
BENCHMARK(BM_kokkos)->Name("kokkos")->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  return bench::run_main(argc, argv, "host");
}
