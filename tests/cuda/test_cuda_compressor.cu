// backend::cuda's compressor against backend::host's, step by step: the same previews,
// the same message bytes and the same committed state, for every selector, corrector and encoder the
// CUDA backend runs, on the conformance inputs. Needs a GPU (exit 77 without one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/backend/stream_order.cuh>
#include <gradcomp/gradcomp.hpp>
#include <thrust/fill.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../support/inputs.hpp"

namespace gc = gradcomp;
using gc::index_coding;
using gc::value_coding;

namespace {

const gc::encode::index_value device_encoders[] = {
    {.index = index_coding::raw32, .value = value_coding::f32},
    {.index = index_coding::raw32, .value = value_coding::f16},
    {.index = index_coding::raw32, .value = value_coding::bf16},
};
const gc::encode::index_value host_coded_encoders[] = {
    {},  // automatic index coding
    {.index = index_coding::delta_bitpack, .value = value_coding::int8},
    {.index = index_coding::bitmap, .value = value_coding::qsgd, .levels = 7, .seed = 5, .checksum = true},
    {.index = index_coding::raw32, .value = value_coding::ternary},
};

std::vector<std::uint32_t> every_third(std::size_t n) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 1; i < n; i += 3) out.push_back(i);
  return out;
}

// Host copies of a compressor's committed state arrays, as bits.
template <class Compressor>
std::vector<std::vector<std::uint32_t>> states(const Compressor& c) {
  std::vector<std::vector<std::uint32_t>> out;
  for (std::size_t a = 0; a != Compressor::corrector_type::state_arrays; ++a) {
    const auto s = c.corrector_state(a);
    out.emplace_back(s.size());
    std::memcpy(out.back().data(), s.data(), s.size() * sizeof(float));
  }
  return out;
}

// Runs `steps` steps of the same policies on both backends and checks each message and
// the final state.
template <class Selector, class Corrector>
void same_as_host(Selector selector, Corrector corrector, gc::encode::index_value encoder, inputs::shape shape,
                  std::size_t n, int steps = 3) {
  CAPTURE(selector.name());
  CAPTURE(corrector.name());
  CAPTURE(encoder.name());
  CAPTURE(inputs::name(shape));
  CAPTURE(n);
  gc::compressor host{gc::backend::host{}, n, selector, corrector, encoder};
  gc::compressor gpu{gc::backend::cuda{}, n, selector, corrector, encoder};
  if constexpr (std::is_same_v<Selector, gc::select::given_indices>) {
    const auto given = every_third(n);
    host.set_indices(given);
    gpu.set_indices(given);
  }
  REQUIRE(gpu.max_message_bytes() == host.max_message_bytes());
  std::vector<std::byte> host_out(host.max_message_bytes());
  thrust::device_vector<std::byte> gpu_out(gpu.max_message_bytes());
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const auto x = inputs::make(shape, n, 40 + static_cast<std::uint64_t>(step));
    auto g = device::copy_of(x);
    // preview: what the step is about to rank, without changing the state it then uses.
    const auto host_acc = host.preview(x);
    REQUIRE(device::same_bits(device::host_copy(gpu.preview(device::span_of(g))), host_acc));
    const auto expected = host.compress(x, host_out);
    const auto got = gpu.compress(device::span_of(g), device::span_of(gpu_out));
    CHECK(got.count() == expected.count());
    CHECK(got.size() == expected.size());
    REQUIRE(device::host_copy(got.bytes()) == std::vector<std::byte>(expected.bytes().begin(), expected.bytes().end()));
  }
  CHECK(gpu.step() == host.step());
  CHECK(states(gpu) == states(host));
}

// The correctors, each an entry: every_corrector runs them all, every_policy's larger
// sizes one per shape.
template <class Selector>
void nth_corrector(std::size_t c, Selector selector, gc::encode::index_value encoder, inputs::shape shape,
                   std::size_t n) {
  switch (c) {
    case 0:
      return same_as_host(selector, gc::correct::none{}, encoder, shape, n);
    case 1:
      return same_as_host(selector, gc::correct::error_feedback{}, encoder, shape, n);
    case 2:
      return same_as_host(selector, gc::correct::error_feedback{.beta = 0.5f, .gamma = 0.25f}, encoder, shape, n);
    case 3:
      return same_as_host(selector, gc::correct::momentum{.beta = 0.9f}, encoder, shape, n);
    case 4:
      return same_as_host(selector, gc::correct::momentum{.beta = 0.9f, .nesterov = true, .masking = false}, encoder,
                          shape, n);
    case 5:
      return same_as_host(selector, gc::correct::low_pass{.beta = 0.3f}, encoder, shape, n);
    case 6:
      return same_as_host(selector, gc::correct::clip_norm{.max_norm = 2.0f}, encoder, shape, n);
    default:
      return same_as_host(selector,
                          gc::correct::chain{gc::correct::clip_norm{.max_norm = 1.0f, .workers = 4},
                                             gc::correct::momentum{.beta = 0.9f}},
                          encoder, shape, n);
  }
}
constexpr std::size_t corrector_count = 8;

template <class Selector>
void every_corrector(Selector selector, gc::encode::index_value encoder, inputs::shape shape, std::size_t n) {
  for (std::size_t c = 0; c != corrector_count; ++c) nth_corrector(c, selector, encoder, shape, n);
}

// Every corrector and encoder on every shape at the smaller sizes (a block or a few),
// and at a million elements, where the selectors run their multi-block passes, every
// corrector on every shape on a GPU. On the emulated device that product took nine
// tenths of its grids' time (2026-12-01), repeating the correctors' elementwise kernels,
// which do not depend on the shape: there each shape runs three times at a million,
// with no corrector (the selector on the shape itself), with error feedback and the
// automatic index coding, and with one of the other correctors in turn, so that every
// corrector and every shape still runs at that size.

