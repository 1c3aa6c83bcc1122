/// \file comm/agreement.hpp
/// How the ranks of a collective agree before any of them can diverge: the first
/// exchange of every collective carries each rank's verdict on its own arguments and
/// the settings all ranks must share, so that every rank raises the same error, or
/// none does. Not API.
#pragma once

#include <gradcomp/comm/transport.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/detail/core/wire.hpp>
#include <gradcomp/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// \throws gradcomp::error unless there is one dense tensor per message and `scale` is
///         finite.
inline void check_aggregation_args(std::size_t messages, std::size_t dense, float scale) {
  require(messages == dense, errc::invalid_argument, "allgather_accumulate: ", messages, " messages for ", dense,
          " dense tensors");
  require(std::isfinite(scale), errc::invalid_argument, "allgather_accumulate: scale must be finite, got ", scale);
}

/// A value every rank of a collective must hold alike (n, k, a layout's checksum, a
/// DDP hook's method and options), as its name and its value written out: an error
/// names both ranks' values as they read.
struct setting {
  std::string name;
  std::string value;
  setting(std::string name_, std::uint64_t value_) : name(std::move(name_)), value(std::to_string(value_)) {}
  setting(std::string name_, std::string value_) : name(std::move(name_)), value(std::move(value_)) {}
};

/// One rank's part of the first exchange (rank_verdict::size little-endian bytes): 0
/// or 1 + errc of its error, one value of its own that the others may use (a message
/// size, the leader's count), and a 64-bit digest (FNV-1a) of its written settings.
/// Where every rank says 0 and the digests agree, this is the whole agreement.
struct rank_verdict {
  static constexpr std::size_t size = 24;

  std::uint32_t code = 0;
  std::uint64_t own = 0;
  std::uint64_t digest = 0;

  void write(std::byte* out) const {
    store_le<std::uint32_t>(out, code);
    store_le<std::uint32_t>(out + 4, 0);
    store_le<std::uint64_t>(out + 8, own);
    store_le<std::uint64_t>(out + 16, digest);
  }
  static rank_verdict read(const std::byte* in) {
    return {load_le<std::uint32_t>(in), load_le<std::uint64_t>(in + 8), load_le<std::uint64_t>(in + 16)};
  }
  /// Byte `i` (< size) of the verdict write() writes: for a pass that writes it where
  /// the memory is, one byte per item.
  GRADCOMP_HOST_DEVICE static std::byte byte_of(std::size_t i, std::uint32_t code, std::uint64_t own,
                                                std::uint64_t digest) noexcept {
    std::uint64_t byte = 0;
    if (i < 4) {
      byte = code >> (8 * i);
    } else if (i >= 8 && i < 16) {
      byte = own >> (8 * (i - 8));
    } else if (i >= 16 && i < size) {
      byte = digest >> (8 * (i - 16));
    }
    return static_cast<std::byte>(byte & 0xFF);
  }
  /// FNV-1a, 64 bits, of `text`.
  static std::uint64_t digest_of(std::string_view text) noexcept {
    std::uint64_t h = 0xCBF29CE484222325ull;
    for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
    return h;
  }
};

/// The first collective of an exchange that runs in the compressor's memory
/// (cyclic_topk, sparse_allreduce), all-gathered: each rank's verdict, then two sizes of
/// the exchange's later collectives as its exchange last agreed them, so that a rank
/// without an exchange (a DDP hook's that failed before it had one) can take part in
/// them at the sizes the others sent. An exchange with no sizes to offer (a rank without
/// one, an exchange that agreed none) sends 0 in both; one that has them never does
/// (each exchange says how it encodes its sizes).
struct sized_frame {
  static constexpr std::size_t size = rank_verdict::size + 16;
  static constexpr std::size_t sizes_at = rank_verdict::size;  ///< the two sizes, u64 each
};

