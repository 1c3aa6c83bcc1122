/// \file detail/codec/decode.hpp
/// Decoding and accumulating messages in a backend's memory, written once over the
/// backend primitives: what backend::cuda runs for every coding (device_messages.cuh,
/// comm::nccl, cyclic_topk). backend::host's accumulate reads a message in one
/// sequential pass (message.hpp's message_reader), the fast path these are tested
/// against (tests/test_message.cpp runs this on backend::host and on a host backend
/// that declares its memory unreadable, over good and hostile messages).
///
/// The header is parsed where the message is, by one item (decoding::parse_header),
/// into a parsed_header that every later pass reads its sizes from; where the host reads
/// the header too (check(), 56 bytes), the passes are launched at its sizes, and where it
/// does not (queue_framed_add: a frame's message, whose outcome the caller reads with
/// many others) at the most the frame can hold, the items past the header's doing
/// nothing. Then the passes, each flagging what it finds into one fault word in the
/// backend's memory:
/// - the checksum, if flagged: a CRC-32C register per kilobyte, chained by one item;
/// - the index section into an index workspace: raw32 by entry; bitmap by an ordered
///   expansion of its bytes, after a check of the bits past n and a fixed-order sum of
///   the bytes' popcounts against the count; delta_bitpack by one item that walks the
///   blocks' widths (their layout), then per block its gaps' sum, one item's scan of
///   the sums, and per block its indices, each checked against n in 64 bits;
/// - every index below n and above the one before it; the value section's padding;
///   every value finite (decoded as the host's reader decodes it, coded_values).
/// One read of the fault word ends check(). A clean message is decoded again by
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
#include <gradcomp/encode/index_value.hpp>
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

/// Bytes of a frame's verdict (comm/agreement.hpp's rank_verdict) before its message:
/// the rank's error code at byte 0, its message's size at byte 8.
inline constexpr std::size_t verdict_bytes = 24;

/// A message's header where the passes read it (the backend's memory), as parse_header
/// found it: every pass takes the sizes it works on from here, so that one set of passes
/// serves a header the host read (launched at its exact sizes) and a frame's, which the
/// host never reads (launched at the sizes the frame's bound allows; the items past the
/// header's, or of another index coding, do nothing).
struct parsed_header {
  std::uint32_t usable;  // 1: a sound header, the passes work on it; 0: they do nothing
  std::uint32_t index;   // its index_coding
  std::uint32_t value;   // its value_coding
  std::uint32_t flags, checksum, levels;
  std::uint64_t n, count, index_bytes, value_bytes;
  std::uint64_t size;  // of the message: header and sections
  float value_param;

  GRADCOMP_HOST_DEVICE bool coded(index_coding c) const {
    return usable != 0 && index == static_cast<std::uint32_t>(c);
  }
  GRADCOMP_HOST_DEVICE bool has_entry(std::size_t j) const { return usable != 0 && j < count; }
  GRADCOMP_HOST_DEVICE std::size_t delta_blocks() const { return usable != 0 ? blocks_of(count, delta_block) : 0; }
  GRADCOMP_HOST_DEVICE const std::byte* value_section(const std::byte* message) const {
    return message + message_header::size + index_bytes;
  }
};

/// Whether a header's coding parameters are sound (check_section_sizes' rules): its
/// levels where the coding takes them, else zero; its scale finite and not negative
/// where the coding has one, else all zero bits.
GRADCOMP_HOST_DEVICE constexpr bool coding_parameters_sound(value_coding c, std::uint32_t levels,
                                                            std::uint32_t param_bits) noexcept {
  return visit_value_coding(c, [&](auto coding) {
    using C = decltype(coding);
    const bool levels_sound = C::takes_levels ? levels >= 1 && levels <= qsgd_max_levels : levels == 0;
    const std::uint32_t magnitude = param_bits & 0x7FFFFFFFu;
    const bool param_sound =
        C::has_param ? magnitude < non_finite_key && ((param_bits >> 31) == 0 || magnitude == 0) : param_bits == 0;
    return levels_sound && param_sound;
  });
}

