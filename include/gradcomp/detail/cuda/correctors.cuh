/// \file detail/cuda/correctors.cuh
/// Corrector engines on backend::cuda. One kernel computes the new state, acc and the
/// non-finite flag for every element; commit is a kernel over the sent entries that does
/// nothing once the step's status holds a NaN. State is double-buffered: the step writes
/// the other copy and the host swaps them after reading a sound status, so a rejected
/// step leaves the committed state untouched. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/host/elementwise_corrector.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cuda_correct {

// Loops over the state arrays test `a != arrays`: nvcc warns that `a < arrays` is
// pointless for the stateless correctors (arrays = 0).
/// Device addresses of a corrector's state arrays (one spare slot keeps the array
/// non-empty for stateless correctors).
template <std::size_t Arrays>
struct state_arrays {
  float* at[Arrays + 1];
};

template <class = void>
__global__ void check_finite(const float* g, std::uint64_t n, step_status* status) {
  bool bad = false;
  cuda_launch::grid_stride(n, [&](std::uint64_t i) { bad |= magnitude_key(g[i]) >= non_finite_key; });
  cuda_launch::flag_non_finite(bad, status);
}

/// sum_of_squares of every host_chunk-sized chunk, in exactly the order of the host's
/// eight-lane loop: thread 8c + l sums lane l of chunk c (elements l, l + 8, ...), and
/// the chunk's first thread combines the lanes as detail::sum_of_squares does.
template <class = void>
__global__ void chunk_sums_of_squares(const float* g, std::uint64_t n, double* chunk_sum) {
  const std::uint64_t chunks = (n + host_chunk - 1) / host_chunk;
  const std::uint64_t thread = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t c = thread / 8;
  const unsigned lane = static_cast<unsigned>(thread % 8);
  double part = 0.0;
  if (c < chunks) {
    const std::uint64_t begin = c * host_chunk;
    const std::uint64_t end = begin + host_chunk < n ? begin + host_chunk : n;
    for (std::uint64_t i = begin + lane; i < end; i += 8) {
      const double x = g[i];
      part = __dadd_rn(part, __dmul_rn(x, x));
    }
  }
  // Lanes 8c..8c+7 sit in one warp (blocks are multiples of 32 threads).
  const unsigned base = threadIdx.x & ~7u;
  double lanes[8];
  for (unsigned l = 0; l < 8; ++l) lanes[l] = __shfl_sync(0xFFFFFFFFu, part, static_cast<int>((base + l) % 32));
  if (c < chunks && lane == 0) {
    chunk_sum[c] = __dadd_rn(__dadd_rn(__dadd_rn(lanes[0], lanes[1]), __dadd_rn(lanes[2], lanes[3])),
                             __dadd_rn(__dadd_rn(lanes[4], lanes[5]), __dadd_rn(lanes[6], lanes[7])));
  }
}

/// The policy's gradient factor from the chunk sums, added in chunk order as the host
/// adds them.
template <class Policy>
__global__ void gradient_scale(Policy policy, const double* chunk_sum, std::uint64_t chunks, float* scale) {
  double total = 0.0;
  for (std::uint64_t c = 0; c < chunks; ++c) total = __dadd_rn(total, chunk_sum[c]);
  *scale = policy.gradient_scale(total);
}

template <class Policy, std::size_t Arrays, bool OwnAcc>
__global__ void update(Policy policy, state_arrays<Arrays> old, state_arrays<Arrays> next, float* acc, const float* g,
                       const float* scale, std::uint64_t n, step_status* status) {
  const float factor = scale != nullptr ? *scale : 1.0f;
  bool bad = false;
  cuda_launch::grid_stride(n, [&](std::uint64_t i) {
    float s[Arrays + 1];
    for (std::size_t a = 0; a != Arrays; ++a) s[a] = old.at[a][i];
    const float value = policy.update(s, __fmul_rn(g[i], factor));
    for (std::size_t a = 0; a != Arrays; ++a) next.at[a][i] = s[a];
    if constexpr (OwnAcc) acc[i] = value;
    bad |= magnitude_key(value) >= non_finite_key;
  });
  cuda_launch::flag_non_finite(bad, status);
}

template <class Policy, std::size_t Arrays>
__global__ void commit(Policy policy, state_arrays<Arrays> old, state_arrays<Arrays> next, const float* acc,
                       const std::uint32_t* index, const float* sent, const step_status* status) {
  if (status->non_finite != 0) return;
  cuda_launch::grid_stride(status->count, [&](std::uint64_t j) {
    const std::uint32_t i = index[j];
    float s[Arrays + 1], before[Arrays + 1];
    for (std::size_t a = 0; a != Arrays; ++a) {
      s[a] = next.at[a][i];
      before[a] = old.at[a][i];
    }
    policy.commit(s, before, acc[i], sent[j]);
    for (std::size_t a = 0; a != Arrays; ++a) next.at[a][i] = s[a];
  });
}

}  // namespace cuda_correct

template <>
class engine<correct::none, backend::cuda> {
 public:
  engine(const backend::cuda& be, const correct::none&, std::size_t n)
      : stream_(be.stream), n_(n), grid_(cuda_launch::grid_for(n)) {}