/// Byte i of this rank's frame, written where the memory is: `code` (this rank's error
/// met on the host, 1 + errc), or where that is 0, non_finite's if `status` (its step's,
/// null after an error) met a NaN or infinity; its own value, the count of `own` (null:
/// 0, and 0 after an error); the settings' digest; then `sizes`.
struct sized_frame_byte {
  std::uint32_t code;
  std::uint64_t digest;
  const step_status* status;
  const step_status* own;
  std::uint64_t sizes[2];
  std::byte* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    if (i >= sized_frame::sizes_at) {
      const std::uint64_t word = sizes[(i - sized_frame::sizes_at) / 8];
      out[i] = static_cast<std::byte>((word >> (8 * ((i - sized_frame::sizes_at) % 8))) & 0xFF);
      return;
    }
    const std::uint32_t verdict =
        code != 0
            ? code
            : (status != nullptr && status->non_finite != 0 ? 1 + static_cast<std::uint32_t>(errc::non_finite) : 0u);
    const std::uint64_t value = verdict == 0 && own != nullptr ? own->count : 0;
    out[i] = rank_verdict::byte_of(i, verdict, value, digest);
  }
};

/// Whether every rank's frame (`frames`, sized_frame::size bytes each, in rank order) says no
/// error and the settings' digest `digest` (this rank's).
GRADCOMP_HOST_DEVICE inline bool frames_alike(const std::byte* frames, std::size_t ranks, std::uint64_t digest) {
  bool alike = true;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::byte* v = frames + r * sized_frame::size;
    alike = alike && load_le<std::uint32_t>(v) == 0 && load_le<std::uint64_t>(v + 16) == digest;
  }
  return alike;
}

/// One rank's part of the second exchange, made only when the first showed an error or
/// settings that differ, as fixed-size little-endian bytes: its error (0, or 1 + errc,
/// and the text) and its settings, each written as name, unit separator, value, record
/// separator, so that every rank can name the first difference with both values.
struct rank_report {
  static constexpr std::size_t size = 1024;
  static constexpr std::size_t text_at = 16;
  static constexpr std::size_t max_text = 320;
  static constexpr std::size_t settings_at = text_at + max_text;
  static constexpr std::size_t max_settings = size - settings_at;  ///< bytes of written settings

  std::uint32_t code = 0;
  std::string text;
  std::string settings;

  void write(std::byte* out) const {
    const std::size_t length = std::min(text.size(), max_text);
    const std::size_t written = std::min(settings.size(), max_settings);
    std::fill(out, out + size, std::byte{0});
    store_le<std::uint32_t>(out, code);
    store_le<std::uint32_t>(out + 4, static_cast<std::uint32_t>(length));
    store_le<std::uint32_t>(out + 8, static_cast<std::uint32_t>(written));
    for (std::size_t c = 0; c < length; ++c) out[text_at + c] = static_cast<std::byte>(text[c]);
    for (std::size_t c = 0; c < written; ++c) out[settings_at + c] = static_cast<std::byte>(settings[c]);
  }
  static rank_report read(const std::byte* in) {
    rank_report r;
    r.code = load_le<std::uint32_t>(in);
    const std::size_t length = std::min<std::size_t>(load_le<std::uint32_t>(in + 4), max_text);
    const std::size_t written = std::min<std::size_t>(load_le<std::uint32_t>(in + 8), max_settings);
    for (std::size_t c = 0; c < length; ++c) r.text.push_back(static_cast<char>(in[text_at + c]));
    for (std::size_t c = 0; c < written; ++c) r.settings.push_back(static_cast<char>(in[settings_at + c]));
    return r;
  }

  /// `settings` written as the report carries them.
  static std::string written(std::span<const setting> settings) {
    std::string out;
    for (const setting& each : settings) out += each.name + unit + each.value + record;
    return out;
  }
  /// The settings of a report, in order, as (name, value).
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> parsed() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (std::size_t at = 0; at < settings.size();) {
      const std::size_t end = std::min(settings.find(record, at), settings.size());
      const std::string_view item = std::string_view(settings).substr(at, end - at);
      const std::size_t cut = std::min(item.find(unit), item.size());
      out.emplace_back(std::string(item.substr(0, cut)), std::string(item.substr(std::min(cut + 1, item.size()))));
      at = end + 1;
    }
    return out;
  }

  static constexpr char unit = '\x1f';
  static constexpr char record = '\x1e';
};

