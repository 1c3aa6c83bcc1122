// backend::kokkos<Serial> against backend::host with one thread on N = 2.5e7 float32:
// every selector at density 0.001, standalone (the selection given acc = g), args 0-4;
// and a corrector's step (update, commit of every 1000th entry, accept), args 5-6, for
// which family "generic" runs the generic algorithm (detail/correct/elementwise.hpp) on
// backend::host: what backend::host's fused fast path gains over it.
// Family "host" is the baseline: "speed-up vs host" below 1 means slower than the host.
#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/gradcomp.hpp>

#include "support/engine_stages.hpp"

#include "bench_common.hpp"

namespace gc = gradcomp;

namespace {

constexpr std::int64_t n = 25'000'000;
constexpr double density = 0.001;
const char* const selectors[] = {"exact_topk", "sampled_threshold", "chunk_local", "random_k", "threshold"};

template <class Backend, class Policy>
void run(benchmark::State& state, const Backend& be, const Policy& policy) {
  const auto& g = bench::gradient(n);
  gc::detail::engine_for<Policy, Backend> engine(be, policy, g.size());
  auto out = be.template allocate<std::uint32_t>(policy.max_selected(g.size()));
  std::uint64_t step = 0;
  std::size_t sent = 0;
  for (auto _ : state) {
    sent =
        support::select_now(engine, be, policy, {g, g, step++}, std::span<std::uint32_t>(out.data(), out.size())).count;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * n * 4);
  state.counters["sent"] = static_cast<double>(sent);
}

// One corrector step per iteration: update from g, commit every 1000th entry, accept.
template <class Engine, class Backend, class Policy>
void run_corrector(benchmark::State& state, Engine& engine, const Backend& be, const Policy& policy) {
  const auto& g = bench::gradient(n);
  std::vector<std::uint32_t> index;
  for (std::uint32_t i = 0; i < n; i += 1000) index.push_back(i);
  const std::vector<float> sent(index.size(), 0.25f);
  for (auto _ : state) {
    const bool finite = support::update_now(engine, be, policy, g);
    support::commit_now(engine, be, policy, index, sent);
    engine.accept();
    benchmark::DoNotOptimize(finite);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * n * 4);
}

// error_feedback (arg 5), and DGC's chain of clip_norm and momentum (arg 6).
template <template <class, class> class Engine, class Backend>
void BM_corrector(benchmark::State& state, const Backend& be) {
  const auto& g = bench::gradient(n);
  if (state.range(0) == 5) {
    state.SetLabel("error_feedback");
    const gc::correct::error_feedback policy{};
    Engine<gc::correct::error_feedback, Backend> engine(be, policy, g.size());
    return run_corrector(state, engine, be, policy);
  }
  state.SetLabel("chain{clip_norm, momentum}");
  const gc::correct::chain policy{gc::correct::clip_norm{.max_norm = 1.0f}, gc::correct::momentum{}};
  Engine<std::remove_const_t<decltype(policy)>, Backend> engine(be, policy, g.size());
  run_corrector(state, engine, be, policy);
}

template <class Backend>
void BM_backend(benchmark::State& state, const Backend& be) {
  if (state.range(0) >= 5) return BM_corrector<gc::detail::engine_for>(state, be);
  state.SetLabel(selectors[state.range(0)]);
  switch (state.range(0)) {
    case 0:
      return run(state, be, gc::select::exact_topk{.density = density});
    case 1:
      return run(state, be, gc::select::sampled_threshold{.density = density});
    case 2:
      return run(state, be, gc::select::chunk_local{.bin = 50});
    case 3:
      return run(state, be, gc::select::random_k{.density = density});
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
void BM_generic(benchmark::State& s) {
  BM_corrector<gc::detail::elementwise_correction>(s, gc::backend::host{.threads = 1});
}

}  // namespace

BENCHMARK(bench::BM_read)->Name("read")->Arg(n)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_host)->Name("host")->DenseRange(0, 6)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
BENCHMARK(BM_kokkos)->Name("kokkos")->DenseRange(0, 6)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
BENCHMARK(BM_generic)->Name("generic")->DenseRange(5, 6)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  return bench::run_main(argc, argv, "host");
}
