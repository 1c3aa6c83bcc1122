/// \file detail/codec/decode.hpp
/// Decoding and accumulating messages in a backend's memory, written once over the
/// backend primitives: what backend::cuda runs for every coding (device_messages.cuh,
/// comm::nccl, cyclic_topk). backend::host's accumulate reads a message in one
/// sequential pass (message.hpp's message_reader), the fast path these are tested
/// against (tests/test_message.cpp runs this on backend::host and on a host backend
/// that declares its memory unreadable, over good and hostile messages).
///
/// The header is read on the host (56 bytes). Then the passes, each flagging what it
/// finds into one fault word in the backend's memory:
/// - the checksum, if flagged: a CRC-32C register per kilobyte, chained by one item;
/// - the index section into an index workspace: raw32 by entry; bitmap by an ordered
///   expansion of its bytes, after a check of the bits past n and a fixed-order sum of
///   the bytes' popcounts against the count; delta_bitpack by one item that walks the
///   blocks' widths (their layout), then per block its gaps' sum, one item's scan of
///   the sums, and per block its indices, each checked against n in 64 bits;
/// - every index below n and above the one before it; the value section's padding;
///   every value finite (decoded by the value_decoder the host's reader uses).
/// One read of the fault word ends the check. A clean message is decoded again by
/// add() and values() into the workspace, then scattered. A faulty one is copied to
/// the host and read by message_reader, which raises the host's error for the same
/// bytes: the texts of the two paths cannot drift. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/codec/sections.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/wire.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace decoding {

/// Whether a pass met a fault: bit 0 of the fault word.
inline constexpr std::uint32_t fault = 1u;

/// A fault, whatever the item: a message the host found unfit before any pass.
struct always_fault {
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const { return fault; }
};

/// scatter_add (message.hpp) where the message's fault word stayed 0: every check of
/// the message ran before on the same stream, so the word is final when this reads it.
struct scatter_add_if_clean {
  const std::uint32_t* faults;
  const std::uint32_t* index;
  const float* values;
  float scale;
  float* dense;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (*faults == 0) scatter_add{index, values, scale, dense}(j);
  }
};

/// The bits set in a byte, and the lowest one's place, in host and device code alike.
GRADCOMP_HOST_DEVICE constexpr unsigned bits_set(unsigned byte) noexcept {
  byte = byte - ((byte >> 1) & 0x55u);
  byte = (byte & 0x33u) + ((byte >> 2) & 0x33u);
  return (byte + (byte >> 4)) & 0x0Fu;
}
GRADCOMP_HOST_DEVICE constexpr unsigned lowest_bit(unsigned byte) noexcept {  // byte != 0
  unsigned at = 0;
  while ((byte & 1u) == 0) {
    byte >>= 1;
    ++at;
  }
  return at;
}

/// The tiles' CRC registers of the message.
struct checksum_parts {
  const std::byte* message;
  std::uint64_t bytes;
  std::uint32_t* parts;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t c) const { parts[c] = message_checksum_part(message, bytes, c); }
};
/// The chained checksum against the header's.
struct checksum_check {
  const std::byte* message;
  std::uint64_t bytes;
  const std::uint32_t* parts;
  std::uint32_t expected;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    return message_checksum_of_parts(message, bytes, parts) == expected ? 0u : fault;
  }
};

/// raw32: index[j] from the section.
struct raw32_index {
  const std::byte* section;
  std::uint32_t* index;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { index[j] = load_le<std::uint32_t>(section + 4 * j); }
};

/// bitmap: the bits of the last byte past n must be zero.
struct bitmap_tail {
  const std::byte* section;
  std::uint64_t n;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    const auto tail = static_cast<unsigned>(n % 8);
    return tail != 0 && (static_cast<unsigned>(section[bitmap_bytes(n) - 1]) >> tail) != 0 ? fault : 0u;
  }
};
/// bitmap: the bits set in byte b (summed, exactly, in double).
struct bitmap_byte_count {
  const std::byte* section;
  GRADCOMP_HOST_DEVICE double operator()(std::size_t b) const {
    return static_cast<double>(bits_set(static_cast<unsigned>(section[b])));
  }
};
/// bitmap: the set bits' count against the header's.
struct bitmap_count_check {
  const double* total;
  std::uint64_t count;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    return *total == static_cast<double>(count) ? 0u : fault;
  }
};
/// bitmap: byte b's set bits, as indices, once the count is known to fit.
struct bitmap_indices {
  const std::byte* section;
  const std::uint32_t* faults;
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t b, std::uint32_t* at) const {
    if (*faults != 0) return 0;
    unsigned byte = static_cast<unsigned>(section[b]);
    const auto made = static_cast<std::size_t>(bits_set(byte));
    if (at != nullptr) {
      for (; byte != 0; byte &= byte - 1) *at++ = static_cast<std::uint32_t>(8 * b + lowest_bit(byte));
    }
    return made;
  }
};

