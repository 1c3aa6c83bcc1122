/// \file comm/exchange_memory.hpp
/// The memory work of an exchange (comm::cyclic_topk, comm::sparse_allreduce) in the
/// memory of the compressor it serves, keyed on the compressor's backend: reading a
/// message's indices and values, and adding sums into a dense tensor. On memory the host
/// may read it runs on the calling thread (the entries are few); elsewhere (backend::cuda;
/// opaque_host in the tests) it is queued on the backend, written once over its
/// primitives and detail/codec/decode.hpp. The spans are raw views of that memory. Not
/// API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/held_memory.hpp>
#include <gradcomp/memory.hpp>
#include <gradcomp/message.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// An exchange's memory work for compressors on `Backend`.
template <class Backend>
class exchange_memory;

/// Memory the host may read: the messages are read and the sums added on the calling
/// thread.
template <class Backend>
  requires Backend::host_accessible
class exchange_memory<Backend> {
 public:
  explicit exchange_memory(const Backend& /*compressor's backend*/) noexcept {}

  /// The first out.size() indices of the message at `bytes`.
  void indices_of(std::span<const std::byte> bytes, std::span<std::uint32_t> out) const {
    std::size_t j = 0;
    message_reader(bytes).visit([&](std::uint32_t i, float) {
      if (j < out.size()) out[j++] = i;
    });
  }
  /// The first out.size() values of the message at `bytes` (of a tensor of n
  /// elements), as the receiver decodes them.
  void values_of(std::span<const std::byte> bytes, std::size_t /*n*/, std::span<float> out) const {
    std::size_t j = 0;
    message_reader(bytes).visit([&](std::uint32_t, float v) {
      if (j < out.size()) out[j++] = v;
    });
  }
  /// `index` readable on the host.
  std::span<const std::uint32_t> on_host(std::span<const std::uint32_t> index) const noexcept { return index; }
  /// dense[index[j]] += scale * sums[j].
  void add(std::span<const std::uint32_t> index, std::span<const float> sums, std::span<float> dense,
           float scale) const noexcept {
    for (std::size_t j = 0; j < index.size(); ++j) dense[index[j]] += scale * sums[j];
  }
  [[nodiscard]] static std::size_t held_bytes() noexcept { return 0; }
};

/// Memory the host may not read: the work is queued on the backend (its stream).
template <class Backend>
  requires(!Backend::host_accessible)
class exchange_memory<Backend> {
 public:
  explicit exchange_memory(const Backend& be) : backend_(be), decoder_(be) {}

  /// The first out.size() indices of the leader's message at `bytes`, which is raw32
  /// coded: its index section is that array, little-endian.
  void indices_of(std::span<const std::byte> bytes, std::span<std::uint32_t> out) const {
    backend_.for_each(out.size(), decoding::raw32_index{bytes.data() + message_header::size, out.data()});
  }
  /// The first out.size() values of the message at `bytes` (of a tensor of n elements),
  /// as the receiver decodes them.
  void values_of(std::span<const std::byte> bytes, std::size_t n, std::span<float> out) {
    decoder_.values(backend_, decoder_.check(backend_, bytes, n, "cyclic_topk"), out);
  }
  /// A host copy of `index`.
  std::span<const std::uint32_t> on_host(std::span<const std::uint32_t> index) {
    index_host_.resize(index.size());
    backend_.to_host(index.data(), index.size(), index_host_.data());
    return index_host_;
  }
  /// dense[index[j]] += scale * sums[j].
  void add(std::span<const std::uint32_t> index, std::span<const float> sums, std::span<float> dense,
           float scale) const {
    backend_.for_each(index.size(), scatter_add{index.data(), sums.data(), scale, dense.data()});
  }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return decoder_.held_bytes() + bytes_held(index_host_); }

 private:
  Backend backend_;
  message_decoder<Backend> decoder_;
  std::vector<std::uint32_t> index_host_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
