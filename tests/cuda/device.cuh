// What the CUDA tests share: Thrust vectors as gradcomp's device_spans, host copies,
// and a main() that skips (exit 77, which ctest reports as skipped) without a GPU.
#pragma once

#include <doctest/doctest.h>
#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/device_messages.cuh>

#include <thrust/copy.h>
#include <thrust/device_vector.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

namespace device {

// Whether the tests run on tests/emulated_cuda, which runs a kernel about a thousand
// times slower than a GPU: there the largest sizes run a narrower product of the cases.
#if defined(GRADCOMP_EMULATED_CUDA)
inline constexpr bool emulated = true;
#else
inline constexpr bool emulated = false;
#endif

// The largest size a test runs: any, but under ThreadSanitizer (tests/CMakeLists.txt, label
// races), six times slower again, where none past 70,003 runs (the plain emulation and the
// GPU run them). Larger sizes add grid-stride rounds, and the emulated device's grid (2
// multiprocessors, 16 blocks of 256 threads) already takes several rounds at 70,003.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GRADCOMP_TEST_UNDER_TSAN 1
#endif
#endif
#if defined(GRADCOMP_TEST_UNDER_TSAN)
inline constexpr std::size_t largest_size = 70'003;
#else
inline constexpr std::size_t largest_size = std::numeric_limits<std::size_t>::max();
#endif

/// A Thrust vector as the view gradcomp's public calls take of device memory.
template <class T>
gradcomp::device_span<T> span_of(thrust::device_vector<T>& v) {
  return {thrust::raw_pointer_cast(v.data()), v.size()};
}

/// The same memory as the raw std::span that engines (detail::, not API) take.
template <class T>
std::span<T> raw_span_of(thrust::device_vector<T>& v) {
  return {thrust::raw_pointer_cast(v.data()), v.size()};
}

template <class T>
thrust::device_vector<T> copy_of(const std::vector<T>& host) {
  return thrust::device_vector<T>(host.begin(), host.end());
}

template <class T>
std::vector<T> host_copy(gradcomp::device_span<const T> in_device) {
  std::vector<T> host(in_device.size());
  gradcomp::detail::cuda_check(
      cudaMemcpy(host.data(), in_device.data(), host.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

template <class T>
std::vector<T> host_copy(const thrust::device_vector<T>& v) {
  std::vector<T> host(v.size());
  thrust::copy(v.begin(), v.end(), host.begin());
  return host;
}

/// Bit-identical float arrays (== would equate -0 and +0).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Checks that `comm`'s allgather_accumulate refuses `message` (gradcomp::error) and
/// leaves the dense tensor (n values of 2.5) as it was.
template <class Comm>
void check_refused_unchanged(Comm& comm, const std::vector<std::byte>& message, std::size_t n) {
  auto on_device = copy_of(message);
  thrust::device_vector<float> dense(n, 2.5f);
  CHECK_THROWS_AS(comm.allgather_accumulate(span_of(on_device), span_of(dense), 1.0f), gradcomp::error);
  const auto after = host_copy(dense);
  CHECK(std::all_of(after.begin(), after.end(), [](float v) { return v == 2.5f; }));
}

/// Checks that `comm`'s bucketed allgather_accumulate of `messages` (this rank's, one
/// per tensor) into tensors holding `start` leaves them holding `expected`, bit for bit.
template <class Comm>
void check_bucketed(Comm& comm, const std::vector<std::vector<std::byte>>& messages,
                    const std::vector<std::vector<float>>& start, const std::vector<std::vector<float>>& expected,
                    float scale) {
  std::vector<thrust::device_vector<std::byte>> on_device;
  std::vector<thrust::device_vector<float>> dense;
  std::vector<gradcomp::device_span<const std::byte>> m;
  std::vector<gradcomp::device_span<float>> d;
  for (std::size_t t = 0; t < messages.size(); ++t) {
    on_device.push_back(copy_of(messages[t]));
    dense.push_back(copy_of(start[t]));
  }
  for (std::size_t t = 0; t < messages.size(); ++t) {
    m.push_back(span_of(on_device[t]));
    d.push_back(span_of(dense[t]));
  }
  comm.allgather_accumulate(m, d, scale);
  for (std::size_t t = 0; t < messages.size(); ++t) CHECK(same_bits(host_copy(dense[t]), expected[t]));
}

inline int run_tests(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace device
