/// \file detail/codec/encode.hpp
/// encode::index_value's algorithm, once for every backend: the message is written in
/// the backend's memory by passes of its primitives, every index coding (raw32,
/// delta_bitpack, bitmap, automatic) and every value coding included, and its header is
/// decided there too, by one work item that reads what the passes found. Nothing is read
/// back to the host: the message's size lands in the step's status, next to the count
/// the selector left there. Not API.
///
/// The passes, in order (each skips its work once the status holds a NaN, and each runs
/// over the workspace's capacity, guarded by the count in the status):
///  1. gather: values[j] = acc[index[j]] times the selector's value scale;
///  2. what the value coding needs of all values (its statistic, detail/codec/value_codings.hpp):
///     int8 the largest magnitude (reduce_max), ternary the sum of magnitudes, qsgd the
///     sum of squares (sum, in the fixed order, so every backend gets the same bits);
///  3. delta_bitpack (and automatic): each block of 128 gaps its bit width, and groups
///     of 64 blocks their total, which the plan scans into each block's offset;
///  4. the plan (one item): the index coding (automatic: the smallest), the section
///     sizes, the value coding's parameter, the header, the size into the status;
///  5. the index section: raw32 by entry, bitmap by the entry that owns each byte (after
///     clearing the bitmap), delta_bitpack by block;
///  6. the value section: a byte-aligned coding (f32, f16, bf16, int8) by entry, a packed
///     one (ternary, qsgd) by byte, each byte assembling the fields that overlap it, a
///     block-scaled one (int4) by block, its scale from its own entries first;
///  7. the checksum: a CRC-32C register per kilobyte, then one item chains them.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/bits.hpp>
#include <gradcomp/detail/codec/sections.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/float_formats.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/random.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/detail/codec/value_codings.hpp>
#include <gradcomp/detail/core/wire.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/held_memory.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// What the passes over the selected entries find and the plan decides, in the
/// backend's memory (cleared before each message).
struct message_plan {
  double moment;              ///< ternary: the sum of |v|; qsgd: the sum of v^2
  std::uint64_t index_bytes;  ///< the index section's size
  std::uint64_t value_bytes;  ///< the value section's size
  std::uint64_t bytes;        ///< the whole message's
  std::uint32_t max_key;      ///< int8: the largest magnitude key of the values
  std::uint32_t index;        ///< the index coding written (an index_coding)
  float value_param;          ///< the header's value_param (a scale, a norm)
};

inline constexpr std::size_t delta_group = 64;  // delta blocks per group of the offsets' scan

/// Entry j of the step: whether it exists (the selector chose it, and no stage met a NaN).
/// A pass over the entries has live_items() = the live entries (concepts.hpp), a pass
/// over blocks of them the blocks that hold one.
struct step_entries {
  const step_status* status;
  GRADCOMP_HOST_DEVICE bool live(std::size_t j) const noexcept { return status->non_finite == 0 && j < status->count; }
  GRADCOMP_HOST_DEVICE std::size_t live_entries() const noexcept { return status->non_finite == 0 ? status->count : 0; }
  GRADCOMP_HOST_DEVICE std::size_t live_blocks() const noexcept {
    return (live_entries() + delta_block - 1) / delta_block;
  }
};

// -- 1, 2: the values and what their coding needs of all of them ----------------------

/// values[j] = acc[index[j]] times the selector's value scale (saturating).
struct gather_selected : step_entries {
  const float* acc;
  const std::uint32_t* index;
  float scale;
  float* values;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return live_entries(); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (live(j)) values[j] = scaled_value(acc[index[j]], scale);
  }
};

/// For reduce_max: the magnitude key of value j (0 past the count).
struct value_key : step_entries {
  const float* values;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return live_entries(); }
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const { return live(j) ? magnitude_key(values[j]) : 0u; }
};

/// For sum: |v_j| (ternary) or v_j^2 (qsgd) in double, 0 past the count (a zero added to
/// a sum of non-negative terms leaves it as it was, so the sum is that of the count).
struct value_moment : step_entries {
  const float* values;
  bool squared;
  GRADCOMP_HOST_DEVICE double operator()(std::size_t j) const {
    if (!live(j)) return 0.0;
    const double v = values[j];
    return squared ? mul_rn(v, v) : (v < 0.0 ? -v : v);
  }
};