/// delta_bitpack: one block's place in the section.
struct delta_block_at {
  std::uint64_t offset;  // of its payload
  std::uint32_t width;
  std::uint32_t len;
};
/// delta_bitpack: one item walks the blocks' width bytes (validate_index_section's
/// structural checks, in its order).
struct delta_layout {
  const std::byte* section;
  std::uint64_t section_bytes, count;
  delta_block_at* blocks;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    std::uint64_t at = 0;
    std::uint64_t b = 0;
    for (std::uint64_t start = 0; start < count; start += delta_block, ++b) {
      const std::uint64_t len = count - start < delta_block ? count - start : delta_block;
      if (at >= section_bytes) return fault;
      const auto width = static_cast<unsigned>(section[at++]);
      if (width > 32) return fault;
      const std::uint64_t payload = (len * width + 7) / 8;
      if (payload > section_bytes - at) return fault;
      blocks[b] = {at, width, static_cast<std::uint32_t>(len)};
      at += payload;
    }
    return at == section_bytes ? 0u : fault;
  }
};
/// delta_bitpack: block b's padding bits are zero, once the layout is sound.
struct delta_padding {
  const std::byte* section;
  const delta_block_at* blocks;
  const std::uint32_t* faults;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t b) const {
    if (*faults != 0) return 0;
    const delta_block_at k = blocks[b];
    const std::uint64_t used = std::uint64_t{k.len} * k.width;
    return padding_is_zero(section + k.offset, used, (used + 7) / 8) ? 0u : fault;
  }
};
/// delta_bitpack: how far block b advances the next index (its gaps plus its length).
struct delta_advance {
  const std::byte* section;
  const delta_block_at* blocks;
  const std::uint32_t* faults;
  std::uint64_t* advance;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const {
    if (*faults != 0) return;
    const delta_block_at k = blocks[b];
    std::uint64_t sum = k.len;
    for (std::uint32_t j = 0; j < k.len; ++j) sum += read_bits(section + k.offset, std::uint64_t{j} * k.width, k.width);
    advance[b] = sum;
  }
};
/// delta_bitpack: each block's first "next index", an exclusive scan by one item.
struct delta_bases {
  std::uint64_t* advance;  // becomes the bases
  std::size_t blocks;
  const std::uint32_t* faults;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (*faults != 0) return;
    std::uint64_t next = 0;
    for (std::size_t b = 0; b < blocks; ++b) {
      const std::uint64_t a = advance[b];
      advance[b] = next;
      next += a;
    }
  }
};
/// delta_bitpack: block b's indices, each checked against n in 64 bits (a hostile gap
/// cannot wrap around).
struct delta_indices {
  const std::byte* section;
  const delta_block_at* blocks;
  const std::uint64_t* bases;
  const std::uint32_t* faults;
  std::uint64_t n;
  std::uint32_t* index;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t b) const {
    if (*faults != 0) return 0;
    const delta_block_at k = blocks[b];
    std::uint64_t next = bases[b];
    std::uint32_t found = 0;
    for (std::uint32_t j = 0; j < k.len; ++j) {
      const std::uint64_t i = next + read_bits(section + k.offset, std::uint64_t{j} * k.width, k.width);
      if (i >= n) found = fault;
      index[b * delta_block + j] = static_cast<std::uint32_t>(i);
      next = i + 1;
    }
    return found;
  }
};

/// Every index below n and above the one before it.
struct indices_in_order {
  const std::uint32_t* index;
  const std::uint32_t* faults;
  std::uint64_t n;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    if (*faults != 0) return 0;
    return index[j] >= n || (j > 0 && index[j] <= index[j - 1]) ? fault : 0u;
  }
};

/// The value section's padding (ternary, qsgd, int4) is zero.
struct value_padding {
  const std::byte* section;
  std::uint64_t used_bits, bytes;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    return padding_is_zero(section, used_bits, bytes) ? 0u : fault;
  }
};

/// Every value finite (-128 in int8, a qsgd level above levels, and -8 or a scale that
/// is not finite and non-negative in int4 decode to NaN).
template <class Values>
struct values_finite {
  Values values;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    return magnitude_key(values(j)) >= non_finite_key ? fault : 0u;
  }
};
/// out[j] = the value of entry j.
template <class Values>
struct decoded_values {
  Values values;
  float* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { out[j] = values(j); }
};