/// One item: checks a message's header as read_header() does, and against the format
/// the reader expects (`want`: its codings, any index coding where its index coding is
/// automatic, its levels where the value coding takes them, and its checksum flag), into `out`: `fault` for an unsound
/// header. After a frame's verdict (`verdict` not null) a rank's error or a message larger than `room` (outgrown)
/// leaves the header unusable without a fault: the host settles those from the verdicts it reads.
struct parse_header {
  const std::byte* verdict;  // a frame's, or null
  const std::byte* message;
  std::uint64_t room;  // the message's bytes; after a verdict, the most the frame holds
  std::uint64_t n;     // of the dense tensor
  std::uint64_t most;  // entries the passes are launched for
  encode::index_value want;
  parsed_header* out;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    *out = parsed_header{};
    std::uint64_t total = room;
    if (verdict != nullptr) {
      if (load_le<std::uint32_t>(verdict) != 0) return 0;
      total = load_le<std::uint64_t>(verdict + 8);
      if (total > room) return 0;
    }
    if (total < message_header::size) return fault;
    const std::byte* p = message;
    const message_header f = header_fields(p);
    const auto param_bits = load_le<std::uint32_t>(p + 48);
    const bool index_expected =
        want.index == index_coding::automatic ? is_wire_index_coding(f.index) : f.index == want.index;
    if (load_le<std::uint32_t>(p) != message_header::magic ||
        load_le<std::uint16_t>(p + 4) != message_header::version || !index_expected || f.value != want.value) {
      return fault;
    }
    if (f.flags != (want.checksum ? message_header::flag_checksum : 0u) || (f.flags == 0 && f.checksum != 0)) {
      return fault;
    }
    if (takes_levels(f.value) && f.codec_param != want.levels) return fault;
    if (f.n != n || f.n == 0 || f.n > message_header::max_n || f.count > f.n || f.count > most) return fault;
    const std::uint64_t body = total - message_header::size;
    if (f.index_bytes > body || f.value_bytes > body - f.index_bytes || f.index_bytes + f.value_bytes != body) {
      return fault;
    }
    const std::uint64_t index_most = max_index_section_bytes(f.index, f.n, f.count);
    if (f.index == index_coding::delta_bitpack ? f.index_bytes > index_most : f.index_bytes != index_most) return fault;
    if (!coding_parameters_sound(f.value, f.codec_param, param_bits)) return fault;
    if (f.value_bytes != value_section_bytes(f.value, f.count, f.codec_param)) return fault;
    *out = {.usable = 1,
            .index = static_cast<std::uint32_t>(f.index),
            .value = static_cast<std::uint32_t>(f.value),
            .flags = f.flags,
            .checksum = f.checksum,
            .levels = f.codec_param,
            .n = f.n,
            .count = f.count,
            .index_bytes = f.index_bytes,
            .value_bytes = f.value_bytes,
            .size = total,
            .value_param = f.value_param};
    return 0;
  }
};

/// Whether the message's fault word holds a fault yet. A pass reads it as it runs, while
/// other items of the same pass may OR theirs into it: so a relaxed atomic read (volatile
/// on the device), which those ORs do not race with, as they would with a plain read.
GRADCOMP_HOST_DEVICE inline bool faulted(const std::uint32_t* faults) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const volatile std::uint32_t*>(faults) != 0;
#else
  return __atomic_load_n(faults, __ATOMIC_RELAXED) != 0;
#endif
}

/// f(j) for the entries of a sound header (a zero, or nothing, past them): the passes
/// launched for more entries than a message may hold do nothing there.
template <class F>
struct on_entries {
  const parsed_header* h;
  F f;
  GRADCOMP_HOST_DEVICE auto operator()(std::size_t j) const -> decltype(f(j)) {
    if (!h->has_entry(j)) return decltype(f(j))();
    return f(j);
  }
};
template <class F>
on_entries(const parsed_header*, F) -> on_entries<F>;

/// scatter_add (message.hpp) where the message's fault word stayed 0: every check of
/// the message ran before on the same stream, so the word is final when this reads it.
struct scatter_add_if_clean {
  const std::uint32_t* faults;
  const std::uint32_t* index;
  const float* values;
  float scale;
  float* dense;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (!faulted(faults)) scatter_add{index, values, scale, dense}(j);
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

/// The tiles' CRC registers of a message whose header carries a checksum.
struct checksum_parts {
  const std::byte* message;
  const parsed_header* h;
  std::uint32_t* parts;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t c) const {
    if (h->usable != 0 && h->flags != 0 && c < blocks_of(h->size - 16, checksum_chunk)) {
      parts[c] = message_checksum_part(message, h->size, c);
    }
  }
};
/// The chained checksum against the header's.
struct checksum_check {
  const std::byte* message;
  const parsed_header* h;
  const std::uint32_t* parts;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    if (h->usable == 0 || h->flags == 0) return 0;
    return message_checksum_of_parts(message, h->size, parts) == h->checksum ? 0u : fault;
  }
};

