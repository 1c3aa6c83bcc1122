/// \file detail/cuda/index_value.cuh
/// The index_value encoder on backend::cuda, and the device decoder behind
/// device_messages.cuh's decode and accumulate.
///
/// Messages with raw32 indices and f32, f16 or bf16 values, without checksum, are
/// written and read by kernels: the header by one thread, entry j by thread j. Every
/// other coding goes through the host code (detail::encode_message, message_reader) on
/// a copy of the selected entries or of the message, so all backends write and accept
/// exactly the same bytes. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/float_formats.hpp>
#include <gradcomp/detail/encode_index_value.hpp>
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
#include <optional>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cuda_messages {

/// Whether kernels write and read messages of these codings themselves.
constexpr bool device_coded(index_coding index, value_coding value, bool checksum) noexcept {
  return index == index_coding::raw32 && !checksum &&
         (value == value_coding::f32 || value == value_coding::f16 || value == value_coding::bf16);
}

GRADCOMP_HOST_DEVICE constexpr std::uint64_t value_size(value_coding value) noexcept { return value == value_coding::f32 ? 4 : 2; }

/// Writes value j of a device-coded value section; returns what the receiver decodes.
__device__ inline float put_value(value_coding coding, std::byte* section, std::uint64_t j, float v) {
  switch (coding) {
    case value_coding::f16: {
      const std::uint16_t h = float_to_half(v);
      store_le<std::uint16_t>(section + 2 * j, h);
      return half_to_float(h);
    }
    case value_coding::bf16: {
      const std::uint16_t b = float_to_bfloat(v);
      store_le<std::uint16_t>(section + 2 * j, b);
      return bfloat_to_float(b);
    }
    default:
      store_le<float>(section + 4 * j, v);
      return v;
  }
}

__device__ inline float get_value(value_coding coding, const std::byte* section, std::uint64_t j) {
  switch (coding) {
    case value_coding::f16: return half_to_float(load_le<std::uint16_t>(section + 2 * j));
    case value_coding::bf16: return bfloat_to_float(load_le<std::uint16_t>(section + 2 * j));
    default: return load_le<float>(section + 4 * j);
  }
}

/// The whole message of a step, written unless the step's status holds a NaN.
template <class = void>
__global__ void write_message(const float* acc, const std::uint32_t* index, float value_scale, value_coding coding,
                              std::uint64_t n, std::byte* out, float* sent, step_status* status) {
  if (status->non_finite != 0) return;
  const std::uint64_t count = status->count;
  std::byte* indices = out + message_header::size;
  std::byte* values = indices + 4 * count;
  cuda_launch::grid_stride(count, [&](std::uint64_t j) {
    const std::uint32_t i = index[j];
    store_le<std::uint32_t>(indices + 4 * j, i);
    sent[j] = put_value(coding, values, j, scaled_value(acc[i], value_scale));
  });
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    message_header h;
    h.index = index_coding::raw32;
    h.value = coding;
    h.n = n;
    h.count = count;
    h.index_bytes = 4 * count;
    h.value_bytes = value_size(coding) * count;
    write_header(out, h);
    status->bytes = message_header::size + h.index_bytes + h.value_bytes;
  }
}