/// Whether a sum overflowed: bit 1 of the fault word (the message itself is sound).
inline constexpr std::uint32_t overflow = 2u;

/// Values held in an array, read as a value_decoder reads a section.
struct array_values {
  const float* values;
  GRADCOMP_HOST_DEVICE float operator()(std::size_t j) const { return values[j]; }
};

/// `overflow` if dense[index[j]] + scale * value j is not finite. An index outside dense
/// (a corrupt message's, which another pass reports) is skipped, not read.
template <class Values>
struct sum_finite {
  const std::uint32_t* index;
  Values values;
  float scale;
  const float* dense;
  std::uint64_t n;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    const std::uint32_t i = index[j];
    if (i >= n) return 0u;
    return magnitude_key(added(dense[i], scale, values(j))) >= non_finite_key ? overflow : 0u;
  }
};

}  // namespace decoding

/// Names the first entry whose sum overflows, read on the host from copies of the
/// entries (`count` of them, the backend's memory) and of dense (n floats).
template <class Backend>
[[noreturn]] void explain_overflow(const Backend& on, const char* who, const std::uint32_t* index, const float* values,
                                   std::size_t count, sum_target target, std::size_t n) {
  constexpr bool copied = !Backend::host_accessible;
  std::vector<std::uint32_t> index_host(copied ? count : 0);
  std::vector<float> values_host(copied ? count : 0), dense_host(copied ? n : 0);
  const auto i = on_host(on, index, count, index_host);
  const auto v = on_host(on, values, count, values_host);
  const auto d = on_host(on, target.dense, n, dense_host);
  for (std::size_t j = 0; j < count; ++j) {
    if (!std::isfinite(added(d[i[j]], target.scale, v[j]))) fail_overflow(who, i[j], d[i[j]], target.scale, v[j]);
  }
  fail(errc::non_finite, who,
       ": a sum overflowed on the backend but not on the host (a gradcomp bug: please report it)");
}

/// \throws gradcomp::error (non_finite) naming the first j for which dense[index[j]] +
///         scale * values[j] is not finite (`count` checked entries of a tensor of n
///         elements, all in the backend's memory); writes nothing.
template <class Backend>
void require_sums_finite(const Backend& on, const char* who, const std::uint32_t* index, const float* values,
                         std::size_t count, sum_target target, std::size_t n) {
  auto fault = on.template allocate<std::uint32_t>(1);
  on.clear(fault.data(), 1);
  on.reduce_or(count, decoding::sum_finite<decoding::array_values>{index, {values}, target.scale, target.dense, n},
               fault.data());
  if (on.read(static_cast<const std::uint32_t*>(fault.data())) != 0)
    explain_overflow(on, who, index, values, count, target, n);
}

/// Checks messages in `Backend`'s memory and adds them to its tensors, each call on the
/// execution context it is given; workspace from the backend it was made with, grown
/// to the largest message seen.
template <class Backend>
class message_decoder {
 public:
  /// A message that passed check(): its header, read on the host, and its bytes.
  struct checked {
    message_header header;
    std::span<const std::byte> bytes;
  };

  explicit message_decoder(const Backend& be) : backend_(be), faults_(be.template allocate<std::uint32_t>(3)) {}

  /// Checks the whole message at `bytes` (the backend's memory) for a tensor of n
  /// elements, and with a `target`, that adding it there keeps every sum finite.
  /// Writes no tensor.
  /// \throws gradcomp::error (corrupt_message) naming the first fault as the host's
  ///         reader does, (invalid_argument) if the message's n is not `n`, or
  ///         (non_finite) naming the first sum that is not finite; `who` starts that text.
  checked check(const Backend& on, std::span<const std::byte> bytes, std::size_t n, const char* who,
                sum_target target = {}) {
    using namespace decoding;
    std::byte head[message_header::size] = {};
    if (bytes.size() >= message_header::size) on.to_host(bytes.data(), message_header::size, head);
    const message_header h = read_header(std::span<const std::byte>(head, sizeof head), bytes.size());
    std::uint32_t* faults = faults_.data();
    on.clear(faults, 1);
    queue_checks(on, h, bytes, n, target, faults);
    const std::uint32_t seen = on.read(static_cast<const std::uint32_t*>(faults));
    if ((seen & fault) != 0) explain(on, bytes, n, who);
    require_size(h, n, who);
    if (seen != 0) {  // the message is sound, a sum is not
      const auto count = static_cast<std::size_t>(h.count);
      grow(values_, count);
      decode_values(on, value_decoder(h, value_section(h, bytes)), count, values_.data());
      explain_overflow(on, who, index_.data(), values_.data(), count, target, n);
    }
    return {h, bytes};
  }