// -- 3: delta_bitpack's blocks ----------------------------------------------------------

/// widths[b] = the bit width of block b's gaps (0 for a block past the count). Every
/// block is written (no live_items): the plan adds the widths of all the bound's blocks,
/// so those past the count must hold 0, not a previous step's widths.
struct delta_block_width : step_entries {
  const std::uint32_t* index;
  std::uint32_t* widths;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const {
    const std::size_t first = b * delta_block;
    std::uint32_t widest = 0;
    if (live(first)) {
      const std::size_t last = first + delta_block < status->count ? first + delta_block : status->count;
      widest = first == 0 ? index[0] : index[first] - index[first - 1] - 1;
      // Gaps from neighbours, with no value carried from one to the next: this loop
      // vectorises.
      for (std::size_t j = first + 1; j < last; ++j) widest |= index[j] - index[j - 1] - 1;
    }
    widths[b] = bit_width_of(widest);
  }
};

/// group_width[g] = the widths of the blocks of group g added (the plan scans them).
struct delta_group_width {
  const std::uint32_t* widths;
  std::size_t blocks;
  std::uint64_t* group_width;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t g) const {
    std::uint64_t total = 0;
    const std::size_t end = (g + 1) * delta_group < blocks ? (g + 1) * delta_group : blocks;
    for (std::size_t b = g * delta_group; b < end; ++b) total += widths[b];
    group_width[g] = total;
  }
};

// -- 4: the plan ------------------------------------------------------------------------

/// The one work item that decides the message: scans the delta groups (when `groups`
/// is not 0) into where each group starts, picks the index coding, sizes the sections,
/// computes the value coding's parameter, writes the header (the checksum field 0) and
/// the message's size into the status.
struct plan_message : step_entries {
  index_coding requested;
  value_coding value;
  std::uint32_t levels;
  bool checksum;
  std::uint64_t n;
  const std::uint32_t* widths;
  std::uint64_t* group_width;  // in: each group's widths added; out: the groups before it
  std::size_t groups;
  message_plan* plan;
  std::byte* out;
  step_status* writable_status;

  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (status->non_finite != 0) return;
    const std::uint64_t count = status->count;
    // A block of 128 gaps of w bits takes 1 + 16 w bytes; only the last may be shorter.
    std::uint64_t widths_before = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      const std::uint64_t w = group_width[g];
      group_width[g] = widths_before;
      widths_before += w;
    }
    std::uint64_t delta = 0;
    if (groups != 0 && count != 0) {
      const std::uint64_t blocks = blocks_of(count, delta_block);
      const std::uint64_t last_width = widths[blocks - 1];
      const std::uint64_t last_len = count - (blocks - 1) * delta_block;
      delta = blocks + 16 * (widths_before - last_width) + (last_len * last_width + 7) / 8;
    }
    index_coding index = requested;
    if (index == index_coding::automatic) {  // the smallest; ties: delta_bitpack, raw32, bitmap
      const std::uint64_t raw = 4 * count;
      const std::uint64_t bitmap = bitmap_bytes(n);
      index = bitmap < raw && bitmap <= delta ? index_coding::bitmap
                                              : (delta <= raw ? index_coding::delta_bitpack : index_coding::raw32);
    }
    const std::uint64_t index_bytes =
        index == index_coding::delta_bitpack ? delta : max_index_section_bytes(index, n, count);
    const value_statistics statistics{plan->max_key, plan->moment};
    const float param =
        visit_value_coding(value, [&](auto coding) { return decltype(coding)::param(statistics, count); });
    message_header h;
    h.index = index;
    h.value = value;
    h.flags = checksum ? message_header::flag_checksum : 0u;
    h.n = n;
    h.count = count;
    h.index_bytes = index_bytes;
    h.value_bytes = value_section_bytes(value, count, levels);
    h.value_param = param;
    h.codec_param =
        visit_value_coding(value, [&](auto coding) { return decltype(coding)::takes_levels ? levels : 0u; });
    write_header(out, h);
    plan->index = static_cast<std::uint32_t>(index);
    plan->index_bytes = h.index_bytes;
    plan->value_bytes = h.value_bytes;
    plan->value_param = param;
    plan->bytes = message_header::size + h.index_bytes + h.value_bytes;
    writable_status->bytes = plan->bytes;
  }
};

