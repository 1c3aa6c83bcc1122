// GPU benchmarks of backend::cuda, timed with CUDA events (manual time): the compressor's
// step with exact_topk, threshold and sampled_threshold selection, chunk_local behind error
// feedback, top-k with error feedback, the full DGC step (clip + momentum + exact_topk +
// encode), the last two also queued as the DDP hook queues a bucket's step; the selection
// alone by the exact_topk and chunk_local fast paths and by their generic algorithms; and
// in the same run the bound (a device-to-device streaming read of the gradient) and a
// baseline (top-k by a CUB radix sort of all |g| with their indices). N = 6.5 M (a 25 MB
// DDP bucket), 10^7, 10^8 and 10^9 float32, density 0.001 and 0.01. Without a GPU the
// program exits 77 (skipped).
#include <benchmark/benchmark.h>
#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/gradcomp.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <thrust/device_vector.h>
#include <thrust/sequence.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>

namespace gc = gradcomp;

namespace {

// Gradient-like values, made on the device from a counter-based hash: a normal times a
// log-normal scale (sigma 1.5), as the host suites use.
__device__ double unit(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53;
}

__global__ void fill_gradient(float* g, std::uint64_t n) {
  gc::detail::cuda_launch::grid_stride(n, [&](std::uint64_t i) {
    const double z1 = sqrt(-2.0 * log(unit(4 * i))) * cos(6.283185307179586 * unit(4 * i + 1));
    const double z2 = sqrt(-2.0 * log(unit(4 * i + 2))) * cos(6.283185307179586 * unit(4 * i + 3));
    g[i] = static_cast<float>(1e-3 * z1 * exp(1.5 * z2));
  });
}

const thrust::device_vector<float>& gradient(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<thrust::device_vector<float>>> cache;
  auto& slot = cache[n];
  if (!slot) {
    slot = std::make_unique<thrust::device_vector<float>>(n);
    fill_gradient<<<gc::detail::cuda_launch::grid_for(n), 256>>>(thrust::raw_pointer_cast(slot->data()), n);
    gc::detail::cuda_check(cudaDeviceSynchronize(), "fill_gradient");
  }
  return *slot;
}

gc::device_span<const float> span_of(const thrust::device_vector<float>& v) {
  return {thrust::raw_pointer_cast(v.data()), v.size()};
}

// The bound: every float read once, 16 bytes per load, summed so nothing is dropped.
__global__ void streaming_read(const float4* x, std::uint64_t n4, float* sink) {
  float sum = 0.0f;
  gc::detail::cuda_launch::grid_stride(n4, [&](std::uint64_t i) {
    const float4 v = x[i];
    sum += (v.x + v.y) + (v.z + v.w);
  });
  if (sum == 1.2345f) *sink = sum;  // practically never: keeps the loads
}

// Times `body` (queued on the default stream) with CUDA events: `batch` calls between two
// events, each iteration's time their mean (batch 1: one call alone, the device idle
// while the host launches what a call that reads back launches after its read).
template <class Body>
void timed(benchmark::State& state, std::size_t n, Body&& body, int batch = 1) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  body();  // warm-up
  for (auto _ : state) {
    cudaEventRecord(start);
    for (int b = 0; b < batch; ++b) body();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / batch);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n * sizeof(float)));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

std::size_t size_arg(const benchmark::State& state) { return static_cast<std::size_t>(state.range(0)); }
double density_arg(const benchmark::State& state) { return 1.0 / static_cast<double>(state.range(1)); }

void read(benchmark::State& state) {
  const std::size_t n = size_arg(state);
  const auto& g = gradient(n);
  thrust::device_vector<float> sink(1);
  timed(state, n, [&] {
    streaming_read<<<gc::detail::cuda_launch::grid_for(n / 4), 256>>>(
        reinterpret_cast<const float4*>(thrust::raw_pointer_cast(g.data())), n / 4,
        thrust::raw_pointer_cast(sink.data()));
  });
}

// How a benchmark runs the compressor's step.
enum class step_mode {
  compressed,  // compress(): the step, then its status read back (one call alone)
  queued,      // stage_queued() and the commit queued after it, nothing read back, as the
               // DDP hook queues a bucket's step: eight in a row, launches overlapping
               // the work queued before them
};