  /// Only the finiteness check: acc is g.
  void update(const correct::none&, std::span<const float> g, step_status* status) {
    cuda_correct::check_finite<<<grid_, cuda_launch::block_threads, 0, stream_>>>(g.data(), n_, status);
    cuda_check(cudaGetLastError(), "check_finite (launch)");
  }
  std::span<const float> acc(std::span<const float> g) const noexcept { return g; }
  /// Queues acc (= g) into `out` and its finiteness check into `status`.
  void preview(const correct::none& policy, std::span<const float> g, std::span<float> out, step_status* status) {
    cuda_check(cudaMemcpyAsync(out.data(), g.data(), n_ * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpyAsync (preview)");
    update(policy, g, status);
  }
  void commit(const correct::none&, std::span<const std::uint32_t>, std::span<const float>,
              const step_status*) noexcept {}
  void accept() noexcept {}
  std::span<const float> committed(std::size_t) const noexcept { return {}; }
  void load_committed(std::size_t, std::span<const float>) noexcept {}

 private:
  cudaStream_t stream_;
  std::size_t n_;
  unsigned grid_;
};

template <elementwise_corrector Policy>
class engine<Policy, backend::cuda> {
  static constexpr std::size_t arrays = Policy::state_arrays;
  static constexpr bool own_acc = Policy::acc_state < 0;
  using pointers = cuda_correct::state_arrays<arrays>;

 public:
  engine(const backend::cuda& be, const Policy&, std::size_t n)
      : backend_(be),
        n_(n),
        grid_(cuda_launch::grid_for(n)),
        acc_(own_acc ? n : 0),
        chunk_sum_(scales_gradient<Policy>() ? chunk_count(n) : 0),
        scale_(1),
        staging_(arrays > 0 ? n : 0) {
    for (std::size_t a = 0; a != arrays; ++a) {
      committed_[a] = device_buffer<float>(n);
      next_[a] = device_buffer<float>(n);
    }
  }

  /// Queues the new state and acc for every element; a NaN or infinity in acc raises
  /// the status's flag. A clip's factor is computed on the device (no read-back).
  void update(const Policy& policy, std::span<const float> g, step_status* status) {
    const float* scale = nullptr;
    if constexpr (scales_gradient<Policy>()) {
      if (policy.needs_norm()) {
        const std::size_t chunks = chunk_count(n_);
        const auto blocks = static_cast<unsigned>((chunks * 8 + cuda_launch::block_threads - 1) /
                                                  cuda_launch::block_threads);
        cuda_correct::chunk_sums_of_squares<<<blocks, cuda_launch::block_threads, 0, backend_.stream>>>(
            g.data(), n_, chunk_sum_.data());
        cuda_correct::gradient_scale<<<1, 1, 0, backend_.stream>>>(policy, chunk_sum_.data(), chunks, scale_.data());
        scale = scale_.data();
      }
    }
    cuda_correct::update<Policy, arrays, own_acc><<<grid_, cuda_launch::block_threads, 0, backend_.stream>>>(
        policy, addresses(committed_), addresses(next_), acc_.data(), g.data(), scale, n_, status);
    cuda_check(cudaGetLastError(), "corrector update (launch)");
  }

  std::span<const float> acc(std::span<const float>) const noexcept {
    if constexpr (own_acc) {
      return {acc_.data(), n_};
    } else {
      return {next_[static_cast<std::size_t>(Policy::acc_state)].data(), n_};
    }
  }

  /// Queues into `out` the acc that update() would compute now, and its finiteness
  /// check into `status`. The committed state is untouched (update() writes only the
  /// next copy, which the next step rewrites whole).
  void preview(const Policy& policy, std::span<const float> g, std::span<float> out, step_status* status) {
    update(policy, g, status);
    cuda_check(cudaMemcpyAsync(out.data(), acc({}).data(), n_ * sizeof(float), cudaMemcpyDeviceToDevice,
                               backend_.stream),
               "cudaMemcpyAsync (preview)");
  }

  /// Queues the commit of the sent entries (index and sent span the workspace; the
  /// count is in the status). Does nothing on the device if the step was rejected.
  void commit(const Policy& policy, std::span<const std::uint32_t> index, std::span<const float> sent,
              const step_status* status) {
    // grid_ (sized for n) covers any count; no device query while a graph is captured.
    cuda_correct::commit<Policy, arrays><<<grid_, cuda_launch::block_threads, 0, backend_.stream>>>(
        policy, addresses(committed_), addresses(next_), acc({}).data(), index.data(), sent.data(), status);
    cuda_check(cudaGetLastError(), "corrector commit (launch)");
  }

  void accept() noexcept { std::swap(committed_, next_); }

  /// Committed array `a`, copied to the host.
  std::span<const float> committed(std::size_t a) const {
    backend_.to_host(committed_[a].data(), n_, staging_.data());
    return staging_;
  }
  void load_committed(std::size_t a, std::span<const float> values) {
    backend_.to_device(values.data(), n_, committed_[a].data());
  }

 private:
  static pointers addresses(const std::array<device_buffer<float>, arrays + 1>& buffers) {
    pointers p{};
    for (std::size_t a = 0; a != arrays; ++a) p.at[a] = const_cast<float*>(buffers[a].data());
    return p;
  }

  backend::cuda backend_;
  std::size_t n_;
  unsigned grid_;
  std::array<device_buffer<float>, arrays + 1> committed_;
  std::array<device_buffer<float>, arrays + 1> next_;
  device_buffer<float> acc_;
  device_buffer<double> chunk_sum_;
  device_buffer<float> scale_;
  mutable std::vector<float> staging_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