/// raw32: index[j] from the section.
struct raw32_index {
  const std::byte* section;
  std::uint32_t* index;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { index[j] = load_le<std::uint32_t>(section + 4 * j); }
};
/// raw32_index for the entries of a raw32 header.
struct raw32_entry {
  const parsed_header* h;
  raw32_index read;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (h->coded(index_coding::raw32) && j < h->count) read(j);
  }
};

/// bitmap: the bits of the last byte past n must be zero.
struct bitmap_tail {
  const std::byte* section;
  const parsed_header* h;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    if (!h->coded(index_coding::bitmap)) return 0;
    const auto tail = static_cast<unsigned>(h->n % 8);
    return tail != 0 && (static_cast<unsigned>(section[bitmap_bytes(h->n) - 1]) >> tail) != 0 ? fault : 0u;
  }
};
/// bitmap: the bits set in byte b (summed, exactly, in double).
struct bitmap_byte_count {
  const std::byte* section;
  const parsed_header* h;
  GRADCOMP_HOST_DEVICE double operator()(std::size_t b) const {
    if (!h->coded(index_coding::bitmap)) return 0.0;
    return static_cast<double>(bits_set(static_cast<unsigned>(section[b])));
  }
};
/// bitmap: the set bits' count against the header's.
struct bitmap_count_check {
  const double* total;
  const parsed_header* h;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    if (!h->coded(index_coding::bitmap)) return 0;
    return *total == static_cast<double>(h->count) ? 0u : fault;
  }
};
/// bitmap: byte b's set bits, as indices, once the count is known to fit.
struct bitmap_indices {
  const std::byte* section;
  const parsed_header* h;
  const std::uint32_t* faults;
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t b, std::uint32_t* at) const {
    if (faulted(faults) || !h->coded(index_coding::bitmap)) return 0;
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
  const parsed_header* h;
  delta_block_at* blocks;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    if (!h->coded(index_coding::delta_bitpack)) return 0;
    const std::uint64_t section_bytes = h->index_bytes, count = h->count;
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
/// Whether delta_bitpack block b of a header is there to read, its layout sound.
GRADCOMP_HOST_DEVICE inline bool delta_block_live(const parsed_header* h, const std::uint32_t* faults, std::size_t b) {
  return !faulted(faults) && h->coded(index_coding::delta_bitpack) && b < h->delta_blocks();
}
/// delta_bitpack: block b's padding bits are zero, once the layout is sound.
struct delta_padding {
  const std::byte* section;
  const parsed_header* h;
  const delta_block_at* blocks;
  const std::uint32_t* faults;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t b) const {
    if (!delta_block_live(h, faults, b)) return 0;
    const delta_block_at k = blocks[b];
    const std::uint64_t used = std::uint64_t{k.len} * k.width;
    return padding_is_zero(section + k.offset, used, (used + 7) / 8) ? 0u : fault;
  }
};
/// delta_bitpack: how far block b advances the next index (its gaps plus its length).
struct delta_advance {
  const std::byte* section;
  const parsed_header* h;
  const delta_block_at* blocks;
  const std::uint32_t* faults;
  std::uint64_t* advance;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const {
    if (!delta_block_live(h, faults, b)) return;
    const delta_block_at k = blocks[b];
    std::uint64_t sum = k.len;
    for (std::uint32_t j = 0; j < k.len; ++j) sum += read_bits(section + k.offset, std::uint64_t{j} * k.width, k.width);
    advance[b] = sum;
  }
};
/// delta_bitpack: each block's first "next index", an exclusive scan by one item.
struct delta_bases {
  std::uint64_t* advance;  // becomes the bases
  const parsed_header* h;
  const std::uint32_t* faults;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!delta_block_live(h, faults, 0)) return;
    std::uint64_t next = 0;
    for (std::size_t b = 0; b < h->delta_blocks(); ++b) {
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
  const parsed_header* h;
  const delta_block_at* blocks;
  const std::uint64_t* bases;
  const std::uint32_t* faults;
  std::uint32_t* index;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t b) const {
    if (!delta_block_live(h, faults, b)) return 0;
    const delta_block_at k = blocks[b];
    std::uint64_t next = bases[b];
    std::uint32_t found = 0;
    for (std::uint32_t j = 0; j < k.len; ++j) {
      const std::uint64_t i = next + read_bits(section + k.offset, std::uint64_t{j} * k.width, k.width);
      if (i >= h->n) found = fault;
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
    if (faulted(faults)) return 0;
    return index[j] >= n || (j > 0 && index[j] <= index[j - 1]) ? fault : 0u;
  }
};