template <class Selector>
void every_policy(Selector selector) {
  for (std::size_t s = 0; s != std::size(inputs::all_shapes); ++s) {
    const auto shape = inputs::all_shapes[s];
    for (const std::size_t n : inputs::awkward_sizes) {
      if (n < (std::size_t{1} << 20)) {
        for (const auto& e : device_encoders) every_corrector(selector, e, shape, n);
        for (const auto& e : host_coded_encoders) every_corrector(selector, e, shape, n);
        continue;
      }
      nth_corrector(1, selector, host_coded_encoders[0], shape, n);
      if (!device::emulated) {
        every_corrector(selector, device_encoders[0], shape, n);
      } else {
        nth_corrector(0, selector, device_encoders[0], shape, n);
        nth_corrector(1 + s % (corrector_count - 1), selector, device_encoders[0], shape, n);
      }
    }
  }
}

}  // namespace

TEST_CASE("cuda exact_topk sends what host sends, with every corrector and encoder") {
  every_policy(gc::select::exact_topk{.density = 0.01});
  every_policy(gc::select::exact_topk{.density = 0.3});
  every_policy(gc::select::exact_topk{.count = 1});
}

TEST_CASE("cuda threshold sends what host sends, with every corrector and encoder") {
  every_policy(gc::select::threshold{.tau = 1.5f});
  every_policy(gc::select::threshold{.tau = 0.0f});
}

TEST_CASE("cuda sampled_threshold sends what host sends, with every corrector and encoder") {
  every_policy(gc::select::sampled_threshold{.density = 0.01, .seed = 5});
  every_policy(gc::select::sampled_threshold{.density = 0.001, .seed = 6, .truncate = true});
  every_policy(gc::select::sampled_threshold{.density = 0.01, .seed = 7, .reuse_threshold = true});
  every_policy(gc::select::sampled_threshold{.density = 0.05, .sample_ratio = 1.0});  // the exact fallback
}

