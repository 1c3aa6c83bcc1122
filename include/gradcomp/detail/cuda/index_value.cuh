/// \file detail/cuda/index_value.cuh
/// The device decoder behind device_messages.cuh's decode and accumulate. (Every
/// backend's encoder, backend::cuda's included, is detail/encode_index_value.hpp.)
///
/// Messages with raw32 indices and f32, f16 or bf16 values, without checksum, are read
/// by kernels, entry j by thread j, after the header is checked on the host. Every other
/// coding goes through the host's message_reader on a copy of the message, so all
/// backends accept exactly the same bytes. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/float_formats.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/detail/wire.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/message.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cuda_messages {

/// Whether kernels read messages of these codings themselves.
constexpr bool device_read(index_coding index, value_coding value, bool checksum) noexcept {
  return index == index_coding::raw32 && !checksum &&
         (value == value_coding::f32 || value == value_coding::f16 || value == value_coding::bf16);
}

__device__ inline float get_value(value_coding coding, const std::byte* section, std::uint64_t j) {
  switch (coding) {
    case value_coding::f16: return half_to_float(load_le<std::uint16_t>(section + 2 * j));
    case value_coding::bf16: return bfloat_to_float(load_le<std::uint16_t>(section + 2 * j));
    default: return load_le<float>(section + 4 * j);
  }
}

/// The first entry positions that break the rules; ~0 where none does.
struct entry_faults {
  unsigned long long bad_index_at;
  unsigned long long bad_value_at;
};

template <class = void>
__global__ void check_entries(const std::byte* message, std::uint64_t count, std::uint64_t n, value_coding coding,
                              entry_faults* faults) {
  const std::byte* indices = message + message_header::size;
  const std::byte* values = indices + 4 * count;
  cuda_launch::grid_stride(count, [&](std::uint64_t j) {
    const std::uint32_t i = load_le<std::uint32_t>(indices + 4 * j);
    if (i >= n || (j > 0 && i <= load_le<std::uint32_t>(indices + 4 * (j - 1)))) atomicMin(&faults->bad_index_at, j);
    if (magnitude_key(get_value(coding, values, j)) >= non_finite_key) atomicMin(&faults->bad_value_at, j);
  });
}

/// dense[i] += scale * value for every entry; indices are distinct, so no atomics.
template <class = void>
__global__ void add_message(const std::byte* message, std::uint64_t count, value_coding coding, float scale,
                            float* dense) {
  const std::byte* indices = message + message_header::size;
  const std::byte* values = indices + 4 * count;
  cuda_launch::grid_stride(count, [&](std::uint64_t j) {
    const std::uint32_t i = load_le<std::uint32_t>(indices + 4 * j);
    dense[i] = __fadd_rn(dense[i], __fmul_rn(scale, get_value(coding, values, j)));
  });
}

/// values[j] = the decoded value of entry j, for j < count, of a message of `entries`.
template <class = void>
__global__ void message_values(const std::byte* message, std::uint64_t entries, value_coding coding,
                               std::uint64_t count, float* values) {
  const std::byte* section = message + message_header::size + 4 * entries;
  cuda_launch::grid_stride(count, [&](std::uint64_t j) { values[j] = get_value(coding, section, j); });
}

template <class = void>
__global__ void add_entries(const std::uint32_t* index, const float* values, std::uint64_t count, float scale,
                            float* dense) {
  cuda_launch::grid_stride(count, [&](std::uint64_t j) {
    dense[index[j]] = __fadd_rn(dense[index[j]], __fmul_rn(scale, values[j]));
  });
}

}  // namespace cuda_messages

/// Checks messages in device memory and adds them to device tensors, each call queued on
/// the execution context it is given (a stream on the decoder's device). Workspace comes
/// from the backend it was made with and grows to the largest message seen.
class device_decoder {
 public:
  /// A message that passed check(): its header, read on the host.
  struct checked {
    message_header header;
    std::span<const std::byte> bytes;
  };

  explicit device_decoder(const backend::cuda& be)
      : backend_(be), faults_(be.allocate<cuda_messages::entry_faults>(1)) {}