/// The value section's padding (ternary, qsgd, int4) is zero.
struct value_padding {
  const std::byte* message;
  const parsed_header* h;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const {
    if (h->usable == 0) return 0;
    const std::uint64_t used = value_used_bits(static_cast<value_coding>(h->value), h->count, h->levels);
    return padding_is_zero(h->value_section(message), used, h->value_bytes) ? 0u : fault;
  }
};

/// The values of a message in coding `Coding`, read where its parsed header says.
template <class Coding>
struct header_values {
  const std::byte* message;
  const parsed_header* h;
  GRADCOMP_HOST_DEVICE float operator()(std::size_t j) const {
    return coded_values<Coding>{h->value_section(message), h->value_param, h->levels, Coding::entry_bits(h->levels)}(j);
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

  explicit message_decoder(const Backend& be)
      : backend_(be),
        faults_(be.template allocate<std::uint32_t>(3)),
        header_(be.template allocate<decoding::parsed_header>(1)) {}

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
    const pass_sizes sizes = parse(on, nullptr, bytes, n, format_of(h), h.count, faults);
    queue_checks(on, sizes, bytes, n, target, faults);
    const std::uint32_t seen = on.read(static_cast<const std::uint32_t*>(faults));
    if ((seen & fault) != 0) explain(on, bytes, n, who);
    require_size(h, n, who);
    if (seen != 0) {  // the message is sound, a sum is not
      const auto count = static_cast<std::size_t>(h.count);
      grow(values_, count);
      decode_values(on, sizes, bytes, values_.data());
      explain_overflow(on, who, index_.data(), values_.data(), count, target, n);
    }
    return {h, bytes};
  }

  /// Queues `dense += scale * entries` of a checked message (dense: the backend's memory).
  void add(const Backend& on, const checked& m, std::span<float> dense, float scale) {
    if (m.header.count == 0) return;
    std::uint32_t* clean = faults_.data() + 1;  // stays 0: the message passed check()
    on.clear(clean, 1);
    const pass_sizes sizes = parse(on, nullptr, m.bytes, dense.size(), format_of(m.header), m.header.count, clean);
    decode_indices(on, sizes, m.bytes, dense.size(), clean, false);
    add_entries(on, sizes, m.bytes, dense, scale, clean);
  }

  /// check() and add() of the message in a frame, queued together with nothing read
  /// back, for a caller that reads many messages' outcomes at once. `frame` is a rank's
  /// verdict (decoding::verdict_bytes: its error code, its message's size) and then up to
  /// frame.size() - verdict_bytes bytes of its message; `format` is the encoder the ranks
  /// agreed on. The checks (with `dense` as the target) OR their faults into `*fault`
  /// (the backend's memory; the caller clears it) and `dense` is added to only if none
  /// was found. A nonzero `*fault` means check() raises for the message, or that it is
  /// not written as `format` says, and that `dense` went unchanged. A verdict's error,
  /// or a message larger than the frame, leaves both untouched: the caller settles those
  /// from the verdicts it reads.
  void queue_framed_add(const Backend& on, const encode::index_value& format, std::span<const std::byte> frame,
                        std::span<float> dense, float scale, std::uint32_t* fault) {
    require(frame.size() >= decoding::verdict_bytes, errc::invalid_argument, "accumulate: a frame of ", frame.size(),
            " bytes is shorter than its verdict (", decoding::verdict_bytes, " bytes)");
    const std::span<const std::byte> message = frame.subspan(decoding::verdict_bytes);
    const std::size_t body = message.size() > message_header::size ? message.size() - message_header::size : 0;
    // Each entry takes its value's bits, and raw32's 32 more (the other codings' indices
    // may take less: delta_bitpack's none beyond a block's width, bitmap's none beyond n bits).
    const std::size_t entry_bits =
        value_entry_bits(format.value, format.levels) + (format.index == index_coding::raw32 ? 32 : 0);
    const std::size_t most = std::min<std::size_t>(dense.size(), 8 * body / entry_bits);
    pass_sizes sizes = parse(on, frame.data(), message, dense.size(), format, most, fault);
    // A bitmap larger than the frame cannot be in it (parse_header faults such a header):
    // bitmap's passes need not run.
    sizes.bitmap_fits = message.size() >= message_header::size + bitmap_bytes(dense.size());
    queue_checks(on, sizes, message, dense.size(), {dense.data(), scale}, fault);
    add_entries(on, sizes, message, dense, scale, fault);
  }

