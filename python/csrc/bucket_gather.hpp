// The DDP hook's exchange of one bucket's messages, in one all-gather in the steady
// state: each rank's frame is its verdict (detail::rank_verdict: its error, its message's
// size, a digest of the settings all ranks must share) followed by its message padded to
// a bound the ranks agreed on before (the previous step's longest message, plus slack).
// A second all-gather follows only when a rank failed or the settings differ (the
// reports, from which every rank raises the same error: detail::settle) or when a
// message outgrew the bound (every message again, padded to the longest).
#pragma once

#include <gradcomp/comm/agreement.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "process_group.hpp"

namespace gradcomp_py {

/// The bound of a bucket's next frame after a step whose longest message had `longest`
/// bytes: an eighth more, rounded up to 64 bytes, at most `capacity` (what the policies
/// can write). Every rank computes it from the same all-gathered sizes.
inline std::size_t next_bound(std::uint64_t longest, std::uint64_t capacity) {
  const std::uint64_t padded = (longest + longest / 8 + 63) / 64 * 64;
  return static_cast<std::size_t>(std::min(padded, capacity));
}

/// One bucket's exchange over `t`: `stage()` (this rank's step, returning its message in
/// host memory, or throwing) runs first; then every rank's message is handed to
/// `add(message, rank)` in rank order on every rank, or every rank throws the same
/// error. `bound` is the frame's message bytes (every rank must pass the same); a size
/// above `capacity` (this rank's policies' largest message) is a broken peer's, refused
/// on every rank alike. Returns the longest message's size (the same on every rank).
template <class Stage, class Add>
std::uint64_t gather_bucket(transport& t, const char* who, std::span<const gradcomp::detail::setting> settings,
                            std::size_t bound, std::uint64_t capacity, Stage&& stage, Add&& add) {
  namespace gd = gradcomp::detail;
  std::vector<std::byte> message;
  const gd::rank_draft mine = gd::draft(who, settings, [&]() -> std::uint64_t {
    message = stage();
    return message.size();
  });
  const auto ranks = static_cast<std::size_t>(t.size);
  const std::size_t frame = gd::rank_verdict::size + bound;
  std::vector<std::byte> own(frame, std::byte{0});
  mine.verdict.write(own.data());
  if (mine.report.code == 0 && message.size() <= bound)
    std::memcpy(own.data() + gd::rank_verdict::size, message.data(), message.size());
  std::vector<std::byte> frames(ranks * frame);
  t.all_gather(own, frames);

  std::vector<std::byte> verdicts(ranks * gd::rank_verdict::size);
  for (std::size_t r = 0; r < ranks; ++r) {
    std::memcpy(verdicts.data() + r * gd::rank_verdict::size, frames.data() + r * frame, gd::rank_verdict::size);
  }
  agreement_comm comm{t};
  const std::vector<std::uint64_t> sizes = gd::settle(comm, who, mine, verdicts);
  // The ranks agreed on n, the policies and their parameters, so no message of theirs
  // outgrows this rank's capacity.
  std::uint64_t longest = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    gd::require(sizes[r] <= capacity, gradcomp::errc::corrupt_message, who, ": rank ", r, " reported a message of ",
                sizes[r], " bytes, more than the ", capacity, " its policies can write");
    longest = std::max(longest, sizes[r]);
  }

  const std::byte* base = frames.data() + gd::rank_verdict::size;
  std::size_t stride = frame;
  std::vector<std::byte> resent;
  if (longest > bound) {  // a message outgrew the frame: every rank's again, padded to the longest
    std::vector<std::byte> padded(static_cast<std::size_t>(longest), std::byte{0});
    std::memcpy(padded.data(), message.data(), message.size());
    resent.resize(ranks * padded.size());
    t.all_gather(padded, resent);
    base = resent.data();
    stride = padded.size();
  }
  for (std::size_t r = 0; r < ranks; ++r) {
    add(std::span<const std::byte>(base + r * stride, static_cast<std::size_t>(sizes[r])), r);
  }
  return longest;
}

}  // namespace gradcomp_py