/// The value rank `r`'s report gives `name`, or "(not set)".
inline std::string value_of(const std::vector<std::pair<std::string, std::string>>& settings, const std::string& name) {
  for (const auto& [key, value] : settings) {
    if (key == name) return value;
  }
  return "(not set)";
}

/// One rank's side of an agreement before anything is exchanged: its report (its error,
/// if `attempt` threw one, and its written settings), its own value and its verdict.
struct rank_draft {
  rank_report report;
  rank_verdict verdict;
};

/// Runs `attempt` (this rank's own checks, returning its own value) and writes down what
/// this rank tells the others: a gradcomp::error it threw becomes the report's code and
/// text, any other exception (an allocator's out of memory: std::bad_alloc, PyTorch's
/// c10::OutOfMemoryError) errc::device with its text, so that every rank raises it
/// rather than the others waiting for this one (nothing is thrown here).
template <class Attempt>
rank_draft draft(const char* who, std::span<const setting> settings, Attempt&& attempt) {
  rank_draft d;
  d.report.settings = rank_report::written(settings);
  try {
    require(d.report.settings.size() <= rank_report::max_settings, errc::invalid_argument, who, ": the settings take ",
            d.report.settings.size(), " bytes, more than the ", rank_report::max_settings,
            " the ranks' report carries");
    d.verdict.own = attempt();
  } catch (const error& e) {
    d.report.code = 1 + static_cast<std::uint32_t>(e.code());
    const std::string_view text = e.what();
    constexpr std::string_view prefix = "gradcomp: ";
    d.report.text = std::string(text.substr(text.starts_with(prefix) ? prefix.size() : 0));
    d.verdict.own = 0;
  } catch (const std::exception& e) {
    d.report.code = 1 + static_cast<std::uint32_t>(errc::device);
    d.report.text = std::string(who) + ": " + e.what();
    d.verdict.own = 0;
  }
  d.verdict.code = d.report.code;
  d.verdict.digest = rank_verdict::digest_of(d.report.settings);
  return d;
}

/// Reads every rank's verdict (`verdicts`: rank_verdict::size bytes per rank, in rank
/// order, the same bytes on every rank) and, where a rank failed or the digests differ,
/// exchanges the reports (a second all-gather of rank_report::size bytes per rank) and
/// throws, identically on every rank: the error of the lowest rank whose attempt threw
/// (its code and text, naming the rank), else errc::invalid_argument naming a setting
/// the ranks hold differently (or one holds and another lacks) and two ranks' values.
/// \returns every rank's own value, in rank order
template <comm::collectives Comm>
std::vector<std::uint64_t> settle(Comm& comm, const char* who, const rank_draft& mine,
                                  std::span<const std::byte> verdicts) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> own(ranks);
  bool alike = true;
  for (std::size_t r = 0; r < ranks; ++r) {
    const rank_verdict theirs = rank_verdict::read(verdicts.data() + r * rank_verdict::size);
    own[r] = theirs.own;
    alike = alike && theirs.code == 0 && theirs.digest == mine.verdict.digest;
  }
  if (alike) return own;

  // Every rank read the same verdicts, so every rank makes this exchange, or none does.
  std::vector<std::byte> all(ranks * rank_report::size);
  std::vector<std::byte> own_bytes(rank_report::size);
  mine.report.write(own_bytes.data());
  comm.all_gather(std::span<const std::byte>(own_bytes), std::span<std::byte>(all));

  std::vector<rank_report> reports;
  for (std::size_t r = 0; r < ranks; ++r) reports.push_back(rank_report::read(all.data() + r * rank_report::size));
  for (std::size_t r = 0; r < ranks; ++r) {
    if (reports[r].code == 0) continue;
    const std::uint32_t code = std::min<std::uint32_t>(reports[r].code - 1, static_cast<std::uint32_t>(errc::device));
    fail(static_cast<errc>(code), reports[r].text, " (rank ", r, " of ", ranks, ")");
  }
  const auto first = reports[0].parsed();
  for (std::size_t r = 1; r < ranks; ++r) {
    const auto theirs = reports[r].parsed();
    const auto disagree = [&](const std::string& name) {
      const std::string a = value_of(first, name);
      const std::string b = value_of(theirs, name);
      require(a == b, errc::invalid_argument, who, ": ranks disagree on ", name, ": rank 0 has ", a, ", rank ", r,
              " has ", b);
    };
    for (const auto& each : first) disagree(each.first);
    for (const auto& each : theirs) disagree(each.first);
  }
  return own;  // the digests differed, the settings (up to what the report carries) do not
}