TEST_CASE("cuda sampled_threshold follows set_density and carries its threshold as host does") {
  const std::size_t n = 300'007;
  gc::select::sampled_threshold policy{.density = 0.01, .seed = 2, .reuse_threshold = true};
  gc::compressor host{gc::backend::host{}, n, policy, gc::correct::error_feedback{}};
  gc::compressor gpu{gc::backend::cuda{}, n, policy, gc::correct::error_feedback{}};
  int t = 0;
  for (const double d : {0.01, 0.001, 0.5, 1.0 / 300'007.0, 0.02}) {  // 0.5 and 1/n: m >= n, the exact fallback
    host.set_density(d);
    gpu.set_density(d);
    for (int again = 0; again < 3; ++again, ++t) {
      const auto x = inputs::make(inputs::shape::log_normal, n, 50 + static_cast<std::uint64_t>(t));
      auto g = device::copy_of(x);
      std::vector<std::byte> host_out(host.max_message_bytes());
      thrust::device_vector<std::byte> gpu_out(gpu.max_message_bytes());
      const auto expected = host.compress(x, host_out);
      const auto got = gpu.compress(device::span_of(g), device::span_of(gpu_out));
      CAPTURE(d);
      CAPTURE(again);
      REQUIRE(device::host_copy(got.bytes()) ==
              std::vector<std::byte>(expected.bytes().begin(), expected.bytes().end()));
    }
  }
  std::ostringstream a, b;
  host.save_state(a);
  gpu.save_state(b);
  CHECK(a.str() == b.str());  // the carried threshold included
}

TEST_CASE("cuda chunk_local sends what host sends, with every corrector and encoder") {
  every_policy(gc::select::chunk_local{});  // bin 50
  every_policy(gc::select::chunk_local{.bin = 7});
  every_policy(gc::select::chunk_local{.bin = 1});
  every_policy(
      gc::select::chunk_local{.bin = 70'001});  // one bin for the smaller sizes, straddling bins for the larger
}

TEST_CASE("cuda chunk_local at a tile's edge: the corrector's update riding its tiled pass, or before wider bins") {
  // Tiles of whole bins of at most 2,048 entries (tiles of 2,047 split words of the
  // hits' bits, tiles of 2,048 do not); 2,049 is reduced by key after the update's pass.
  for (const std::size_t bin : {std::size_t{2047}, std::size_t{2048}, std::size_t{2049}}) {
    CAPTURE(bin);
    for (const auto shape : {inputs::shape::normal, inputs::shape::ties, inputs::shape::sparse_spikes}) {
      if ((std::size_t{1} << 20) + 3 <= device::largest_size) {
        same_as_host(gc::select::chunk_local{.bin = bin}, gc::correct::error_feedback{}, device_encoders[0], shape,
                     (std::size_t{1} << 20) + 3);
      }
      same_as_host(gc::select::chunk_local{.bin = bin}, gc::correct::momentum{.beta = 0.9f}, host_coded_encoders[1],
                   shape, 70'001);
    }
  }
}

TEST_CASE("cuda random_k sends what host sends, with every corrector and encoder") {
  every_policy(gc::select::random_k{.density = 0.01, .seed = 3});
  every_policy(gc::select::random_k{.density = 0.2, .seed = 4, .unbiased = true});
  every_policy(gc::select::random_k{.density = 1.0});
}

TEST_CASE("cuda random_k follows set_density as host does") {
  const std::size_t n = 100'000;
  gc::compressor host{gc::backend::host{}, n, gc::select::random_k{.density = 0.001, .seed = 9}};
  gc::compressor gpu{gc::backend::cuda{}, n, gc::select::random_k{.density = 0.001, .seed = 9}};
  for (const double d : {0.001, 0.05, 0.002}) {
    host.set_density(d);
    gpu.set_density(d);
    const auto x = inputs::make(inputs::shape::normal, n, 11);
    auto g = device::copy_of(x);
    std::vector<std::byte> host_out(host.max_message_bytes());
    thrust::device_vector<std::byte> gpu_out(gpu.max_message_bytes());
    const auto expected = host.compress(x, host_out);
    const auto got = gpu.compress(device::span_of(g), device::span_of(gpu_out));
    CHECK(device::host_copy(got.bytes()) == std::vector<std::byte>(expected.bytes().begin(), expected.bytes().end()));
  }
}

TEST_CASE("cuda given_indices sends what host sends, with every corrector and encoder") {
  for (const std::size_t n : inputs::awkward_sizes) {
    every_corrector(gc::select::given_indices{.max_count = n}, device_encoders[0], inputs::shape::normal, n);
    every_corrector(gc::select::given_indices{.max_count = n}, host_coded_encoders[1], inputs::shape::student_t3, n);
  }
}

TEST_CASE("cuda exact_topk on ten million elements equals host") {
  same_as_host(gc::select::exact_topk{.density = 0.001}, gc::correct::momentum{}, device_encoders[0],
               inputs::shape::normal, 10'000'000, 2);
  same_as_host(gc::select::exact_topk{.density = 0.01}, gc::correct::none{}, device_encoders[0], inputs::shape::ties,
               10'000'000, 1);
}

TEST_CASE("a NaN or infinity is rejected and changes neither the message buffer nor the state") {
  const std::size_t n = 5000;
  const gc::encode::index_value raw{.index = index_coding::raw32};
  auto check = [&](auto selector, auto corrector, gc::encode::index_value encoder) {
    CAPTURE(selector.name());
    CAPTURE(corrector.name());
    CAPTURE(encoder.name());
    gc::compressor host{gc::backend::host{}, n, selector, corrector, encoder};
    gc::compressor gpu{gc::backend::cuda{}, n, selector, corrector, encoder};
    std::vector<std::byte> host_out(host.max_message_bytes());
    thrust::device_vector<std::byte> gpu_out(gpu.max_message_bytes());
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      for (const std::size_t at : {std::size_t{0}, std::size_t{2047}, n - 1}) {
        auto x = inputs::make(inputs::shape::normal, n, 7 + at);
        auto g = device::copy_of(x);
        (void)host.compress(x, host_out);
        (void)gpu.compress(device::span_of(g), device::span_of(gpu_out));
        const auto before = states(gpu);
        thrust::fill(gpu_out.begin(), gpu_out.end(), std::byte{0xAB});
        x[at] = bad;
        g = device::copy_of(x);
        try {
          (void)gpu.compress(device::span_of(g), device::span_of(gpu_out));
          FAIL("a non-finite gradient was accepted");
        } catch (const gc::error& e) {
          CHECK(e.code() == gc::errc::non_finite);
          CHECK(std::string(e.what()).find("grad[" + std::to_string(at) + "]") != std::string::npos);
        }
        CHECK_THROWS_AS((void)host.compress(x, host_out), gc::error);
        CHECK_THROWS_WITH_AS((void)gpu.preview(device::span_of(g)),
                             doctest::Contains(("preview: grad[" + std::to_string(at) + "]").c_str()), gc::error);
        CHECK(gpu.step() == host.step());
        const auto out_after = device::host_copy(gpu_out);
        CHECK(std::all_of(out_after.begin(), out_after.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
        CHECK(states(gpu) == before);
      }
    }
    // Both continue in step after the rejections.
    const auto x = inputs::make(inputs::shape::log_normal, n, 99);
    auto g = device::copy_of(x);
    const auto expected = host.compress(x, host_out);
    const auto got = gpu.compress(device::span_of(g), device::span_of(gpu_out));
    CHECK(device::host_copy(got.bytes()) == std::vector<std::byte>(expected.bytes().begin(), expected.bytes().end()));
  };
  check(gc::select::exact_topk{.density = 0.01}, gc::correct::none{}, raw);
  check(gc::select::exact_topk{.density = 0.01}, gc::correct::momentum{}, raw);
  check(gc::select::threshold{.tau = 1.0f}, gc::correct::none{}, raw);
  check(gc::select::chunk_local{}, gc::correct::none{}, raw);
  check(gc::select::sampled_threshold{.density = 0.01}, gc::correct::none{}, raw);
  check(gc::select::sampled_threshold{.density = 0.01, .reuse_threshold = true}, gc::correct::momentum{}, raw);
  check(gc::select::chunk_local{.bin = 500}, gc::correct::error_feedback{},
        gc::encode::index_value{.value = value_coding::ternary});
  check(gc::select::chunk_local{.bin = 3000}, gc::correct::momentum{}, raw);  // wider than a tile
  check(gc::select::random_k{.density = 0.01}, gc::correct::error_feedback{}, raw);
  check(gc::select::threshold{.tau = 1.0f}, gc::correct::error_feedback{}, gc::encode::index_value{});
  check(gc::select::exact_topk{.density = 0.05},
        gc::correct::chain{gc::correct::clip_norm{.max_norm = 1.0f}, gc::correct::momentum{}},
        gc::encode::index_value{.value = value_coding::int8});
}

TEST_CASE("bad arguments are rejected before anything is queued") {
  const std::size_t n = 1000;
  gc::compressor gpu{gc::backend::cuda{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{}};
  thrust::device_vector<float> g(n, 1.0f);
  thrust::device_vector<float> short_g(n - 1, 1.0f);
  thrust::device_vector<std::byte> out(gpu.max_message_bytes());
  thrust::device_vector<std::byte> small(gpu.max_message_bytes() - 1);
  CHECK_THROWS_WITH_AS((void)gpu.compress(device::span_of(short_g), device::span_of(out)),
                       doctest::Contains("grad.size() = 999"), gc::error);
  CHECK_THROWS_WITH_AS((void)gpu.compress(device::span_of(g), device::span_of(small)), doctest::Contains("out.size()"),
                       gc::error);
  CHECK(gpu.step() == 0);
  CHECK_THROWS_WITH_AS(gpu.set_density(0.0), doctest::Contains("density"), gc::error);
}

// Views say where their memory lives (memory.hpp); a host pointer wrapped in a
// device_span by mistake is refused by the driver's answer, naming the argument, and
// nothing changes.
TEST_CASE("host memory passed as a device_span is refused, naming it") {
  const std::size_t n = 1000;
  gc::compressor gpu{gc::backend::cuda{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{}};
  thrust::device_vector<float> g(n, 1.0f);
  thrust::device_vector<std::byte> out(gpu.max_message_bytes());
  std::vector<float> host_g(n, 1.0f);
  std::vector<std::byte> host_out(gpu.max_message_bytes(), std::byte{0x5A});
  const gc::device_span<const float> wrapped_g(host_g.data(), n);
  const gc::device_span<std::byte> wrapped_out(host_out.data(), host_out.size());
  CHECK_THROWS_WITH_AS((void)gpu.compress(wrapped_g, device::span_of(out)), doctest::Contains("compress: grad ("),
                       gc::error);
  CHECK_THROWS_WITH_AS((void)gpu.compress(device::span_of(g), wrapped_out), doctest::Contains("compress: out ("),
                       gc::error);
  CHECK_THROWS_WITH_AS((void)gpu.preview(wrapped_g), doctest::Contains("preview: grad ("), gc::error);
  CHECK(gpu.step() == 0);
  CHECK(host_out == std::vector<std::byte>(host_out.size(), std::byte{0x5A}));
  const auto residual = gpu.corrector_state(0);
  CHECK(std::vector<float>(residual.begin(), residual.end()) == std::vector<float>(n, 0.0f));

  const auto m = gpu.compress(device::span_of(g), device::span_of(out));
  std::vector<float> host_dense(n, 2.0f);
  thrust::device_vector<float> dense(n, 0.0f);
  CHECK_THROWS_WITH_AS(
      gc::accumulate(gc::backend::cuda{}, m.bytes(), gc::device_span<float>(host_dense.data(), n), 1.0f),
      doctest::Contains("accumulate: dense ("), gc::error);
  CHECK(host_dense == std::vector<float>(n, 2.0f));
  const std::vector<std::byte> host_message = device::host_copy(m.bytes());
  CHECK_THROWS_WITH_AS(
      gc::accumulate(gc::backend::cuda{}, gc::device_span<const std::byte>(host_message.data(), host_message.size()),
                     device::span_of(dense), 1.0f),
      doctest::Contains("accumulate: bytes ("), gc::error);
  CHECK_THROWS_WITH_AS(
      (void)gc::decode(gc::backend::cuda{}, gc::device_span<const std::byte>(host_message.data(), host_message.size())),
      doctest::Contains("decode: bytes ("), gc::error);
  CHECK(device::host_copy(dense) == std::vector<float>(n, 0.0f));
}

TEST_CASE("set_density and checkpoints carry over between cuda and host") {
  const std::size_t n = 20'000;
  const gc::select::exact_topk topk{.density = 0.01};
  const gc::correct::momentum momentum{.beta = 0.8f};
  gc::compressor host{gc::backend::host{}, n, topk, momentum};
  gc::compressor gpu{gc::backend::cuda{}, n, topk, momentum};
  std::vector<std::byte> host_out(host.max_message_bytes() * 10);
  thrust::device_vector<std::byte> gpu_out(gpu.max_message_bytes() * 10);
  auto both = [&](std::uint64_t seed) {
    const auto x = inputs::make(inputs::shape::student_t3, n, seed);
    auto g = device::copy_of(x);
    const auto expected = host.compress(x, host_out);
    const auto got = gpu.compress(device::span_of(g), device::span_of(gpu_out));
    CHECK(device::host_copy(got.bytes()) == std::vector<std::byte>(expected.bytes().begin(), expected.bytes().end()));
  };
  both(1);
  host.set_density(0.05);
  gpu.set_density(0.05);
  both(2);
  // `into`, a fresh compressor, with the state `from` saved.
  auto restore = [](const auto& from, auto&& into) {
    std::stringstream record;
    from.save_state(record);
    into.load_state(record);
    return std::move(into);
  };
  // The GPU's checkpoint, restored into a fresh host compressor, continues identically,
  // and so does a host checkpoint restored into a GPU compressor.
  host = restore(gpu, gc::compressor{gc::backend::host{}, n, topk, momentum});
  both(3);
  gpu = restore(host, gc::compressor{gc::backend::cuda{}, n, topk, momentum});
  both(4);
}

TEST_CASE("cuda: a stream per call runs the steps of the compressor's own stream; another device is refused") {
  int current = 0;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  const std::size_t n = 100'003;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  auto own = gc::presets::dgc(gc::backend::cuda{}, n, {.density = 0.01, .max_norm = 1.0f});
  auto per_call = gc::presets::dgc(gc::backend::cuda{}, n, {.density = 0.01, .max_norm = 1.0f});
  thrust::device_vector<std::byte> a(own.max_message_bytes()), b(per_call.max_message_bytes());
  const gc::backend::cuda context{.stream = stream};  // device -1: the compressor's
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    auto g = device::copy_of(inputs::make(inputs::shape::student_t3, n, 60 + static_cast<std::uint64_t>(step)));
    REQUIRE(device::same_bits(device::host_copy(per_call.preview(context, device::span_of(g))),
                              device::host_copy(own.preview(device::span_of(g)))));
    const auto want = own.compress(device::span_of(g), device::span_of(a));
    const auto got = per_call.compress(context, device::span_of(g), device::span_of(b));
    REQUIRE(device::host_copy(got.bytes()) == device::host_copy(want.bytes()));
  }
  auto g = device::copy_of(inputs::make(inputs::shape::normal, n, 70));
  std::stringstream before, after;
  per_call.save_state(before);
  const std::string want = "compress: the context is on CUDA device " + std::to_string(current + 1) +
                           " but the compressor's memory is on device " + std::to_string(current);
  CHECK_THROWS_WITH_AS(per_call.compress(gc::backend::cuda{.stream = stream, .device = current + 1}, device::span_of(g),
                                         device::span_of(b)),
                       doctest::Contains(want.c_str()), gc::error);
  per_call.save_state(after);
  CHECK(after.str() == before.str());
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

namespace {
// cudaMalloc behind a count: which allocator a compressor's memory came from.
class counting_allocator : public gc::backend::device_allocator {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    gc::detail::cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
    ++live;
    ++made;
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    cudaFree(p);
    --live;
  }
  int live = 0;
  int made = 0;
};
}  // namespace

TEST_CASE("cuda: a compressor given an allocator takes all its memory from it, and steps as without") {
  const std::size_t n = 50'001;
  auto mine = std::make_shared<counting_allocator>();
  auto process_wide = std::make_shared<counting_allocator>();
  gc::backend::set_device_allocator(process_wide);
  {
    auto with = gc::presets::topk_ef(gc::backend::cuda{.allocator = mine}, n);
    auto without = gc::presets::topk_ef(gc::backend::cuda{}, n);
    const int after_construction = mine->live;
    const int made_in_construction = mine->made;
    CHECK(after_construction > 0);
    thrust::device_vector<std::byte> a(with.max_message_bytes()), b(without.max_message_bytes());
    for (int step = 0; step < 3; ++step) {
      auto g = device::copy_of(inputs::make(inputs::shape::log_normal, n, 80 + static_cast<std::uint64_t>(step)));
      const auto got = with.compress(device::span_of(g), device::span_of(a));
      const auto want = without.compress(device::span_of(g), device::span_of(b));
      REQUIRE(device::host_copy(got.bytes()) == device::host_copy(want.bytes()));
    }
    CHECK(mine->made == made_in_construction);  // compress allocates nothing
    with.set_density(0.01);                     // the workspace grows from the same allocator (the old buffers go back)
    CHECK(mine->made > made_in_construction);
    CHECK(mine->live >= after_construction);
  }
  gc::backend::set_device_allocator(nullptr);
  CHECK(mine->live == 0);  // every buffer went back where it came from
  CHECK(process_wide->live == 0);
}

TEST_CASE("cuda: a compressor records its device and refuses calls made with another current") {
  int current = 0;
  int devices = 0;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  const std::size_t n = 1000;
  const gc::select::exact_topk topk{.density = 0.01};
  gc::compressor c{gc::backend::cuda{}, n, topk, gc::correct::error_feedback{}};
  CHECK(c.backend().device == current);
  // Naming a device that is not current is refused at once.
  CHECK_THROWS_WITH_AS(gc::compressor(gc::backend::cuda{.device = current + 1}, n, topk),
                       doctest::Contains("compressor: the compressor's memory is on CUDA device"), gc::error);
  if (devices < 2) return;  // the rest needs a second GPU
  auto g = device::copy_of(inputs::make(inputs::shape::normal, n, 1));
  thrust::device_vector<std::byte> out(c.max_message_bytes());
  (void)c.compress(device::span_of(g), device::span_of(out));
  std::stringstream before;
  c.save_state(before);
  const int other = (current + 1) % devices;
  REQUIRE(cudaSetDevice(other) == cudaSuccess);
  const std::string want = "the compressor's memory is on CUDA device " + std::to_string(current) +
                           " but the current device is " + std::to_string(other);
  CHECK_THROWS_WITH_AS(c.compress(device::span_of(g), device::span_of(out)), doctest::Contains(want.c_str()),
                       gc::error);
  CHECK_THROWS_WITH_AS(c.preview(device::span_of(g)), doctest::Contains(("preview: " + want).c_str()), gc::error);
  CHECK_THROWS_WITH_AS(c.set_density(0.1), doctest::Contains(want.c_str()), gc::error);
  REQUIRE(cudaSetDevice(current) == cudaSuccess);
  std::stringstream after;
  c.save_state(after);
  CHECK(after.str() == before.str());
  CHECK(c.step() == 1);
}

TEST_CASE(
    "cuda: memory_bytes counts device state by its definition; a compact step's float32 array only while staged") {
  const std::size_t n = 70001;
  const gc::select::exact_topk topk{.density = 0.01};
  gc::compressor ef{gc::backend::cuda{}, n, topk, gc::correct::error_feedback{}};
  gc::compressor compact{gc::backend::cuda{}, n, topk,
                         gc::correct::compact<gc::correct::error_feedback>{.bits = 8, .block = 64}};
  CHECK(ef.memory_bytes().state == 4 * n);
  CHECK(compact.memory_bytes().state == n + (n + 63) / 64);
  auto g = device::copy_of(inputs::make(inputs::shape::normal, n, 1));
  thrust::device_vector<std::byte> out(compact.max_message_bytes());
  (void)compact.compress(device::span_of(g), device::span_of(out));
  const gc::held_memory between = compact.memory_bytes();
  (void)compact.stage(device::span_of(g), device::span_of(out));
  CHECK(compact.memory_bytes().workspace == between.workspace + 4 * n);
  compact.accept_staged();
  CHECK(compact.memory_bytes().workspace == between.workspace);
  const gc::held_memory before = ef.memory_bytes();
  (void)ef.compress(device::span_of(g), device::span_of(out));
  CHECK(ef.memory_bytes().workspace == before.workspace);  // steps allocate nothing
}

namespace {
// Holds a stream until the host opens it (or ten seconds pass, so that a call that waits
// for the stream ends too): a call that returns while the gate still holds waited for
// nothing queued on that stream. (On the emulated device a stream's work runs only when
// the host waits for it, so a gate that passes at once tells the same: a call that
// waited leaves the stream done.)
__global__ void gate_kernel([[maybe_unused]] const volatile int* open) {
#if !defined(GRADCOMP_EMULATED_CUDA)
  const auto now = [] {
    unsigned long long ns = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
  };
  const unsigned long long start = now();
  while (*open == 0 && now() - start < 10'000'000'000ULL) {
  }
#endif
}
class stream_gate {
 public:
  stream_gate() {
    gc::detail::cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&open_), sizeof(int), cudaHostAllocMapped),
                           "cudaHostAlloc");
    gc::detail::cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&seen_), open_, 0),
                           "cudaHostGetDevicePointer");
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  ~stream_gate() {  // a gate still shut (a call threw) opened before its memory goes
    open();
    (void)cudaDeviceSynchronize();
    cudaFreeHost(open_);
  }
  /// Queues the gate on `stream`, shut.
  void shut(cudaStream_t stream) {
    *static_cast<volatile int*>(open_) = 0;
    gc::detail::cuda_launch::launch("gate_kernel (launch)", gate_kernel, 1, 1, 0, stream,
                                    static_cast<const volatile int*>(seen_));
  }
  void open() { *static_cast<volatile int*>(open_) = 1; }

 private:
  int* open_ = nullptr;  // mapped host memory, read by the kernel
  int* seen_ = nullptr;  // its device address
};

// Runs four steps of `gpu`, staged on `stage` (held by a gate from the second on) and
// committed on `commit` (ordered after the stage where it is another stream): each call
// must return with the gate still shut, and each message equal `host`'s. `after(t)`
// checks more once step t is done.
template <class Gpu, class Host, class After>
void gated_steps(Gpu& gpu, Host& host, std::size_t n, std::uint64_t seed, const gc::backend::cuda& stage,
                 const gc::backend::cuda& commit, After after) {
  thrust::device_vector<std::byte> out(gpu.max_message_bytes());
  std::vector<std::byte> want_bytes(host.max_message_bytes());
  cudaEvent_t staged = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming) == cudaSuccess);
  {
    stream_gate gate;
    for (std::uint64_t t = 0; t < 4; ++t) {
      CAPTURE(t);
      auto g = device::copy_of(inputs::make(inputs::shape::student_t3, n, seed + t));
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      if (t > 0) gate.shut(stage.stream);  // the first step allocates what it keeps (and waits for that)
      (void)gpu.stage_queued(stage, device::span_of(g), device::span_of(out));
      if (commit.stream != stage.stream) {
        REQUIRE(cudaEventRecord(staged, stage.stream) == cudaSuccess);
        REQUIRE(cudaStreamWaitEvent(commit.stream, staged, 0) == cudaSuccess);
      }
      gpu.accept_staged(commit);
      const cudaError_t held_staging = cudaStreamQuery(stage.stream);
      const cudaError_t held_committing = cudaStreamQuery(commit.stream);
      (void)cudaGetLastError();  // not ready is no error, but the runtime keeps it as the last one
      gate.open();
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      if (t > 0) {
        CHECK(held_staging == cudaErrorNotReady);
        CHECK(held_committing == cudaErrorNotReady);
      }
      after(t);
      const auto want = host.compress(inputs::make(inputs::shape::student_t3, n, seed + t), want_bytes);
      const auto got = device::host_copy(out);
      CHECK(std::equal(want.bytes().begin(), want.bytes().end(), got.begin()));
    }
  }
  REQUIRE(cudaEventDestroy(staged) == cudaSuccess);
}