// -- 5: the index section ---------------------------------------------------------------

/// What a section writer needs to know of the plan: whether it is its coding's turn.
struct planned_section : step_entries {
  const message_plan* plan;
  GRADCOMP_HOST_DEVICE bool writes(index_coding c) const noexcept {
    return status->non_finite == 0 && plan->index == static_cast<std::uint32_t>(c);
  }
};

/// raw32: entry j's index at 4 j.
struct write_raw32 : planned_section {
  const std::uint32_t* index;
  std::byte* section;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return live_entries(); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (writes(index_coding::raw32) && live(j)) store_le<std::uint32_t>(section + 4 * j, index[j]);
  }
};

/// bitmap, first pass: byte b cleared.
struct clear_bitmap : planned_section {
  std::byte* section;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const {
    if (writes(index_coding::bitmap)) section[b] = std::byte{0};
  }
};

/// bitmap, second pass: the first entry in each byte writes the bits of all its
/// entries there (at most eight, ascending), so every byte has one writer.
struct write_bitmap : planned_section {
  const std::uint32_t* index;
  std::byte* section;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return live_entries(); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (!writes(index_coding::bitmap) || !live(j)) return;
    const std::uint32_t byte = index[j] / 8;
    if (j > 0 && index[j - 1] / 8 == byte) return;
    unsigned bits = 0;
    for (std::size_t e = j; e < status->count && index[e] / 8 == byte; ++e) bits |= 1u << (index[e] % 8);
    section[byte] = static_cast<std::byte>(bits);
  }
};

/// delta_bitpack: block b's width byte, then its gaps at that width (LSB-first), from
/// b + 16 * (the widths of the blocks before it).
struct write_delta_block : planned_section {
  const std::uint32_t* index;
  const std::uint32_t* widths;
  const std::uint64_t* group_start;  // the plan's scan: the widths of the groups before
  std::byte* section;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return live_blocks(); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const {
    const std::size_t first = b * delta_block;
    if (!writes(index_coding::delta_bitpack) || !live(first)) return;
    std::uint64_t widths_before = group_start[b / delta_group];
    for (std::size_t e = b / delta_group * delta_group; e < b; ++e) widths_before += widths[e];
    std::byte* p = section + b + 16 * widths_before;
    const unsigned width = widths[b];
    *p++ = static_cast<std::byte>(width);
    const std::size_t last = first + delta_block < status->count ? first + delta_block : status->count;
    std::uint64_t next = first == 0 ? 0 : std::uint64_t{index[first - 1]} + 1;
    std::uint64_t buffer = 0;  // bits not yet stored, LSB first: fewer than 32 between gaps
    unsigned filled = 0;
    for (std::size_t j = first; j < last; ++j) {
      buffer |= (index[j] - next) << filled;
      next = std::uint64_t{index[j]} + 1;
      filled += width;
      if (filled >= 32) {
        store_le<std::uint32_t>(p, static_cast<std::uint32_t>(buffer));
        p += 4;
        buffer >>= 32;
        filled -= 32;
      }
    }
    for (; filled > 0; filled = filled > 8 ? filled - 8 : 0, buffer >>= 8)
      *p++ = static_cast<std::byte>(buffer & 0xFFu);
  }
};

// -- 6: the value section ---------------------------------------------------------------

/// Where the value section starts: after the index section the plan sized.
GRADCOMP_HOST_DEVICE inline std::byte* value_section(std::byte* out, const message_plan* plan) noexcept {
  return out + message_header::size + plan->index_bytes;
}

