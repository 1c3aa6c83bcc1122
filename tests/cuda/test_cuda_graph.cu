// A fixed-size configuration (exact_topk; raw32 or bitmap indices, any value coding; no
// corrector) is captured once in a CUDA graph and replayed on new gradients: every
// replay writes the message the host compressor writes, and a NaN replay writes nothing
// and is reported. Codings that round at random with the step are refused.
// Needs a GPU (exit 77 without one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/gradcomp.hpp>

#include <limits>
#include <vector>

#include "../support/inputs.hpp"

namespace gc = gradcomp;

void capture_and_replay(const gc::encode::index_value& encoder) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const gc::select::exact_topk topk{.density = 0.01};
  cudaStream_t stream = nullptr;
  gc::detail::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  gc::compressor gpu{gc::backend::cuda{stream}, n, topk, gc::correct::none{}, encoder};
  gc::compressor host{gc::backend::host{}, n, topk, gc::correct::none{}, encoder};
  thrust::device_vector<float> g(n);
  thrust::device_vector<std::byte> out(gpu.max_message_bytes());
  std::vector<std::byte> host_out(host.max_message_bytes());

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  gc::detail::cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  const gc::device_message captured = gpu.compress_async(device::span_of(g), device::span_of(out));
  gc::detail::cuda_check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  gc::detail::cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  CHECK(captured.count() == topk.k(n));
  CHECK(captured.bytes().size() == encoder.max_bytes(n, topk.k(n)));

  std::vector<std::byte> last;
  for (int replay = 0; replay < 6; ++replay) {
    CAPTURE(replay);
    const auto shape = inputs::all_shapes[static_cast<std::size_t>(replay) % std::size(inputs::all_shapes)];
    auto x = inputs::make(shape, n, 50 + static_cast<std::uint64_t>(replay));
    const bool poisoned = replay == 4;
    if (poisoned) x[12345] = std::numeric_limits<float>::quiet_NaN();
    gc::detail::cuda_check(cudaMemcpyAsync(thrust::raw_pointer_cast(g.data()), x.data(), n * sizeof(float),
                                           cudaMemcpyHostToDevice, stream),
                           "cudaMemcpyAsync");
    gc::detail::cuda_check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    gc::detail::cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto got = device::host_copy(captured.bytes());
    if (poisoned) {
      CHECK_FALSE(gpu.last_step_finite());
      CHECK(got == last);  // nothing written
      continue;
    }
    CHECK(gpu.last_step_finite());
    const auto expected = host.compress(x, host_out);
    CHECK(got == std::vector<std::byte>(expected.bytes().begin(), expected.bytes().end()));
    last = got;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // The graph held the workspace's addresses: it is not given back.
  CHECK_THROWS_WITH_AS(gpu.release_workspace(), doctest::Contains("compress_async() has run"), gc::error);

  // A compressor that gave its workspace back does not queue an asynchronous step (it
  // would allocate, which a capture cannot); compress() allocates it again.
  gc::compressor released{gc::backend::cuda{stream}, n, topk, gc::correct::none{}, encoder};
  released.release_workspace();
  CHECK_THROWS_WITH_AS((void)released.compress_async(device::span_of(g), device::span_of(out)),
                       doctest::Contains("the workspace was given back"), gc::error);
  (void)released.compress(device::span_of(g), device::span_of(out));
  (void)released.compress_async(device::span_of(g), device::span_of(out));
  gc::detail::cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

  // A configuration whose message size depends on the data is refused, and so is one
  // that rounds at random with the step number (a replay would repeat the captured draw).
  gc::compressor automatic{gc::backend::cuda{stream}, n, topk};
  CHECK_THROWS_WITH_AS((void)automatic.compress_async(device::span_of(g), device::span_of(out)),
                       doctest::Contains("compress_async"), gc::error);
  gc::compressor random_rounding{
      gc::backend::cuda{stream}, n, topk, gc::correct::none{},
      gc::encode::index_value{
          .index = gc::index_coding::raw32, .value = gc::value_coding::qsgd, .levels = 7, .seed = 5}};
  CHECK_THROWS_WITH_AS((void)random_rounding.compress_async(device::span_of(g), device::span_of(out)),
                       "gradcomp: compress_async: index_value(raw32,qsgd/7) rounds at random with the step number, "
                       "which a replayed graph would repeat; use compress",
                       gc::error);
  cudaStreamDestroy(stream);
}

TEST_CASE("compress_async is captured in a CUDA graph and replayed") {
  capture_and_replay({.index = gc::index_coding::raw32, .value = gc::value_coding::f32});
  // Every coding is written on the device: a bitmap with int8 values (a scale from the
  // data) and a checksum too.
  capture_and_replay({.index = gc::index_coding::bitmap, .value = gc::value_coding::int8, .checksum = true});
}

int main(int argc, char** argv) { return device::run_tests(argc, argv); }