// Stages a step of each of `make(be)`'s compressors on a stream the gate holds and
// commits it there (gated_steps). On a stream of its own, and on the legacy default
// stream (torch's current one, as a rule), which a synchronous call (cudaMemcpy,
// cudaFree) waits for.
template <class Make>
void queued_steps_on(std::size_t n, Make make, bool legacy) {
  cudaStream_t stream = nullptr;
  if (!legacy) REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const gc::backend::cuda on{.stream = stream};
  {
    auto gpu = make(on);
    auto host = make(gc::backend::host{});
    gated_steps(gpu, host, n, 80, on, on, [](std::uint64_t) {});
  }
  if (!legacy) REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

template <class Make>
void queued_steps_wait_for_nothing(std::size_t n, Make make) {
  for (const bool legacy : {false, true}) {
    CAPTURE(legacy);
    queued_steps_on(n, make, legacy);
  }
}
}  // namespace

// What tests/test_state.cpp counts on the CPU ("a queued step waits for nothing on a
// device"), here on the GPU: a bucket's step in the DDP hook must not hold the host up
// while the backward pass's kernels are queued before it.
TEST_CASE("cuda: a queued step and its commit wait for nothing queued before them") {
  const std::size_t n = 70'001;
  SUBCASE("DGC") {
    queued_steps_wait_for_nothing(n,
                                  [&](auto be) { return gc::presets::dgc(be, n, {.density = 0.01, .max_norm = 1}); });
  }
  SUBCASE("a fixed threshold") {
    queued_steps_wait_for_nothing(n, [&](auto be) { return gc::presets::threshold_ef(be, n, {.tau = 1.5f}); });
  }
  SUBCASE("random-k: the host's draw, copied from pinned memory") {
    queued_steps_wait_for_nothing(
        n, [&](auto be) { return gc::presets::randomk_ef(be, n, {.density = 0.01, .seed = 3}); });
  }
  SUBCASE("8-bit memory: the step's float32 arrays allocated and given back in stream order") {
    queued_steps_wait_for_nothing(n, [&](auto be) {
      return gc::presets::dgc(be, n, {.density = 0.01, .max_norm = 1}, gc::presets::compact_memory{.bits = 8});
    });
  }
  SUBCASE("exact top-k") {
    queued_steps_wait_for_nothing(n, [&](auto be) { return gc::presets::topk_ef(be, n, {.density = 0.01}); });
  }
}