/// A byte-aligned coding's entries (f32, f16, bf16, int8): entry j at its own bytes;
/// sent[j] what the receiver decodes.
template <class Coding>
struct write_entries : step_entries {
  const message_plan* plan;
  value_args args;  // but the param, which is the plan's
  const float* values;
  std::byte* out;
  float* sent;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return live_entries(); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (!live(j)) return;
    value_args a = args;
    a.param = plan->value_param;
    float decoded = 0.0f;
    const std::uint32_t field = Coding::encode(values[j], a, j, decoded);
    constexpr unsigned bits = Coding::entry_bits(0);
    std::byte* p = value_section(out, plan) + j * (bits / 8);
    if constexpr (bits == 32) {
      store_le<std::uint32_t>(p, field);
    } else if constexpr (bits == 16) {
      store_le<std::uint16_t>(p, static_cast<std::uint16_t>(field));
    } else {
      static_assert(bits == 8, "a byte-aligned coding's field is 8, 16 or 32 bits");
      *p = static_cast<std::byte>(field);
    }
    sent[j] = decoded;
  }
};

/// A packed coding's entries (ternary, qsgd): byte b assembles the bits of every entry
/// that overlaps it, and sets sent[j] for the entries that start in it (each entry
/// starts in one byte).
template <class Coding>
struct write_packed_byte : step_entries {
  const message_plan* plan;
  value_args args;  // but the param, which is the plan's
  const float* values;
  std::byte* out;
  float* sent;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const {
    if (status->non_finite != 0 || b >= plan->value_bytes) return;
    value_args a = args;
    a.param = plan->value_param;
    const std::uint64_t bits = Coding::entry_bits(a.levels);
    const std::uint64_t first_bit = 8 * std::uint64_t{b};
    std::uint32_t byte = 0;
    for (std::uint64_t j = first_bit / bits; j < status->count && j * bits < first_bit + 8; ++j) {
      float decoded = 0.0f;
      const std::uint32_t f = Coding::encode(values[j], a, static_cast<std::size_t>(j), decoded);
      if (j * bits >= first_bit) {
        byte |= f << (j * bits - first_bit);
        sent[j] = decoded;
      } else {
        byte |= f >> (first_bit - j * bits);
      }
    }
    value_section(out, plan)[b] = static_cast<std::byte>(byte & 0xFFu);
  }
};

/// A block-scaled coding's block b (int4): its scale, from the largest magnitude of its
/// entries, then their fields, LSB-first, and sent[j] for each.
template <class Coding>
struct write_scaled_block : step_entries {
  const message_plan* plan;
  value_args args;  // but the param, which is the block's scale
  const float* values;
  std::byte* out;
  float* sent;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept {
    return (live_entries() + Coding::scale_block - 1) / Coding::scale_block;
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const {
    const std::size_t first = b * Coding::scale_block;
    if (!live(first)) return;
    const std::size_t last = first + Coding::scale_block < status->count ? first + Coding::scale_block : status->count;
    std::uint32_t max_key = 0;
    for (std::size_t j = first; j < last; ++j) {
      const std::uint32_t key = magnitude_key(values[j]);
      max_key = key > max_key ? key : max_key;
    }
    value_args a = args;
    a.param = Coding::block_scale(max_key);
    std::byte* block = value_section(out, plan) + b * scaled_block_bytes<Coding>();
    store_le<float>(block, a.param);
    constexpr unsigned bits = Coding::entry_bits(0);
    static_assert(8 % bits == 0, "a byte holds whole fields");
    for (std::size_t j = first; j < last; j += 8 / bits) {  // byte by byte
      std::uint32_t byte = 0;
      for (std::size_t e = j; e < last && e < j + 8 / bits; ++e) {
        float decoded = 0.0f;
        byte |= Coding::encode(values[e], a, e, decoded) << ((e - j) * bits);
        sent[e] = decoded;
      }
      block[4 + (j - first) * bits / 8] = static_cast<std::byte>(byte);
    }
  }
};

// -- 7: the checksum --------------------------------------------------------------------

/// parts[c] = the CRC-32C register that message bytes [16 + c * tile, ...) give from 0.
struct checksum_part : step_entries {
  const message_plan* plan;
  const std::byte* out;
  std::uint32_t* parts;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t c) const {
    if (status->non_finite != 0) return;
    parts[c] = message_checksum_part(out, plan->bytes, c);
  }
};