  /// Queues `dense += scale * entries` of a checked message (dense: the backend's memory).
  void add(const Backend& on, const checked& m, std::span<float> dense, float scale) {
    const auto count = static_cast<std::size_t>(m.header.count);
    if (count == 0) return;
    decode_indices(on, m.header, m.bytes, nullptr);
    grow(values_, count);
    decode_values(on, value_decoder(m.header, value_section(m.header, m.bytes)), count, values_.data());
    on.for_each(count, scatter_add{index_.data(), values_.data(), scale, dense.data()});
  }

  /// check() and add() queued together, with nothing read back, for a caller that
  /// reads many messages' outcomes at once: `head` is the message's header as the caller
  /// read it (a copy of its first message_header::size bytes: read_header() checked it on
  /// the host, against bytes.size()), the checks (with `dense` as the target) OR their
  /// faults into `*fault` (the backend's memory; the caller clears it), and `dense` is
  /// added to only if none was found. A nonzero `*fault` means check() raises for this
  /// message and `dense` went unchanged: call it to learn the error.
  /// A message for a tensor of another n is a fault too (check() then names the error
  /// that comes first, a corrupt message's or the size's, as the host's reader does).
  /// \throws gradcomp::error (corrupt_message) for a bad header; nothing is queued then.
  void queue_checked_add(const Backend& on, std::span<const std::byte, message_header::size> head,
                         std::span<const std::byte> bytes, std::span<float> dense, float scale, std::uint32_t* fault) {
    const message_header h = read_header(head, bytes.size());
    if (h.n != dense.size()) {
      on.reduce_or(1, decoding::always_fault{}, fault);
      return;
    }
    queue_checks(on, h, bytes, dense.size(), {dense.data(), scale}, fault);
    const auto count = static_cast<std::size_t>(h.count);
    if (count == 0) return;
    grow(values_, count);
    decode_values(on, value_decoder(h, value_section(h, bytes)), count, values_.data());
    on.for_each(count, decoding::scatter_add_if_clean{fault, index_.data(), values_.data(), scale, dense.data()});
  }

  /// Queues the first out.size() values of a checked message, in entry order, into
  /// `out` (the backend's memory).
  void values(const Backend& on, const checked& m, std::span<float> out) {
    const std::size_t count = std::min<std::size_t>(out.size(), m.header.count);
    decode_values(on, value_decoder(m.header, value_section(m.header, m.bytes)), count, out.data());
  }

  /// Bytes of its buffers.
  [[nodiscard]] std::size_t held_bytes() const noexcept {
    return bytes_held(faults_, index_, parts_, values_, sums_, scratch_, layout_, advance_);
  }

 private:
  // Every check of the message into `faults` (each pass after a fault does nothing),
  // its indices decoded into index_ on the way.
  void queue_checks(const Backend& on, const message_header& h, std::span<const std::byte> bytes, std::size_t n,
                    sum_target target, std::uint32_t* faults) {
    using namespace decoding;
    if ((h.flags & message_header::flag_checksum) != 0) {
      const std::size_t parts = blocks_of(bytes.size() - 16, checksum_chunk);
      grow(parts_, parts);
      on.for_each(parts, checksum_parts{bytes.data(), bytes.size(), parts_.data()});
      on.reduce_or(1, checksum_check{bytes.data(), bytes.size(), parts_.data(), h.checksum}, faults);
    }
    decode_indices(on, h, bytes, faults);
    const value_decoder values(h, value_section(h, bytes));
    if (value_entry_bits(h.value, h.codec_param) % 8 != 0) {  // a packed coding: its padding
      const std::uint64_t used = value_used_bits(h.value, h.count, h.codec_param);
      on.reduce_or(1, value_padding{value_section(h, bytes), used, h.value_bytes}, faults);
    }
    values.visit([&](const auto& typed) {
      using values_t = std::decay_t<decltype(typed)>;
      on.reduce_or(static_cast<std::size_t>(h.count), values_finite<values_t>{typed}, faults);
      if (target.dense != nullptr) {
        on.reduce_or(static_cast<std::size_t>(h.count),
                     sum_finite<values_t>{index_.data(), typed, target.scale, target.dense, n}, faults);
      }
    });
  }

  /// out[j] = entry j's value for j < count, dispatching on the coding once.
  static void decode_values(const Backend& on, const value_decoder& values, std::size_t count, float* out) {
    values.visit([&](const auto& typed) {
      on.for_each(count, decoding::decoded_values<std::decay_t<decltype(typed)>>{typed, out});
    });
  }