// random-k's host draws go to the device through one pinned buffer, copied in stream
// order: steps queued back to back, with nothing waited for between them, must each wait
// for the copy before writing the next draw over it (pinned_staging::writable), or the
// earlier step would select the later one's indices.
TEST_CASE("cuda: random-k's steps queued back to back each send their own draw") {
  const std::size_t n = 70'001, steps = 3;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const gc::backend::cuda on{.stream = stream};
  {
    const gc::presets::randomk_ef_options options{.density = 0.01, .seed = 3};
    auto gpu = gc::presets::randomk_ef(on, n, options);
    auto host = gc::presets::randomk_ef(gc::backend::host{}, n, options);
    std::vector<thrust::device_vector<float>> g;
    std::vector<thrust::device_vector<std::byte>> out;
    for (std::size_t t = 0; t < steps; ++t) {
      g.push_back(device::copy_of(inputs::make(inputs::shape::student_t3, n, 90 + t)));
      out.emplace_back(gpu.max_message_bytes());
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (std::size_t t = 0; t < steps; ++t) {
      (void)gpu.stage_queued(on, device::span_of(g[t]), device::span_of(out[t]));
      gpu.accept_staged(on);
    }
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<std::byte> want_bytes(host.max_message_bytes());
    for (std::size_t t = 0; t < steps; ++t) {
      CAPTURE(t);
      const auto want = host.compress(inputs::make(inputs::shape::student_t3, n, 90 + t), want_bytes);
      const auto got = device::host_copy(out[t]);
      CHECK(std::equal(want.bytes().begin(), want.bytes().end(), got.begin()));
    }
  }
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

namespace {
// counting_allocator for state, the device's pool in stream order for a step's scratch,
// counted too, with the streams it is given back after.
class ordered_allocator : public counting_allocator {
 public:
  [[nodiscard]] bool stream_ordered(void*) const noexcept override { return true; }
  void* allocate_on(std::size_t bytes, void* stream) override {
    void* p = nullptr;
    gc::detail::cuda_check(cudaMallocAsync(&p, bytes, static_cast<cudaStream_t>(stream)), "cudaMallocAsync");
    pooled.insert(p);
    return p;
  }
  void deallocate_on(void* p, std::size_t, void* last) noexcept override {
    cudaFreeAsync(p, static_cast<cudaStream_t>(last));  // the pool's memory goes back after `last`'s work
    pooled.erase(p);
    given_back_after.push_back(last);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (pooled.erase(p) == 0) return counting_allocator::deallocate(p, bytes);
    cudaFreeAsync(p, nullptr);  // nothing queued on it
    given_back_after.push_back(nullptr);
  }
  ordered_allocator() { given_back_after.reserve(64); }  // pushed to by functions that may not throw
  std::set<void*> pooled;                                // allocate_on()'s, not given back
  std::vector<void*> given_back_after;                   // the stream of each deallocate_on() (null: deallocate())
};
}  // namespace

// A stream-ordered allocator (as PyTorch's caching allocator is for its current stream)
// serves compressed memory's float32 arrays for the step's stream and takes them back
// with nothing waited for, after the stream of their last work: the commit's, where the
// caller ran it on another stream (ordered after the step's).
TEST_CASE("cuda: compressed memory's arrays from a stream-ordered allocator, back without a wait across streams") {
  const std::size_t n = 70'001;
  cudaStream_t staging = nullptr, committing = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&staging, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&committing, cudaStreamNonBlocking) == cudaSuccess);
  const auto allocator = std::make_shared<ordered_allocator>();
  const gc::backend::cuda on_staging{.stream = staging, .allocator = allocator};
  const gc::backend::cuda on_committing{.stream = committing, .allocator = allocator};
  const gc::presets::dgc_options options{.density = 0.01, .max_norm = 1};
  const gc::presets::compact_memory memory{.bits = 8};
  {
    auto gpu = gc::presets::dgc(on_staging, n, options, memory);
    auto host = gc::presets::dgc(gc::backend::host{}, n, options, memory);
    gated_steps(gpu, host, n, 90, on_staging, on_committing, [&](std::uint64_t t) {
      CHECK(allocator->pooled.empty());  // momentum's two arrays, allocated and given back
      REQUIRE(allocator->given_back_after.size() == 2 * (t + 1));
      CHECK(allocator->given_back_after.back() == static_cast<void*>(committing));
      CHECK(allocator->given_back_after.end()[-2] == static_cast<void*>(committing));
    });
  }
  REQUIRE(cudaStreamDestroy(staging) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(committing) == cudaSuccess);
}