/// The message's CRC-32C with its checksum field read as 0 (message_checksum): the
/// first 12 bytes and four zeros, then each tile's register chained on.
struct checksum_finish : step_entries {
  const message_plan* plan;
  const std::uint32_t* parts;
  std::byte* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (status->non_finite != 0) return;
    store_le<std::uint32_t>(out + 12, message_checksum_of_parts(out, plan->bytes, parts));
  }
};

// -- the writer -------------------------------------------------------------------------

/// Writes messages of encode::index_value on `Backend`, in its memory, from the values
/// already gathered; workspace for up to `capacity` entries is allocated here, once.
template <class Backend>
class message_writer {
 public:
  message_writer(const Backend& be, const encode::index_value& policy, std::size_t n, std::size_t capacity)
      : n_(n),
        plan_(be.template allocate<message_plan>(1)),
        widths_(be.template allocate<std::uint32_t>(blocks_of(capacity, delta_block))),
        group_width_(be.template allocate<std::uint64_t>(blocks_of(blocks_of(capacity, delta_block), delta_group))),
        tile_(be.template allocate<double>(tile_count(capacity))),
        parts_(be.template allocate<std::uint32_t>(blocks_of(policy.max_bytes(n, capacity), checksum_chunk))) {}

  /// Queues the message of the status's count entries, index[j] with values[j], into
  /// `out` (the backend's memory, policy.max_bytes(n, capacity) bytes) and what the
  /// receiver decodes into sent[j]; its size goes to the status. Every pass runs over
  /// `bound` entries (at most the capacity; the count where the host knows it, else the
  /// capacity), guarded by the count. Writes nothing if the status holds a NaN.
  void queue(const Backend& be, const encode::index_value& policy, std::size_t bound, const std::uint32_t* index,
             const float* values, std::uint64_t step, std::byte* out, float* sent, step_status* status) {
    const step_entries entries{status};
    const std::size_t blocks = blocks_of(bound, delta_block);
    const std::size_t groups = blocks_of(blocks, delta_group);
    message_plan* plan = plan_.data();
    be.clear(plan, 1);
    visit_value_coding(policy.value, [&](auto coding) {  // what the coding needs of all values
      constexpr value_statistic statistic = decltype(coding)::statistic;
      if constexpr (statistic == value_statistic::max_magnitude) {
        be.reduce_max(bound, value_key{entries, values}, &plan->max_key);
      } else if constexpr (statistic != value_statistic::none) {
        be.sum(bound, value_moment{entries, values, statistic == value_statistic::sum_squares}, tile_.data(),
               &plan->moment);
      }
    });
    const bool delta = policy.index == index_coding::delta_bitpack || policy.index == index_coding::automatic;
    if (delta) {
      be.for_each(blocks, delta_block_width{entries, index, widths_.data()});
      be.for_each(groups, delta_group_width{widths_.data(), blocks, group_width_.data()});
    }
    be.for_each(1, plan_message{entries, policy.index, policy.value, policy.levels, policy.checksum, n_, widths_.data(),
                                group_width_.data(), delta ? groups : 0, plan, out, status});

    const planned_section section{entries, plan};
    std::byte* index_section = out + message_header::size;
    if (policy.index == index_coding::raw32 || policy.index == index_coding::automatic) {
      be.for_each(bound, write_raw32{section, index, index_section});
    }
    // automatic picks a bitmap only when it is smaller than raw32 (4 bytes an entry).
    const std::uint64_t bitmap = bitmap_bytes(n_);
    if (policy.index == index_coding::bitmap || (policy.index == index_coding::automatic && bitmap < 4 * bound)) {
      be.for_each(bitmap, clear_bitmap{section, index_section});
      be.for_each(bound, write_bitmap{section, index, index_section});
    }
    if (delta) {
      be.for_each(blocks, write_delta_block{section, index, widths_.data(), group_width_.data(), index_section});
    }

    const value_args args{0.0f, policy.levels, policy.seed, step};
    visit_value_coding(policy.value, [&](auto coding) {
      using C = decltype(coding);
      if constexpr (C::scale_block != 0) {
        be.for_each(blocks_of(bound, C::scale_block), write_scaled_block<C>{entries, plan, args, values, out, sent});
      } else if constexpr (C::byte_aligned) {
        be.for_each(bound, write_entries<C>{entries, plan, args, values, out, sent});
      } else {
        const auto bytes = static_cast<std::size_t>(value_section_bytes(C::id, bound, policy.levels));
        be.for_each(bytes, write_packed_byte<C>{entries, plan, args, values, out, sent});
      }
    });

    if (policy.checksum) {
      const std::size_t parts = blocks_of(policy.max_bytes(n_, bound), checksum_chunk);
      be.for_each(parts, checksum_part{entries, plan, out, parts_.data()});
      be.for_each(1, checksum_finish{entries, plan, parts_.data(), out});
    }
  }