  /// Queues the first out.size() values of a checked message, in entry order, into
  /// `out` (the backend's memory).
  void values(const Backend& on, const checked& m, std::span<float> out) {
    std::uint32_t* clean = faults_.data() + 1;
    on.clear(clean, 1);
    pass_sizes sizes = parse(on, nullptr, m.bytes, m.header.n, format_of(m.header), m.header.count, clean);
    sizes.entries = std::min<std::size_t>(out.size(), sizes.entries);
    decode_values(on, sizes, m.bytes, out.data());
  }

  /// Bytes of its buffers.
  [[nodiscard]] std::size_t held_bytes() const noexcept {
    return bytes_held(faults_, header_, index_, parts_, values_, sums_, scratch_, layout_, advance_);
  }

 private:
  // What the passes over one message are launched for: a header's exact sizes, or the
  // most a frame may hold (the items past its header's do nothing).
  struct pass_sizes {
    std::size_t entries;  // items of the passes over entries
    std::size_t message;  // bytes of the message, at most
    index_coding index;   // automatic: every coding's passes, each on its own messages
    value_coding value;
    bool checksum;
    bool bitmap_fits = true;  // false: no bitmap is in the message's room, its passes do not run
  };

  static encode::index_value format_of(const message_header& h) {
    return {.index = h.index,
            .value = h.value,
            .levels = h.codec_param,
            .checksum = (h.flags & message_header::flag_checksum) != 0};
  }

  // Queues the header's parse into header_ (its faults into `faults`) and returns the
  // passes' sizes: the header's own where the host may read it (no wait there), else
  // `most` entries of the message's `format`.
  pass_sizes parse(const Backend& on, const std::byte* verdict, std::span<const std::byte> message, std::size_t n,
                   const encode::index_value& format, std::size_t most, std::uint32_t* faults) {
    decoding::parsed_header* h = header_.data();
    on.reduce_or(1, decoding::parse_header{verdict, message.data(), message.size(), n, most, format, h}, faults);
    pass_sizes sizes{most, message.size(), format.index, format.value, format.checksum};
    if constexpr (Backend::host_accessible) {
      sizes.entries = h->usable != 0 ? static_cast<std::size_t>(h->count) : 0;
      if (h->usable != 0) sizes.index = static_cast<index_coding>(h->index);
    }
    return sizes;
  }

  // Every check of the message into `faults` (each pass after a fault does nothing),
  // its indices decoded into index_ on the way.
  void queue_checks(const Backend& on, const pass_sizes& sizes, std::span<const std::byte> bytes, std::size_t n,
                    sum_target target, std::uint32_t* faults) {
    using namespace decoding;
    const parsed_header* h = header_.data();
    if (sizes.checksum) {
      const std::size_t parts = sizes.message > 16 ? blocks_of(sizes.message - 16, checksum_chunk) : 0;
      grow(parts_, std::max<std::size_t>(parts, 1));
      on.for_each(parts, checksum_parts{bytes.data(), h, parts_.data()});
      on.reduce_or(1, checksum_check{bytes.data(), h, parts_.data()}, faults);
    }
    decode_indices(on, sizes, bytes, n, faults, true);
    visit_value_coding(sizes.value, [&](auto coding) {
      using C = decltype(coding);
      const header_values<C> values{bytes.data(), h};
      if constexpr (!C::byte_aligned) on.reduce_or(1, value_padding{bytes.data(), h}, faults);
      on.reduce_or(sizes.entries, on_entries{h, values_finite<header_values<C>>{values}}, faults);
      if (target.dense != nullptr) {
        on.reduce_or(sizes.entries,
                     on_entries{h, sum_finite<header_values<C>>{index_.data(), values, target.scale, target.dense, n}},
                     faults);
      }
    });
  }