// backend::stream_order as the PyTorch extension uses it: a compressor's steps staged and
// committed on whichever stream is the caller's at the time (torch's current one), and a
// checkpoint saved and loaded and a step staged (calls that take no context) on the
// compressor's own stream. Each gradient is written on its caller's stream just before
// its step, and the messages are read at the end, where each, and the final state, must
// be the host compressor's.
TEST_CASE("cuda: backend::stream_order keeps a compressor's calls in order across the caller's streams") {
  const std::size_t n = 70'001;
  const std::size_t steps = 6;
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  cudaStream_t callers[2] = {}, own = nullptr;
  for (cudaStream_t* s : {&callers[0], &callers[1], &own}) {
    REQUIRE(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) == cudaSuccess);
  }
  const gc::presets::dgc_options options{.density = 0.01, .max_norm = 1};
  auto host = gc::presets::dgc(gc::backend::host{}, n, options);
  std::vector<std::byte> want(host.max_message_bytes());
  {
    auto gpu = gc::presets::dgc(gc::backend::cuda{.stream = own}, n, options);
    gc::backend::stream_order order(device);
    std::vector<float*> pinned(steps);
    std::vector<thrust::device_vector<float>> grads(steps, thrust::device_vector<float>(n));
    std::vector<thrust::device_vector<std::byte>> outs(steps,
                                                       thrust::device_vector<std::byte>(gpu.max_message_bytes()));
    for (std::size_t t = 0; t < steps; ++t) {
      REQUIRE(cudaMallocHost(&pinned[t], n * sizeof(float)) == cudaSuccess);
      const auto x = inputs::make(inputs::shape::student_t3, n, 110 + t);
      std::copy(x.begin(), x.end(), pinned[t]);
    }
    std::string checkpoint;
    std::vector<std::vector<std::byte>> messages;
    for (std::size_t t = 0; t < steps; ++t) {
      CAPTURE(t);
      const cudaStream_t staging = callers[t % 2], committing = callers[t / 2 % 2];
      if (t == 4) {  // back to the state after step 1, on the compressor's own stream
        order.run(own, staging, [&](cudaStream_t) { gpu.load_state(std::as_bytes(std::span(checkpoint))); });
        host.load_state(std::as_bytes(std::span(checkpoint)));
      }
      // The gradient is written last of several pieces of the caller's work, as the
      // backward pass queues many kernels before a bucket is ready.
      for (int piece = 0; piece < 8; ++piece) {
        REQUIRE(cudaMemsetAsync(device::raw_span_of(grads[t]).data(), piece, n * sizeof(float), staging) ==
                cudaSuccess);
      }
      REQUIRE(cudaMemcpyAsync(device::raw_span_of(grads[t]).data(), pinned[t], n * sizeof(float),
                              cudaMemcpyHostToDevice, staging) == cudaSuccess);
      // Odd steps are staged on the compressor's own stream (given no context, as a
      // checkpoint is): after the gradient their caller wrote, and before the caller
      // writes NaNs over it.
      const bool on_own = t % 2 == 1;
      order.run(on_own ? own : staging, staging, [&](cudaStream_t s) {
        (void)gpu.stage_queued(gc::backend::cuda{.stream = s}, device::span_of(grads[t]), device::span_of(outs[t]));
      });
      if (on_own)
        REQUIRE(cudaMemsetAsync(device::raw_span_of(grads[t]).data(), 0xFF, n * sizeof(float), staging) == cudaSuccess);
      order.run(committing, committing, [&](cudaStream_t s) { gpu.accept_staged(gc::backend::cuda{.stream = s}); });
      const auto message = host.compress(std::span<const float>(pinned[t], n), want);
      messages.emplace_back(message.bytes().begin(), message.bytes().end());
      if (t == 1) {
        order.run(own, committing, [&](cudaStream_t) {
          std::ostringstream record;
          gpu.save_state(record);
          checkpoint = record.str();
        });
      }
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (std::size_t t = 0; t < steps; ++t) {
      CAPTURE(t);
      const auto got = device::host_copy(outs[t]);
      CHECK(std::equal(messages[t].begin(), messages[t].end(), got.begin()));
      REQUIRE(cudaFreeHost(pinned[t]) == cudaSuccess);
    }
    CHECK(states(gpu) == states(host));
  }
  for (const cudaStream_t s : {callers[0], callers[1], own}) REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

// Bins of a histogram test: the top 11 bits of a value (2048 bins, a few of them crowded),
// none for a multiple of 7; `counted_bins` says how many bins it has (`said`), which
// backend::cuda counts per block in shared memory (those at or past `said` where the
// block's memory is, as the plain kernel counts every bin).
struct top_bits_bin {
  const std::uint32_t* values;
  std::uint32_t said;
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t i) const {
    return values[i] % 7 == 0 ? gc::detail::no_bin : std::size_t{values[i] >> 21};
  }
};
struct counted_bins : top_bits_bin {
  GRADCOMP_HOST_DEVICE std::size_t bins() const { return said; }
};