template <class Selector, class Corrector>
void compress(benchmark::State& state, Selector selector, Corrector corrector, step_mode mode = step_mode::compressed) {
  const std::size_t n = size_arg(state);
  const auto& g = gradient(n);
  gc::compressor c{gc::backend::cuda{}, n, selector, corrector,
                   gc::encode::index_value{.index = gc::index_coding::raw32}};
  thrust::device_vector<std::byte> out(c.max_message_bytes());
  gc::device_span<std::byte> out_span(thrust::raw_pointer_cast(out.data()), out.size());
  std::size_t count = 0;
  if (mode == step_mode::compressed) {
    timed(state, n, [&] { count = c.compress(span_of(g), out_span).count(); });
  } else {
    const gc::backend::cuda on = c.backend();
    timed(
        state, n,
        [&] {
          (void)c.stage_queued(on, span_of(g), out_span);
          c.accept_staged(on);
        },
        8);
    (void)c.stage_queued(on, span_of(g), out_span);
    count = c.staged_message(on, span_of(g), out_span).count();
    c.accept_staged(on);
  }
  state.counters["selected"] = static_cast<double>(count);
}

void exact_topk(benchmark::State& state) {
  compress(state, gc::select::exact_topk{.density = density_arg(state)}, gc::correct::none{});
}

void threshold(benchmark::State& state) {
  // tau near the (1 - d) quantile of |g| for this data, found once on the host.
  const std::size_t n = size_arg(state);
  const auto& g = gradient(n);
  std::vector<float> sample(std::min<std::size_t>(n, 1'000'000));
  cudaMemcpy(sample.data(), thrust::raw_pointer_cast(g.data()), sample.size() * sizeof(float), cudaMemcpyDeviceToHost);
  for (auto& v : sample) v = std::fabs(v);
  const auto at = static_cast<std::size_t>((1.0 - density_arg(state)) * static_cast<double>(sample.size()));
  std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(at), sample.end());
  compress(state, gc::select::threshold{.tau = sample[at]}, gc::correct::none{});
}

void sampled_threshold(benchmark::State& state) {
  compress(state, gc::select::sampled_threshold{.density = density_arg(state)}, gc::correct::none{});
}

// AdaComp's selection behind its error feedback (the selection rides on acc and g).
void chunk_local(benchmark::State& state) { compress(state, gc::select::chunk_local{}, gc::correct::error_feedback{}); }

// Top-k with error feedback: the step of the DDP hook's default method.
void topk_ef(benchmark::State& state, step_mode mode) {
  compress(state, gc::select::exact_topk{.density = density_arg(state)}, gc::correct::error_feedback{}, mode);
}
void topk_ef_step(benchmark::State& state) { topk_ef(state, step_mode::compressed); }
void topk_ef_step_queued(benchmark::State& state) { topk_ef(state, step_mode::queued); }

void dgc(benchmark::State& state, step_mode mode) {
  compress(state, gc::select::exact_topk{.density = density_arg(state)},
           gc::correct::chain{gc::correct::clip_norm{.max_norm = 1.0f}, gc::correct::momentum{.beta = 0.9f}}, mode);
}
void dgc_step(benchmark::State& state) { dgc(state, step_mode::compressed); }
void dgc_step_queued(benchmark::State& state) { dgc(state, step_mode::queued); }

// The selection alone, by backend::cuda's fast path (detail::fast_engine<S, cuda>: the fused
// radix select, chunk_local's tiled pass) and by the generic algorithm over the backend primitives
// (detail/select/<name>.hpp), on the same acc: a fast path stays only where it pays
// (docs/design.md), and tests/cuda/test_cuda_conformance.cu proves both select alike.
template <class Engine, class Policy>
void select_only(benchmark::State& state, const Policy& policy) {
  const std::size_t n = size_arg(state);
  const auto& g = gradient(n);
  const gc::backend::cuda be{};
  Engine engine(be, policy, n);
  thrust::device_vector<std::uint32_t> index(policy.max_selected(n));
  thrust::device_vector<gc::detail::step_status> status(1);
  const std::span<const float> acc(thrust::raw_pointer_cast(g.data()), n);
  const std::span<std::uint32_t> out(thrust::raw_pointer_cast(index.data()), index.size());
  timed(state, n, [&] { engine.select(be, policy, {acc, acc, 0}, out, thrust::raw_pointer_cast(status.data())); });
  gc::detail::step_status last{};
  cudaMemcpy(&last, thrust::raw_pointer_cast(status.data()), sizeof(last), cudaMemcpyDeviceToHost);
  state.counters["selected"] = static_cast<double>(last.count);
}