  [[nodiscard]] std::size_t held_bytes() const noexcept {
    return bytes_held(plan_, widths_, group_width_, tile_, parts_);
  }

 private:
  std::size_t n_;
  typename Backend::template buffer<message_plan> plan_;
  typename Backend::template buffer<std::uint32_t> widths_;       // delta: each block's bit width
  typename Backend::template buffer<std::uint64_t> group_width_;  // delta: each group's widths, then where it starts
  typename Backend::template buffer<double> tile_;                // the fixed-order sum's tile sums
  typename Backend::template buffer<std::uint32_t> parts_;        // the checksum's registers
};

/// encode::index_value on every backend. Messages are the backend's memory, except on
/// a Kokkos space the host cannot reach, whose messages are host memory, as that
/// backend's compressor documents: written in the space, then copied out.
template <class Backend>
class engine<encode::index_value, Backend> {
  static constexpr bool staged =
      !Backend::host_accessible && std::is_same_v<typename Backend::message_memory, host_memory>;

 public:
  engine(const Backend& be, const encode::index_value& policy, std::size_t n, std::size_t capacity)
      : writer_(be, policy, n, capacity),
        values_(be.template allocate<float>(capacity)),
        message_(be.template allocate<std::byte>(staged ? policy.max_bytes(n, capacity) : 0)) {}

  /// The size of every message of `count` entries when it does not depend on the
  /// values or which indices they are: raw32 or bitmap indices.
  [[nodiscard]] static std::optional<std::size_t> fixed_bytes(const encode::index_value& policy, std::size_t n,
                                                              std::size_t count) {
    if (policy.index != index_coding::raw32 && policy.index != index_coding::bitmap) return std::nullopt;
    return policy.max_bytes(n, count);
  }

  /// Queues the message of the selected entries into `out` and what the receiver
  /// decodes into `sent`, and its size into the status. `in.index` spans the entries
  /// the host knows of (the count where the host can read the status, else the whole
  /// workspace); the count is the status's.
  void encode(const Backend& be, const encode::index_value& policy, const encode_input& in, std::span<std::byte> out,
              std::span<float> sent, step_status* status) {
    const std::span<std::byte> target = staged ? std::span<std::byte>(message_.data(), message_.size()) : out;
    be.for_each(in.index.size(),
                gather_selected{{status}, in.acc.data(), in.index.data(), in.value_scale, values_.data()});
    writer_.queue(be, policy, in.index.size(), in.index.data(), values_.data(), in.step, target.data(), sent.data(),
                  status);
    if constexpr (staged) {  // a second read of the status, for this configuration only
      be.to_host(message_.data(), static_cast<std::size_t>(be.read(status).bytes), out.data());
    }
  }

  void add_held(held_memory& use) const { use.workspace += writer_.held_bytes() + bytes_held(values_, message_); }

 private:
  message_writer<Backend> writer_;
  typename Backend::template buffer<float> values_;       // the gathered, scaled values
  typename Backend::template buffer<std::byte> message_;  // staged: the message in the space's memory
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