  // Queues dense += scale * the entries whose indices are in index_, if `faults` stays 0.
  void add_entries(const Backend& on, const pass_sizes& sizes, std::span<const std::byte> bytes, std::span<float> dense,
                   float scale, const std::uint32_t* faults) {
    if (sizes.entries == 0) return;
    grow(values_, sizes.entries);
    decode_values(on, sizes, bytes, values_.data());
    on.for_each(sizes.entries,
                decoding::on_entries{header_.data(), decoding::scatter_add_if_clean{
                                                         faults, index_.data(), values_.data(), scale, dense.data()}});
  }

  // out[j] = entry j's value for j < sizes.entries, dispatching on the coding once.
  void decode_values(const Backend& on, const pass_sizes& sizes, std::span<const std::byte> bytes, float* out) {
    using namespace decoding;
    const parsed_header* h = header_.data();
    visit_value_coding(sizes.value, [&](auto coding) {
      using values_t = header_values<decltype(coding)>;
      on.for_each(sizes.entries, on_entries{h, decoded_values<values_t>{values_t{bytes.data(), h}, out}});
    });
  }

  template <class T>
  using buffer = typename Backend::template buffer<T>;

  // Grows a workspace buffer to `count` elements (never shrinks).
  template <class T>
  void grow(buffer<T>& b, std::size_t count) {
    if (static_cast<std::size_t>(b.size()) < count) b = backend_.template allocate<T>(count);
  }

  // The index section into index_, for a tensor of n elements. `checking`: its
  // structural faults and the order and range of the indices go into `faults` (every
  // pass after a fault does nothing); else the message passed check() already, and
  // only what decoding needs runs (delta's layout walk, which also places the blocks).
  void decode_indices(const Backend& on, const pass_sizes& sizes, std::span<const std::byte> bytes, std::size_t n,
                      std::uint32_t* faults, bool checking) {
    using namespace decoding;
    const parsed_header* h = header_.data();
    const std::size_t entries = sizes.entries;
    const std::byte* section = bytes.data() + message_header::size;
    const bool automatic = sizes.index == index_coding::automatic;
    grow(index_, std::max<std::size_t>(entries, 1));
    if (automatic || sizes.index == index_coding::raw32) {
      on.for_each(entries, raw32_entry{h, {section, index_.data()}});
    }
    if ((automatic || sizes.index == index_coding::bitmap) && sizes.bitmap_fits) {
      const auto bytes_n = static_cast<std::size_t>(bitmap_bytes(n));
      grow(sums_, tile_count(bytes_n) + 1);
      grow(scratch_, std::max<std::size_t>(on.expand_workspace(bytes_n), 1));
      if (checking) {
        on.reduce_or(1, bitmap_tail{section, h}, faults);
        on.sum(bytes_n, bitmap_byte_count{section, h}, sums_.data() + 1, sums_.data());
        on.reduce_or(1, bitmap_count_check{sums_.data(), h}, faults);
      }
      on.expand(bytes_n, bitmap_indices{section, h, faults}, index_.data(),
                std::span<std::byte>(scratch_.data(), static_cast<std::size_t>(scratch_.size())),
                faults_.data() + 2);  // the expansion's count
    }
    if (automatic || sizes.index == index_coding::delta_bitpack) {
      const std::size_t n_blocks = blocks_of(entries, delta_block);
      grow(layout_, std::max<std::size_t>(n_blocks, 1));
      grow(advance_, std::max<std::size_t>(n_blocks, 1));
      on.reduce_or(1, delta_layout{section, h, layout_.data()}, faults);
      if (checking) on.reduce_or(n_blocks, delta_padding{section, h, layout_.data(), faults}, faults);
      on.for_each(n_blocks, delta_advance{section, h, layout_.data(), faults, advance_.data()});
      on.for_each(1, delta_bases{advance_.data(), h, faults});
      on.reduce_or(n_blocks, delta_indices{section, h, layout_.data(), advance_.data(), faults, index_.data()}, faults);
    }
    if (checking) on.reduce_or(entries, on_entries{h, indices_in_order{index_.data(), faults, n}}, faults);
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
  buffer<decoding::parsed_header> header_;
  buffer<std::uint32_t> index_, parts_;
  buffer<float> values_;
  buffer<double> sums_;
  buffer<std::byte> scratch_;
  buffer<decoding::delta_block_at> layout_;
  buffer<std::uint64_t> advance_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
