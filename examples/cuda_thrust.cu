// DGC on the GPU without a copy: gradients in a thrust::device_vector are compressed by
// backend::cuda (clip, momentum correction, exact top-k), the messages stay in device
// memory, and a device tensor accumulates them. Device memory is passed as a
// gc::device_span, which says where it lives: a PyTorch CUDA tensor works the same way,
// gc::device_span<const float>(t.data_ptr<float>(), t.numel()), with the tensor's
// current stream in backend::cuda{stream}. The messages are gc::device_messages, which
// the host's decode() refuses at compile time.
//
//   ./example_cuda_thrust            (exits 77 without a GPU)
#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/device_messages.cuh>
#include <gradcomp/gradcomp.hpp>

#include <thrust/device_vector.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>
#include <thrust/transform.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace gc = gradcomp;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  constexpr std::size_t n = 10'000'000;
  constexpr int workers = 4;  // simulated: each adds its message to the aggregate
  constexpr int steps = 5;

  std::vector<
      gc::compressor<gc::backend::cuda, gc::select::exact_topk,
                     gc::correct::chain<gc::correct::clip_norm, gc::correct::momentum>, gc::encode::index_value>>
      worker;
  for (int w = 0; w < workers; ++w) {
    worker.emplace_back(gc::backend::cuda{}, n, gc::select::exact_topk{.density = 0.001},
                        gc::correct::chain{gc::correct::clip_norm{.max_norm = 5.0f, .workers = workers},
                                           gc::correct::momentum{.beta = 0.9f}},
                        gc::encode::index_value{.index = gc::index_coding::raw32});
  }
  thrust::device_vector<float> grad(n);
  thrust::device_vector<float> aggregate(n, 0.0f);
  thrust::device_vector<std::byte> message(worker[0].max_message_bytes());
  const gc::device_span<float> aggregate_span(thrust::raw_pointer_cast(aggregate.data()), n);

  for (int step = 0; step < steps; ++step) {
    std::size_t bytes = 0;
    for (int w = 0; w < workers; ++w) {
      // A worker's gradient: a smooth signal plus worker- and step-dependent noise.
      const float phase = 0.1f * static_cast<float>(step * workers + w);
      thrust::transform(thrust::counting_iterator<std::uint32_t>(0), thrust::counting_iterator<std::uint32_t>(n),
                        grad.begin(), [phase] __device__(std::uint32_t i) -> float {
                          const float x = static_cast<float>(i) * 1e-5f;
                          return 1e-3f * sinf(x + phase) + 1e-4f * cosf(37.0f * x * (1.0f + phase));
                        });
      const gc::device_message m = worker[static_cast<std::size_t>(w)].compress(
          gc::device_span<const float>(thrust::raw_pointer_cast(grad.data()), n),
          gc::device_span<std::byte>(thrust::raw_pointer_cast(message.data()), message.size()));
      gc::accumulate(gc::backend::cuda{}, m.bytes(), aggregate_span, 1.0f / workers);
      bytes += m.bytes().size();
    }
    const float norm = std::sqrt(thrust::transform_reduce(
        aggregate.begin(), aggregate.end(), [] __device__(float v) -> float { return v * v; }, 0.0f,
        thrust::plus<float>()));
    std::printf("step %d: %zu bytes sent per worker (ratio %.0fx), |aggregate| = %.6g\n", step, bytes / workers,
                static_cast<double>(n * sizeof(float)) / static_cast<double>(bytes / workers), norm);
  }
  return 0;
}