  /// Checks the whole message at `bytes` (device memory) for a tensor of n elements:
  /// the header on the host, then every entry. Writes no tensor.
  /// \throws gradcomp::error (corrupt_message) naming the first fault, or
  ///         (invalid_argument) if the message's n is not `n`; `who` starts the text.
  checked check(const backend::cuda& on, std::span<const std::byte> bytes, std::size_t n, const char* who) {
    std::byte head[message_header::size] = {};
    if (bytes.size() >= message_header::size) on.to_host(bytes.data(), message_header::size, head);
    const message_header h = read_header(std::span<const std::byte>(head, sizeof head), bytes.size());
    // The host's order: header, checksum, n, entries (the same error for the same bytes).
    if (!cuda_messages::device_read(h.index, h.value, (h.flags & message_header::flag_checksum) != 0)) {
      const message_reader reader(host_copy(on, bytes));
      require_size(h, n, who);
      reader.validate_entries();
      return {h, bytes};
    }
    require_size(h, n, who);
    cuda_check(cudaMemsetAsync(faults_.data(), 0xFF, sizeof(cuda_messages::entry_faults), on.stream),
               "cudaMemsetAsync");
    if (h.count > 0) {
      cuda_messages::check_entries<<<cuda_launch::grid_for(h.count), cuda_launch::block_threads, 0, on.stream>>>(
          bytes.data(), h.count, h.n, h.value, faults_.data());
      cuda_check(cudaGetLastError(), "check_entries (launch)");
    }
    const cuda_messages::entry_faults faults = on.read(faults_.data());
    if (faults.bad_index_at != ~0ull) {
      std::uint32_t index = 0;
      on.to_host(reinterpret_cast<const std::uint32_t*>(bytes.data() + message_header::size) + faults.bad_index_at,
                       1, &index);
      report_bad_index(index, faults.bad_index_at, h.n);
    }
    require(faults.bad_value_at == ~0ull, errc::corrupt_message, "message value at position ", faults.bad_value_at,
            " is not finite");
    return {h, bytes};
  }

  /// Queues `dense += scale * entries` of a checked message (dense: device memory).
  void add(const backend::cuda& on, const checked& m, std::span<float> dense, float scale) {
    const message_header& h = m.header;
    if (h.count == 0) return;
    const unsigned grid = cuda_launch::grid_for(h.count);
    if (cuda_messages::device_read(h.index, h.value, (h.flags & message_header::flag_checksum) != 0)) {
      cuda_messages::add_message<<<grid, cuda_launch::block_threads, 0, on.stream>>>(m.bytes.data(), h.count, h.value,
                                                                                    scale, dense.data());
      cuda_check(cudaGetLastError(), "add_message (launch)");
      return;
    }
    decode_on_host(on, m);
    if (index_.size() < index_host_.size()) {
      index_ = backend_.allocate<std::uint32_t>(index_host_.size());
      values_ = backend_.allocate<float>(index_host_.size());
    }
    on.to_device(index_host_.data(), index_host_.size(), index_.data());
    on.to_device(values_host_.data(), values_host_.size(), values_.data());
    cuda_messages::add_entries<<<grid, cuda_launch::block_threads, 0, on.stream>>>(index_.data(), values_.data(),
                                                                                  h.count, scale, dense.data());
    cuda_check(cudaGetLastError(), "add_entries (launch)");
    // The staging buffers are reused by the next call: let this kernel finish first.
    cuda_check(cudaStreamSynchronize(on.stream), "cudaStreamSynchronize");
  }

  /// Queues the first out.size() values of a checked message, in entry order, into
  /// `out` (device memory).
  void values(const backend::cuda& on, const checked& m, std::span<float> out) {
    const message_header& h = m.header;
    const std::size_t count = std::min<std::size_t>(out.size(), h.count);
    if (count == 0) return;
    if (cuda_messages::device_read(h.index, h.value, (h.flags & message_header::flag_checksum) != 0)) {
      cuda_messages::message_values<<<cuda_launch::grid_for(count), cuda_launch::block_threads, 0, on.stream>>>(
          m.bytes.data(), h.count, h.value, count, out.data());
      cuda_check(cudaGetLastError(), "message_values (launch)");
      return;
    }
    decode_on_host(on, m);
    on.to_device(values_host_.data(), count, out.data());
  }

 private:
  // The entries of a message that the kernels do not read, into index_host_ and values_host_.
  void decode_on_host(const backend::cuda& on, const checked& m) {
    index_host_.clear();
    values_host_.clear();
    message_reader(host_copy(on, m.bytes)).visit([&](std::uint32_t i, float v) {
      index_host_.push_back(i);
      values_host_.push_back(v);
    });
  }

  static void require_size(const message_header& h, std::size_t n, const char* who) {
    require(h.n == n, errc::invalid_argument, who, ": dense.size() = ", n, " does not match the message's n = ", h.n);
  }

  std::span<const std::byte> host_copy(const backend::cuda& on, std::span<const std::byte> bytes) {
    message_host_.resize(bytes.size());
    on.to_host(bytes.data(), bytes.size(), message_host_.data());
    return message_host_;
  }

  backend::cuda backend_;
  device_buffer<cuda_messages::entry_faults> faults_;
  std::vector<std::byte> message_host_;
  std::vector<std::uint32_t> index_host_;
  std::vector<float> values_host_;
  device_buffer<std::uint32_t> index_;
  device_buffer<float> values_;
};

}  // namespace detail

GRADCOMP_NAMESPACE_END
