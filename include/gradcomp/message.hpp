/// \file message.hpp
/// The wire format: a fixed little-endian header followed by an index section and a
/// value section; decoding and accumulation that trust nothing in the bytes.
///
/// Header layout (56 bytes, all fields little-endian):
///
/// | offset | size | field                                                  |
/// |-------:|-----:|--------------------------------------------------------|
/// |      0 |    4 | magic "GCMP"                                           |
/// |      4 |    2 | format version (1)                                     |
/// |      6 |    1 | index coding (gradcomp::index_coding)                  |
/// |      7 |    1 | value coding (gradcomp::value_coding)                  |
/// |      8 |    4 | flags (bit 0: checksum present)                        |
/// |     12 |    4 | CRC-32C of the message with this field read as 0; 0    |
/// |        |      | without the flag                                       |
/// |     16 |    8 | n, elements of the dense tensor                        |
/// |     24 |    8 | count, entries in the message                          |
/// |     32 |    8 | bytes of the index section                             |
/// |     40 |    8 | bytes of the value section                             |
/// |     48 |    4 | value parameter: f32 scale (int8, ternary), norm (qsgd) |
/// |     52 |    4 | codec parameter: u32 levels (qsgd)                     |
///
/// Parameters a coding does not use must be zero. docs/wire-format.md has the sections.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/codec/sections.hpp>
#include <gradcomp/detail/core/wire.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The fixed part of every message.
struct message_header {
  static constexpr std::uint32_t magic = 0x504D4347u;  ///< "GCMP" read as little-endian u32
  static constexpr std::uint16_t version = 1;          ///< the format version this build writes and reads
  static constexpr std::size_t size = 56;              ///< bytes of the header
  static constexpr std::uint32_t flag_checksum = 1u;   ///< flags bit: a CRC-32C is present
  /// Largest dense length a message can describe: indices are 32-bit.
  static constexpr std::uint64_t max_n = std::numeric_limits<std::uint32_t>::max();

  index_coding index = index_coding::raw32;  ///< how the index section is written
  value_coding value = value_coding::f32;    ///< how the value section is written
  std::uint32_t flags = 0;                   ///< flag_checksum, or 0
  std::uint32_t checksum = 0;                ///< CRC-32C of the message with this field read as 0
  std::uint64_t n = 0;                       ///< elements of the dense tensor
  std::uint64_t count = 0;                   ///< entries in the message
  std::uint64_t index_bytes = 0;             ///< bytes of the index section
  std::uint64_t value_bytes = 0;             ///< bytes of the value section
  float value_param = 0.0f;                  ///< the value coding's scale (int8, ternary) or norm (qsgd)
  std::uint32_t codec_param = 0;             ///< qsgd's levels
};

/// A compressed tensor as produced by compressor::compress: a view of the caller's
/// buffer, valid while that buffer is, in the memory `Memory` where the compressor's
/// backend writes messages (message: host memory; device_message: device memory, whose
/// bytes() is a device_span that host functions refuse at compile time).
template <class Memory>
class basic_message {
 public:
  using bytes_type = span_in<Memory, const std::byte>;  ///< the view of the bytes

  basic_message() = default;
  /// A view of the message at `bytes`, of `count` entries of a tensor of n elements.
  basic_message(bytes_type bytes, std::size_t n, std::size_t count) noexcept : bytes_(bytes), n_(n), count_(count) {}

  /// The bytes to send (header and sections).
  [[nodiscard]] bytes_type bytes() const noexcept { return bytes_; }
  /// Entries sent.
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  /// Elements of the dense tensor.
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// Dense float32 size over message size.
  [[nodiscard]] double ratio() const noexcept {
    return bytes_.empty() ? 0.0 : static_cast<double>(n_) * sizeof(float) / static_cast<double>(bytes_.size());
  }

 private:
  bytes_type bytes_;
  std::size_t n_ = 0;
  std::size_t count_ = 0;
};