  template <class T>
  using buffer = typename Backend::template buffer<T>;

  static const std::byte* value_section(const message_header& h, std::span<const std::byte> bytes) {
    return bytes.data() + message_header::size + h.index_bytes;
  }

  // Grows a workspace buffer to `count` elements (never shrinks).
  template <class T>
  void grow(buffer<T>& b, std::size_t count) {
    if (static_cast<std::size_t>(b.size()) < count) b = backend_.template allocate<T>(count);
  }

  // The index section into index_; with `check_into` (a fault word), its structural
  // faults and the order and range of the indices into that word (every pass after a
  // fault does nothing). Without, the message passed check() already: only what
  // decoding needs runs (delta's layout walk, which also places the blocks).
  void decode_indices(const Backend& on, const message_header& h, std::span<const std::byte> bytes,
                      std::uint32_t* check_into) {
    using namespace decoding;
    const auto count = static_cast<std::size_t>(h.count);
    const std::byte* section = bytes.data() + message_header::size;
    const bool checking = check_into != nullptr;
    std::uint32_t* faults = checking ? check_into : faults_.data() + 1;  // [1]: a clean word for add()
    std::uint32_t* expanded = faults_.data() + 2;                        // the expansion's count
    if (!checking) on.clear(faults, 1);
    grow(index_, std::max<std::size_t>(count, 1));
    switch (h.index) {
      case index_coding::raw32:
        on.for_each(count, raw32_index{section, index_.data()});
        break;
      case index_coding::bitmap: {
        const auto bytes_n = static_cast<std::size_t>(bitmap_bytes(h.n));
        grow(sums_, tile_count(bytes_n) + 1);
        grow(scratch_, std::max<std::size_t>(on.expand_workspace(bytes_n), 1));
        if (checking) {
          on.reduce_or(1, bitmap_tail{section, h.n}, faults);
          on.sum(bytes_n, bitmap_byte_count{section}, sums_.data() + 1, sums_.data());
          on.reduce_or(1, bitmap_count_check{sums_.data(), h.count}, faults);
        }
        on.expand(bytes_n, bitmap_indices{section, faults}, index_.data(),
                  std::span<std::byte>(scratch_.data(), static_cast<std::size_t>(scratch_.size())), expanded);
        break;
      }
      case index_coding::delta_bitpack: {
        const std::size_t n_blocks = blocks_of(count, delta_block);
        grow(layout_, std::max<std::size_t>(n_blocks, 1));
        grow(advance_, std::max<std::size_t>(n_blocks, 1));
        on.reduce_or(1, delta_layout{section, h.index_bytes, h.count, layout_.data()}, faults);
        if (checking) on.reduce_or(n_blocks, delta_padding{section, layout_.data(), faults}, faults);
        on.for_each(n_blocks, delta_advance{section, layout_.data(), faults, advance_.data()});
        on.for_each(1, delta_bases{advance_.data(), n_blocks, faults});
        on.reduce_or(n_blocks, delta_indices{section, layout_.data(), advance_.data(), faults, h.n, index_.data()},
                     faults);
        break;
      }
      case index_coding::automatic:
        break;  // read_header refuses it
    }
    if (checking) on.reduce_or(count, indices_in_order{index_.data(), faults, h.n}, faults);
  }

  // A faulty message: the host's reader on a copy raises the host's error for it.
  [[noreturn]] void explain(const Backend& on, std::span<const std::byte> bytes, std::size_t n, const char* who) {
    std::vector<std::byte> host(bytes.size());
    on.to_host(bytes.data(), bytes.size(), host.data());
    const message_reader reader(host);
    require_size(reader.header(), n, who);
    reader.validate_entries();
    fail(errc::corrupt_message, who,
         ": the message failed a check on the backend that the host's reader passes "
         "(a gradcomp bug: please report it with the message's bytes)");
  }

  static void require_size(const message_header& h, std::size_t n, const char* who) {
    require(h.n == n, errc::invalid_argument, who, ": dense.size() = ", n, " does not match the message's n = ", h.n);
  }

  Backend backend_;
  buffer<std::uint32_t> faults_;  // [0] the check's fault word, [1] one that stays clean, [2] a count
  buffer<std::uint32_t> index_, parts_;
  buffer<float> values_;
  buffer<double> sums_;
  buffer<std::byte> scratch_;
  buffer<decoding::delta_block_at> layout_;
  buffer<std::uint64_t> advance_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