/// values[j] = acc[index[j]] * value_scale for the selected entries (host-coded path).
template <class = void>
__global__ void gather_values(const float* acc, const std::uint32_t* index, float value_scale, float* values,
                              const step_status* status) {
  cuda_launch::grid_stride(status->count,
                           [&](std::uint64_t j) { values[j] = scaled_value(acc[index[j]], value_scale); });
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

template <>
class engine<encode::index_value, backend::cuda> {
 public:
  engine(const backend::cuda& be, const encode::index_value& policy, std::size_t n, std::size_t capacity)
      : backend_(be), n_(n), grid_(cuda_launch::grid_for(capacity)) {
    if (!on_device(policy)) {
      values_ = device_buffer<float>(capacity);
      index_host_.resize(capacity);
      values_host_.resize(capacity);
      sent_host_.resize(capacity);
      out_host_.resize(policy.max_bytes(n, capacity));
    }
  }

  /// The size of every message of `count` entries when it does not depend on the data.
  [[nodiscard]] std::optional<std::size_t> fixed_bytes(const encode::index_value& policy, std::size_t count) const {
    if (!on_device(policy)) return std::nullopt;
    return message_header::size + count * (4 + cuda_messages::value_size(policy.value));
  }

  /// Writes the message of the selected entries (index spans the workspace; the count
  /// is in the status) to `out` and what the receiver decodes to `sent`, both device
  /// memory, and its size into the status. Writes nothing if the status holds a NaN.
  void encode(const encode::index_value& policy, const encode_input& in, std::span<std::byte> out,
              std::span<float> sent, step_status* status) {
    const unsigned grid = grid_;  // computed once: no device query while a graph is captured
    if (on_device(policy)) {
      cuda_messages::write_message<<<grid, cuda_launch::block_threads, 0, backend_.stream>>>(
          in.acc.data(), in.index.data(), in.value_scale, policy.value, n_, out.data(), sent.data(), status);
      cuda_check(cudaGetLastError(), "write_message (launch)");
      return;
    }
    // Host-coded: one read of the status, then the entries, written by the host code.
    const step_status seen = backend_.read(status);
    if (seen.non_finite != 0) return;
    const std::size_t count = seen.count;
    cuda_messages::gather_values<<<grid, cuda_launch::block_threads, 0, backend_.stream>>>(
        in.acc.data(), in.index.data(), in.value_scale, values_.data(), status);
    cuda_check(cudaGetLastError(), "gather_values (launch)");
    backend_.to_host(in.index.data(), count, index_host_.data());
    backend_.to_host(values_.data(), count, values_host_.data());
    const std::uint64_t bytes =
        encode_message(policy, n_, std::span<const std::uint32_t>(index_host_.data(), count),
                       std::span<const float>(values_host_.data(), count), out_host_,
                       std::span<float>(sent_host_.data(), count), in.step);
    backend_.to_device(out_host_.data(), bytes, out.data());
    backend_.to_device(sent_host_.data(), count, sent.data());
    backend_.to_device(&bytes, 1, &status->bytes);
  }

 private:
  static bool on_device(const encode::index_value& policy) noexcept {
    return cuda_messages::device_coded(policy.index, policy.value, policy.checksum);
  }

  backend::cuda backend_;
  std::size_t n_;
  unsigned grid_;
  device_buffer<float> values_;  // host-coded path: gathered values, then their host copies
  std::vector<std::uint32_t> index_host_;
  std::vector<float> values_host_;
  std::vector<float> sent_host_;
  std::vector<std::byte> out_host_;
};

/// Checks messages in device memory and adds them to device tensors. Workspace grows
/// to the largest message seen.
class device_decoder {
 public:
  /// A message that passed check(): its header, read on the host.
  struct checked {
    message_header header;
    std::span<const std::byte> bytes;
  };

  explicit device_decoder(const backend::cuda& be) : backend_(be), faults_(1) {}

  /// Checks the whole message at `bytes` (device memory) for a tensor of n elements:
  /// the header on the host, then every entry. Writes no tensor.
  /// \throws gradcomp::error (corrupt_message) naming the first fault, or
  ///         (invalid_argument) if the message's n is not `n`; `who` starts the text.
  checked check(std::span<const std::byte> bytes, std::size_t n, const char* who) {
    std::byte head[message_header::size] = {};
    if (bytes.size() >= message_header::size) backend_.to_host(bytes.data(), message_header::size, head);
    const message_header h = read_header(std::span<const std::byte>(head, sizeof head), bytes.size());
    // The host's order: header, checksum, n, entries (the same error for the same bytes).
    if (!cuda_messages::device_coded(h.index, h.value, (h.flags & message_header::flag_checksum) != 0)) {
      const message_reader reader(host_copy(bytes));
      require_size(h, n, who);
      reader.validate_entries();
      return {h, bytes};
    }
    require_size(h, n, who);
    cuda_check(cudaMemsetAsync(faults_.data(), 0xFF, sizeof(cuda_messages::entry_faults), backend_.stream),
               "cudaMemsetAsync");
    if (h.count > 0) {
      cuda_messages::check_entries<<<cuda_launch::grid_for(h.count), cuda_launch::block_threads, 0,
                                     backend_.stream>>>(bytes.data(), h.count, h.n, h.value, faults_.data());
      cuda_check(cudaGetLastError(), "check_entries (launch)");
    }
    const cuda_messages::entry_faults faults = backend_.read(faults_.data());
    if (faults.bad_index_at != ~0ull) {
      std::uint32_t index = 0;
      backend_.to_host(reinterpret_cast<const std::uint32_t*>(bytes.data() + message_header::size) + faults.bad_index_at,
                       1, &index);
      report_bad_index(index, faults.bad_index_at, h.n);
    }
    require(faults.bad_value_at == ~0ull, errc::corrupt_message, "message value at position ", faults.bad_value_at,
            " is not finite");
    return {h, bytes};
  }

  /// Queues `dense += scale * entries` of a checked message (dense: device memory).
  void add(const checked& m, std::span<float> dense, float scale) {
    const message_header& h = m.header;
    if (h.count == 0) return;
    const unsigned grid = cuda_launch::grid_for(h.count);
    if (cuda_messages::device_coded(h.index, h.value, (h.flags & message_header::flag_checksum) != 0)) {
      cuda_messages::add_message<<<grid, cuda_launch::block_threads, 0, backend_.stream>>>(m.bytes.data(), h.count,
                                                                                          h.value, scale, dense.data());
      cuda_check(cudaGetLastError(), "add_message (launch)");
      return;
    }
    decode_on_host(m);
    if (index_.size() < index_host_.size()) {
      index_ = device_buffer<std::uint32_t>(index_host_.size());
      values_ = device_buffer<float>(index_host_.size());
    }
    backend_.to_device(index_host_.data(), index_host_.size(), index_.data());
    backend_.to_device(values_host_.data(), values_host_.size(), values_.data());
    cuda_messages::add_entries<<<grid, cuda_launch::block_threads, 0, backend_.stream>>>(
        index_.data(), values_.data(), h.count, scale, dense.data());
    cuda_check(cudaGetLastError(), "add_entries (launch)");
    // The staging buffers are reused by the next call: let this kernel finish first.
    cuda_check(cudaStreamSynchronize(backend_.stream), "cudaStreamSynchronize");
  }

  /// Queues the first out.size() values of a checked message, in entry order, into
  /// `out` (device memory).
  void values(const checked& m, std::span<float> out) {
    const message_header& h = m.header;
    const std::size_t count = std::min<std::size_t>(out.size(), h.count);
    if (count == 0) return;
    if (cuda_messages::device_coded(h.index, h.value, (h.flags & message_header::flag_checksum) != 0)) {
      cuda_messages::message_values<<<cuda_launch::grid_for(count), cuda_launch::block_threads, 0, backend_.stream>>>(
          m.bytes.data(), h.count, h.value, count, out.data());
      cuda_check(cudaGetLastError(), "message_values (launch)");
      return;
    }
    decode_on_host(m);
    backend_.to_device(values_host_.data(), count, out.data());
  }

 private:
  // The entries of a message that the kernels do not read, into index_host_ and values_host_.
  void decode_on_host(const checked& m) {
    index_host_.clear();
    values_host_.clear();
    message_reader(host_copy(m.bytes)).visit([&](std::uint32_t i, float v) {
      index_host_.push_back(i);
      values_host_.push_back(v);
    });
  }

  static void require_size(const message_header& h, std::size_t n, const char* who) {
    require(h.n == n, errc::invalid_argument, who, ": dense.size() = ", n, " does not match the message's n = ", h.n);
  }

  std::span<const std::byte> host_copy(std::span<const std::byte> bytes) {
    message_host_.resize(bytes.size());
    backend_.to_host(bytes.data(), bytes.size(), message_host_.data());
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