/// A message in host memory (backend::host, backend::kokkos).
using message = basic_message<host_memory>;
/// A message in device memory (backend::cuda): decode and accumulate it with the
/// backend (device_messages.cuh), or copy it to the host first.
using device_message = basic_message<device_memory>;

/// A decoded message on the host.
struct sparse_vector {
  std::uint64_t n = 0;                 ///< elements of the dense tensor
  std::vector<std::uint32_t> indices;  ///< ascending, each < n
  std::vector<float> values;           ///< as the receiver sees them (after quantisation)
};

namespace detail {

GRADCOMP_HOST_DEVICE inline void write_header(std::byte* p, const message_header& h) noexcept {
  store_le<std::uint32_t>(p + 0, message_header::magic);
  store_le<std::uint16_t>(p + 4, message_header::version);
  store_le<std::uint8_t>(p + 6, static_cast<std::uint8_t>(h.index));
  store_le<std::uint8_t>(p + 7, static_cast<std::uint8_t>(h.value));
  store_le<std::uint32_t>(p + 8, h.flags);
  store_le<std::uint32_t>(p + 12, h.checksum);
  store_le<std::uint64_t>(p + 16, h.n);
  store_le<std::uint64_t>(p + 24, h.count);
  store_le<std::uint64_t>(p + 32, h.index_bytes);
  store_le<std::uint64_t>(p + 40, h.value_bytes);
  store_le<float>(p + 48, h.value_param);
  store_le<std::uint32_t>(p + 52, h.codec_param);
}

/// CRC-32C of a whole message with its checksum field read as zero, so that a flipped
/// header bit (a scale, a count) is caught as well as a flipped payload bit.
inline std::uint32_t message_checksum(std::span<const std::byte> bytes) noexcept {
  constexpr std::byte zeros[4] = {};
  std::uint32_t c = crc32c_update(crc32c_init, bytes.data(), 12);
  c = crc32c_update(c, zeros, 4);
  c = crc32c_update(c, bytes.data() + 16, bytes.size() - 16);
  return crc32c_final(c);
}

/// The fields of the 56-byte header at `p`, as stored (little-endian, at fixed offsets),
/// unchecked: read_header checks them on the host, the decoder's parse_header where the
/// message is (detail/codec/decode.hpp).
GRADCOMP_HOST_DEVICE inline message_header header_fields(const std::byte* p) noexcept {
  message_header h;
  h.index = static_cast<index_coding>(load_le<std::uint8_t>(p + 6));
  h.value = static_cast<value_coding>(load_le<std::uint8_t>(p + 7));
  h.flags = load_le<std::uint32_t>(p + 8);
  h.checksum = load_le<std::uint32_t>(p + 12);
  h.n = load_le<std::uint64_t>(p + 16);
  h.count = load_le<std::uint64_t>(p + 24);
  h.index_bytes = load_le<std::uint64_t>(p + 32);
  h.value_bytes = load_le<std::uint64_t>(p + 40);
  h.value_param = load_le<float>(p + 48);
  h.codec_param = load_le<std::uint32_t>(p + 52);
  return h;
}

/// Reads and checks the fixed header of a message of `total` bytes, of which `head`
/// holds the first min(total, 56): every field, and the section lengths against
/// `total`. The checksum and the entries are not checked here.
inline message_header read_header(std::span<const std::byte> head, std::uint64_t total) {
  require(total >= message_header::size && head.size() >= message_header::size, errc::corrupt_message, "message is ",
          total, " bytes, shorter than the ", message_header::size, "-byte header");
  const std::byte* p = head.data();
  const message_header h = header_fields(p);
  const auto magic = load_le<std::uint32_t>(p);
  require(magic == message_header::magic, errc::corrupt_message, "message magic is 0x", std::hex, magic,
          ", expected 0x", message_header::magic, " (\"GCMP\")");
  const auto version = load_le<std::uint16_t>(p + 4);
  require(version == message_header::version, errc::corrupt_message, "message format version is ", version,
          ", this build reads version ", message_header::version);

  require(is_wire_index_coding(h.index), errc::corrupt_message, "message index coding ", static_cast<unsigned>(h.index),
          " is unknown");
  require(is_wire_value_coding(h.value), errc::corrupt_message, "message value coding ", static_cast<unsigned>(h.value),
          " is unknown");
  require((h.flags & ~message_header::flag_checksum) == 0, errc::corrupt_message, "message flags 0x", std::hex, h.flags,
          " contain unknown bits");
  require(h.n >= 1 && h.n <= message_header::max_n, errc::corrupt_message, "message n = ", h.n, " is outside [1, ",
          message_header::max_n, "]");
  require(h.count <= h.n, errc::corrupt_message, "message count = ", h.count, " exceeds n = ", h.n);
  const std::uint64_t room = total - message_header::size;
  require(h.index_bytes <= room && h.value_bytes <= room - h.index_bytes, errc::corrupt_message, "message sections (",
          h.index_bytes, " + ", h.value_bytes, " bytes) overrun the ", room, " bytes after the header");
  require(h.index_bytes + h.value_bytes == room, errc::corrupt_message, "message has ",
          room - h.index_bytes - h.value_bytes, " trailing bytes after its sections");
  check_section_sizes(h);
  require((h.flags & message_header::flag_checksum) != 0 || h.checksum == 0, errc::corrupt_message,
          "message has checksum 0x", std::hex, h.checksum, " but no checksum flag");
  return h;
}

/// The index of the first entry that breaks the order rules (ascending, below n).
inline void report_bad_index(std::uint64_t index, std::uint64_t position, std::uint64_t n) {
  fail(errc::corrupt_message, "message index ", index, " at position ", position,
       " is out of range or not ascending (n = ", n, ")");
}

/// Parses and checks a whole message before anyone writes a byte of output: header
/// fields, section lengths against the buffer, the checksum, and (validate_entries)
/// every index and value.
class message_reader {
 public:
  explicit message_reader(std::span<const std::byte> bytes) : bytes_(bytes), h_(read_header(bytes, bytes.size())) {
    if (h_.flags & message_header::flag_checksum) {
      const auto crc = message_checksum(bytes);
      require(crc == h_.checksum, errc::corrupt_message, "message checksum 0x", std::hex, h_.checksum,
              " does not match its content (0x", crc, ")");
    }
  }