void exact_topk_fast(benchmark::State& state) {
  using engine = gc::detail::fast_engine<gc::select::exact_topk, gc::backend::cuda>;
  select_only<engine>(state, gc::select::exact_topk{.density = density_arg(state)});
}
void exact_topk_generic(benchmark::State& state) {
  using engine = gc::detail::exact_topk_selection<gc::backend::cuda>;
  select_only<engine>(state, gc::select::exact_topk{.density = density_arg(state)});
}
// chunk_local has no density: its bin is 1 / density (50 in AdaComp's paper).
void chunk_local_fast(benchmark::State& state) {
  using engine = gc::detail::fast_engine<gc::select::chunk_local, gc::backend::cuda>;
  select_only<engine>(state, gc::select::chunk_local{.bin = static_cast<std::size_t>(state.range(1))});
}
void chunk_local_generic(benchmark::State& state) {
  using engine = gc::detail::chunk_local_selection<gc::backend::cuda>;
  select_only<engine>(state, gc::select::chunk_local{.bin = static_cast<std::size_t>(state.range(1))});
}

__global__ void magnitude_keys(const float* g, std::uint32_t* keys, std::uint64_t n) {
  gc::detail::cuda_launch::grid_stride(n, [&](std::uint64_t i) { keys[i] = __float_as_uint(g[i]) & 0x7FFFFFFFu; });
}

// Baseline: sort all (|g| key, index) pairs descending with CUB; the first k are the top k.
void cub_sort_topk(benchmark::State& state) {
  const std::size_t n = size_arg(state);
  const auto& g = gradient(n);
  thrust::device_vector<std::uint32_t> keys(n), keys_out(n), index(n), index_out(n);
  thrust::sequence(index.begin(), index.end());
  std::size_t bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, thrust::raw_pointer_cast(keys.data()), thrust::raw_pointer_cast(keys_out.data()),
      thrust::raw_pointer_cast(index.data()), thrust::raw_pointer_cast(index_out.data()), static_cast<std::int64_t>(n));
  thrust::device_vector<std::byte> scratch(bytes);
  timed(state, n, [&] {
    magnitude_keys<<<gc::detail::cuda_launch::grid_for(n), 256>>>(thrust::raw_pointer_cast(g.data()),
                                                                  thrust::raw_pointer_cast(keys.data()), n);
    std::size_t b = bytes;
    cub::DeviceRadixSort::SortPairsDescending(
        thrust::raw_pointer_cast(scratch.data()), b, thrust::raw_pointer_cast(keys.data()),
        thrust::raw_pointer_cast(keys_out.data()), thrust::raw_pointer_cast(index.data()),
        thrust::raw_pointer_cast(index_out.data()), static_cast<std::int64_t>(n));
  });
}

void sizes(benchmark::internal::Benchmark* b) {
  // 6.5 M floats: a DDP bucket of 25 MB.
  for (const std::int64_t n : {6'500'000LL, 10'000'000LL, 100'000'000LL, 1'000'000'000LL}) {
    for (const std::int64_t inverse_density : {1000, 100}) b->Args({n, inverse_density});
  }
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(read)->Apply(sizes);
BENCHMARK(exact_topk)->Apply(sizes);
BENCHMARK(threshold)->Apply(sizes);
BENCHMARK(sampled_threshold)->Apply(sizes);
BENCHMARK(chunk_local)->Apply(sizes);
BENCHMARK(topk_ef_step)->Apply(sizes);
BENCHMARK(dgc_step)->Apply(sizes);
BENCHMARK(topk_ef_step_queued)->Apply(sizes);
BENCHMARK(dgc_step_queued)->Apply(sizes);
BENCHMARK(cub_sort_topk)->Apply(sizes);
BENCHMARK(exact_topk_fast)->Apply(sizes);
BENCHMARK(exact_topk_generic)->Apply(sizes);
BENCHMARK(chunk_local_fast)->Apply(sizes);
BENCHMARK(chunk_local_generic)->Apply(sizes);

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