TEST_CASE("cuda: a histogram counts alike in shared memory and in device memory, as the host does") {
  const std::size_t n = 3'000'017;
  std::vector<std::uint32_t> values(n);
  std::vector<std::uint32_t> want(4096, 0);
  std::uint64_t x = 12345;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const auto bits = static_cast<std::uint32_t>(x >> 32);
    values[i] = i % 10 != 0 ? 0x30000000u | (bits & 0x003FFFFFu) : bits;  // nine in ten in two bins
    if (values[i] % 7 != 0) ++want[values[i] >> 21];
  }
  const auto on_device = device::copy_of(values);
  const std::uint32_t* at = thrust::raw_pointer_cast(on_device.data());
  thrust::device_vector<std::uint32_t> counts(4096);
  const gc::backend::cuda be{};
  for (const std::uint32_t said : {0u, 2048u, 4096u, 1024u}) {  // 0: no bins(); 1024: fewer than it uses
    CAPTURE(said);
    thrust::fill(counts.begin(), counts.end(), 0u);
    if (said == 0) {
      be.histogram(n, top_bits_bin{at, said}, thrust::raw_pointer_cast(counts.data()));
    } else {
      be.histogram(n, counted_bins{{at, said}}, thrust::raw_pointer_cast(counts.data()));
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(device::host_copy(counts) == want);
  }
}