  [[nodiscard]] const message_header& header() const noexcept { return h_; }

  /// Calls `f(index, value)` for every entry in order. Call validate_entries() first.
  template <class F>
  void visit(F&& f) const {
    const std::byte* sections = bytes_.data() + message_header::size;
    value_decoder(h_, sections + h_.index_bytes).visit([&](const auto& values) {
      std::size_t j = 0;
      for_each_index(h_, sections, [&](std::uint32_t index) {
        f(index, values(j));
        ++j;
      });
    });
  }

  /// Checks that indices are strictly ascending and below n, that the index section
  /// holds exactly `count` of them, that bit-packed sections have zero padding, and
  /// that every value is finite.
  void validate_entries() const {
    std::uint64_t seen = 0;
    std::uint64_t next_allowed = 0;  // strictly ascending: each index >= previous + 1
    bool ordered = true;
    bool finite = true;
    std::uint64_t bad_position = 0;
    std::uint64_t bad_index = 0;
    const std::byte* sections = bytes_.data() + message_header::size;
    validate_index_section(h_, sections, [&](std::uint64_t index) {
      if (ordered && (index < next_allowed || index >= h_.n)) {
        ordered = false;
        bad_position = seen;
        bad_index = index;
      }
      next_allowed = index + 1;
      ++seen;
    });
    require(seen == h_.count, errc::corrupt_message, "message index section holds ", seen, " indices, header says ",
            h_.count);
    if (!ordered) report_bad_index(bad_index, bad_position, h_.n);
    check_value_padding(h_, sections + h_.index_bytes);
    value_decoder(h_, sections + h_.index_bytes).visit([&](const auto& values) {
      for (std::uint64_t j = 0; j < h_.count && finite; ++j) {
        if (!std::isfinite(values(static_cast<std::size_t>(j)))) {
          finite = false;
          bad_position = j;
        }
      }
    });
    require(finite, errc::corrupt_message, "message value at position ", bad_position, " is not finite");
  }