/// agree() of a draft made before (`mine`: this rank's attempt already run).
template <comm::collectives Comm>
std::vector<std::uint64_t> agree_on_draft(Comm& comm, const char* who, const rank_draft& mine,
                                          std::span<std::byte> carried = {}, std::span<std::byte> all_carried = {}) {
  if (mine.report.code != 0) std::fill(carried.begin(), carried.end(), std::byte{0});
  const auto ranks = static_cast<std::size_t>(comm.size());
  const std::size_t frame = rank_verdict::size + carried.size();
  std::vector<std::byte> own(frame);
  mine.verdict.write(own.data());
  std::copy(carried.begin(), carried.end(), own.begin() + rank_verdict::size);
  std::vector<std::byte> frames(ranks * frame);
  comm.all_gather(std::span<const std::byte>(own), std::span<std::byte>(frames));
  std::vector<std::byte> verdicts(ranks * rank_verdict::size);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::byte* at = frames.data() + r * frame;
    std::copy(at, at + rank_verdict::size, verdicts.data() + r * rank_verdict::size);
    std::copy(at + rank_verdict::size, at + frame, all_carried.data() + r * carried.size());
  }
  return settle(comm, who, mine, verdicts);
}

/// Runs `attempt` (this rank's own checks, returning its own value) and exchanges its
/// verdict and a digest of `settings` with every rank of `comm` in one all-gather of
/// rank_verdict::size bytes per rank (`comm.all_gather(mine, all)`), then settle()s:
/// every rank throws the same error, or none does. `carried` (which `attempt` may
/// write; zeros where it threw) travels beside the verdict in the same all-gather, every
/// rank's into `all_carried` (carried.size() bytes per rank, in rank order): what the
/// ranks must learn of each other once every rank's attempt has run, at no collective
/// of its own.
/// \returns every rank's own value, in rank order
template <comm::collectives Comm, class Attempt>
std::vector<std::uint64_t> agree(Comm& comm, const char* who, std::span<const setting> settings, Attempt&& attempt,
                                 std::span<std::byte> carried = {}, std::span<std::byte> all_carried = {}) {
  return agree_on_draft(comm, who, draft(who, settings, std::forward<Attempt>(attempt)), carried, all_carried);
}

/// The sum of the sizes the ranks reported, saturated (a peer's size is not trusted to
/// leave room for the others).
inline std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}
inline std::uint64_t total_size(std::span<const std::uint64_t> sizes) noexcept {
  std::uint64_t total = 0;
  for (const std::uint64_t s : sizes) total = saturating_add(total, s);
  return total;
}

/// A checksum of names and sizes that ranks compare as one setting (a bucket's layout,
/// the policies of a compressor).
class fingerprint {
 public:
  fingerprint& add(std::uint64_t v) noexcept {
    std::byte b[8];
    store_le<std::uint64_t>(b, v);
    crc_ = crc32c_update(crc_, b, 8);
    return *this;
  }
  fingerprint& add(std::string_view text) noexcept {
    crc_ = crc32c_update(crc_, reinterpret_cast<const std::byte*>(text.data()), text.size());
    return add(text.size());
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return crc32c_final(crc_); }

 private:
  std::uint32_t crc_ = crc32c_init;
};

/// agree() with the settings written in place: `agree(comm, who, {{"n", n}}, attempt)`.
template <comm::collectives Comm, class Attempt>
std::vector<std::uint64_t> agree(Comm& comm, const char* who, std::initializer_list<setting> settings,
                                 Attempt&& attempt, std::span<std::byte> carried = {},
                                 std::span<std::byte> all_carried = {}) {
  return agree(comm, who, std::span<const setting>(settings.begin(), settings.size()), std::forward<Attempt>(attempt),
               carried, all_carried);
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