#if defined(GRADCOMP_EMULATED_CUDA)
// The kernels a step launches, which the emulated device counts (a GPU's launch costs a
// few microseconds, most of a step's time at a DDP bucket's size: docs/benchmarks.md),
// each step still waiting once, for its status. The counts are the 2026-11-30 ones: a
// change that launches more fails here, one that launches fewer lowers them.
TEST_CASE("emulated: the kernels a step launches, per preset") {
  const std::size_t n = 100'003;
  const gc::backend::cuda be{};
  auto g = device::copy_of(inputs::make(inputs::shape::normal, n, 1));
  const auto launched = [&](auto&& c, std::uint64_t most) {
    thrust::device_vector<std::byte> out(c.max_message_bytes());
    (void)c.compress(device::span_of(g), device::span_of(out));  // the first step allocates
    const std::uint64_t kernels = emulated_cuda::kernels_launched();
    const std::uint64_t waits = emulated_cuda::host_waits();
    (void)c.compress(device::span_of(g), device::span_of(out));
    CHECK(emulated_cuda::kernels_launched() - kernels <= most);
    CHECK(emulated_cuda::host_waits() - waits == 1);
  };
  SUBCASE("topk_ef") { launched(gc::presets::topk_ef(be, n, {.density = 0.001}), 20); }
  SUBCASE("dgc") { launched(gc::presets::dgc(be, n, {.density = 0.001, .max_norm = 1}), 37); }
  SUBCASE("threshold_ef") { launched(gc::presets::threshold_ef(be, n, {.tau = 2.5f}), 15); }
  SUBCASE("adacomp") { launched(gc::presets::adacomp(be, n, {}), 16); }
}
#endif

int main(int argc, char** argv) {
  // Every kernel loaded when the context is made: loading one lazily, at its first
  // launch, may wait for the device, which the gate of "a queued step ... waits for
  // nothing" holds (CUDA's lazy loading warns of such a wait).
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  return device::run_tests(argc, argv);
}