 private:
  std::span<const std::byte> bytes_;
  message_header h_;
};

}  // namespace detail

/// Reads a message into host vectors. Throws gradcomp::error (corrupt_message) if
/// anything in `bytes` is inconsistent; nothing is returned then.
inline sparse_vector decode(std::span<const std::byte> bytes) {
  const detail::message_reader reader(bytes);
  reader.validate_entries();
  sparse_vector out;
  out.n = reader.header().n;
  out.indices.reserve(static_cast<std::size_t>(reader.header().count));
  out.values.reserve(static_cast<std::size_t>(reader.header().count));
  reader.visit([&](std::uint32_t index, float value) {
    out.indices.push_back(index);
    out.values.push_back(value);
  });
  return out;
}

namespace detail {
/// `sum + scale * value`, what accumulate writes: rounded as two operations on a device
/// too, whatever nvcc's --fmad, so that every backend adds the same bits.
GRADCOMP_HOST_DEVICE inline float added(float sum, float scale, float value) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(sum, __fmul_rn(scale, value));
#else
  const float term = scale * value;  // a statement of its own: no fused multiply-add
  return sum + term;
#endif
}

/// dense[index[j]] += scale * values[j]: the scatter-add of accumulate (a message's
/// indices are distinct, so no two j write one entry).
struct scatter_add {
  const std::uint32_t* index;
  const float* values;
  float scale;
  float* dense;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    dense[index[j]] = added(dense[index[j]], scale, values[j]);
  }
};

/// The dense tensor (the backend's memory) and scale that a message will be added to,
/// which accumulate's checks make sure stay finite.
struct sum_target {
  const float* dense = nullptr;
  float scale = 0.0f;
};

/// Whether the address ranges of two views meet: accumulate refuses a dense tensor that
/// shares memory with the message it reads, which its own writes would change under it.
inline bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

/// \throws gradcomp::error (invalid_argument) if `dense` shares memory with `bytes`.
inline void require_apart(const char* who, const void* bytes, std::size_t size, const float* dense, std::size_t n) {
  require(!overlap(bytes, size, dense, n * sizeof(float)), errc::invalid_argument, who,
          ": dense shares memory with the message (its writes would change the message while it is read)");
}

/// \throws gradcomp::error (non_finite) naming entry `j`: dense[index] + scale * value
///         is not finite.
[[noreturn]] inline void fail_overflow(const char* who, std::uint32_t index, float dense, float scale, float value) {
  fail(errc::non_finite, who, ": dense[", index, "] + scale * value = ", dense, " + ", scale, " * ", value,
       " is not finite; dense is unchanged");
}
}  // namespace detail

/// decode() on `context`, for a backend whose messages are host memory: the same
/// result (decoding a message is the host's work there).
template <class Backend>
  requires std::is_same_v<typename Backend::message_memory, host_memory>
sparse_vector decode(const Backend& /*context*/, std::span<const std::byte> bytes) {
  return decode(bytes);
}

/// A message in device memory cannot be decoded by the host's reader: refused at
/// compile time (where this overload is chosen), naming the calls that can.
template <class Byte>
sparse_vector decode(device_span<Byte> /*bytes*/) {
  static_assert(detail::never<Byte>,
                "gradcomp::decode(bytes) reads host memory, and these bytes are a device_span (a message in "
                "device memory): call decode(backend::cuda{...}, bytes) from device_messages.cuh, or copy the "
                "message to the host first");
  return {};
}

GRADCOMP_NAMESPACE_END
