/// \file detail/collective_checks.hpp
/// How the ranks of a collective agree before any of them can diverge: the first
/// exchange of every collective carries each rank's verdict on its own arguments and
/// the settings all ranks must share, so that every rank raises the same error, or
/// none does. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/wire.hpp>
#include <gradcomp/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

/// A value every rank of a collective must hold alike (n, k, a layout's checksum).
struct setting {
  const char* name;
  std::uint64_t value;
};

/// One rank's part of the first exchange, as fixed-size little-endian bytes: its
/// error (0, or 1 + errc, and the text), up to max_settings shared settings, and one
/// value of its own that the others may use (a message size, the leader's count).
struct rank_report {
  static constexpr std::size_t size = 256;
  static constexpr std::size_t max_settings = 6;
  static constexpr std::size_t text_at = 8 + 8 * max_settings + 8;
  static constexpr std::size_t max_text = size - text_at;

  std::uint32_t code = 0;
  std::string text;
  std::uint64_t settings[max_settings] = {};
  std::uint64_t own = 0;

  void write(std::byte* out) const {
    const std::size_t length = std::min(text.size(), max_text);
    store_le<std::uint32_t>(out, code);
    store_le<std::uint32_t>(out + 4, static_cast<std::uint32_t>(length));
    for (std::size_t s = 0; s < max_settings; ++s) store_le<std::uint64_t>(out + 8 + 8 * s, settings[s]);
    store_le<std::uint64_t>(out + 8 + 8 * max_settings, own);
    std::fill(out + text_at, out + size, std::byte{0});
    for (std::size_t c = 0; c < length; ++c) out[text_at + c] = static_cast<std::byte>(text[c]);
  }
  static rank_report read(const std::byte* in) {
    rank_report r;
    r.code = load_le<std::uint32_t>(in);
    const std::size_t length = std::min<std::size_t>(load_le<std::uint32_t>(in + 4), max_text);
    for (std::size_t s = 0; s < max_settings; ++s) r.settings[s] = load_le<std::uint64_t>(in + 8 + 8 * s);
    r.own = load_le<std::uint64_t>(in + 8 + 8 * max_settings);
    for (std::size_t c = 0; c < length; ++c) r.text.push_back(static_cast<char>(in[text_at + c]));
    return r;
  }
};

/// Runs `attempt` (this rank's own checks, returning its own value) and exchanges its
/// verdict and `settings` with every rank of `comm` in one all-gather of
/// rank_report::size bytes per rank (`comm.all_gather(mine, all)`). Then, identically
/// on every rank: if any rank's attempt threw gradcomp::error, every rank throws the
/// error of the lowest such rank (its code and text, naming the rank); otherwise, if
/// the ranks hold different values of a setting, every rank throws
/// errc::invalid_argument naming it and two ranks' values.
/// \returns every rank's own value, in rank order
template <class Comm, class Attempt>
std::vector<std::uint64_t> agree(Comm& comm, const char* who, std::span<const setting> settings, Attempt&& attempt) {
  rank_report mine;
  try {
    mine.own = attempt();
  } catch (const error& e) {
    mine.code = 1 + static_cast<std::uint32_t>(e.code());
    const std::string_view text = e.what();
    constexpr std::string_view prefix = "gradcomp: ";
    mine.text = std::string(text.substr(text.starts_with(prefix) ? prefix.size() : 0));
  }
  std::size_t s = 0;
  for (const setting& each : settings) {
    if (s < rank_report::max_settings) mine.settings[s++] = each.value;
  }

  const auto ranks = static_cast<std::size_t>(comm.size());
  std::vector<std::byte> all(ranks * rank_report::size);
  std::byte own_bytes[rank_report::size];
  mine.write(own_bytes);
  comm.all_gather(std::span<const std::byte>(own_bytes, rank_report::size), std::span<std::byte>(all));

  std::vector<rank_report> reports;
  for (std::size_t r = 0; r < ranks; ++r) reports.push_back(rank_report::read(all.data() + r * rank_report::size));
  for (std::size_t r = 0; r < ranks; ++r) {
    if (reports[r].code == 0) continue;
    const std::uint32_t code = std::min<std::uint32_t>(reports[r].code - 1, static_cast<std::uint32_t>(errc::device));
    fail(static_cast<errc>(code), reports[r].text, " (rank ", r, " of ", ranks, ")");
  }
  s = 0;
  for (const setting& each : settings) {
    if (s == rank_report::max_settings) break;
    for (std::size_t r = 1; r < ranks; ++r) {
      require(reports[r].settings[s] == reports[0].settings[s], errc::invalid_argument, who, ": ranks disagree on ",
              each.name, ": rank 0 has ", reports[0].settings[s], ", rank ", r, " has ", reports[r].settings[s]);
    }
    ++s;
  }
  std::vector<std::uint64_t> own(ranks);
  for (std::size_t r = 0; r < ranks; ++r) own[r] = reports[r].own;
  return own;
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
template <class Comm, class Attempt>
std::vector<std::uint64_t> agree(Comm& comm, const char* who, std::initializer_list<setting> settings,
                                 Attempt&& attempt) {
  return agree(comm, who, std::span<const setting>(settings.begin(), settings.size()),
               std::forward<Attempt>(attempt));
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
