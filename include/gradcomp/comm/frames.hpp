/// \file comm/frames.hpp
/// The all-gather aggregation's exchange, written once for every transport (comm::mpi's
/// bucketed allgather_accumulate, the PyTorch DDP hook): each rank's message travels in
/// one all-gather in the steady state, in a frame of fixed size that begins with the
/// rank's verdict (comm/agreement.hpp: its error, its message's size, a digest of the
/// settings all ranks must share) and holds the message padded to a bound the ranks
/// agreed on before (the previous exchange's longest message, plus slack). A second
/// exchange follows only when a rank failed or the settings differ (the reports, from
/// which every rank raises the same error) or when a message outgrew the bound (every
/// message again, at its own size).
#pragma once

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/comm/transport.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

/// The bound of the next frame after an exchange whose longest message had `longest`
/// bytes: an eighth more, rounded up to 64 bytes, at most `capacity` (the largest
/// message the ranks' policies can write). Every rank computes it from the same sizes.
inline std::size_t next_frame_bound(std::uint64_t longest, std::uint64_t capacity) {
  const std::uint64_t padded = (longest + longest / 8 + 63) / 64 * 64;
  return static_cast<std::size_t>(std::min(padded, capacity));
}

/// Byte i of a frame written where the message was (a device's memory: nothing read
/// back): the verdict (rank_verdict's layout) with code `code`, or where that is 0,
/// non_finite's if the step's `status` says so; its own value the message's size from
/// the status (0 after an error), the settings' `digest`; then the message's first
/// bytes, those of a message that fits `bound` (the frame holds rank_verdict::size +
/// bound bytes; a message that does not fit is announced by its size alone, as
/// gather_frames does).
struct frame_byte {
  const detail::step_status* status;  ///< the step's status (the backend's memory)
  std::uint32_t code;                 ///< this rank's error code met on the host (1 + errc), or 0
  std::uint64_t digest;               ///< the digest of the settings the ranks share
  const std::byte* message;           ///< where the step wrote its message
  std::byte* frame;                   ///< rank_verdict::size + bound bytes, written here
  std::size_t bound;                  ///< the message bytes a frame holds

  /// Writes byte `i` of the frame.
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::uint32_t verdict =
        code != 0 ? code : (status->non_finite != 0 ? 1 + static_cast<std::uint32_t>(errc::non_finite) : 0u);
    const std::uint64_t size = verdict == 0 ? status->bytes : 0;
    constexpr std::size_t head = detail::rank_verdict::size;
    if (i < head) {
      frame[i] = detail::rank_verdict::byte_of(i, verdict, size, digest);
    } else {
      frame[i] = size <= bound && i - head < size ? message[i - head] : std::byte{0};
    }
  }
};

/// One exchange of every rank's message over `comm`: `stage()` (this rank's work,
/// returning its message as bytes in host memory, or throwing gradcomp::error) runs
/// first; then `add(message, rank)` is called for every rank's message, in rank order,
/// on every rank, or every rank throws the same error (settle(): the lowest failed
/// rank's, else the first setting the ranks hold differently). `bound` is the frame's
/// message bytes (every rank passes the same, e.g. next_frame_bound of the last
/// exchange); a size above `capacity` (the largest message this rank's policies can
/// write) is a broken peer's, refused on every rank alike.
/// \returns the longest message's size (the same on every rank)
template <class Comm, class Stage, class Add>
  requires collectives<Comm> && requires(Comm& c, std::span<const std::byte> mine, std::span<const std::uint64_t> sizes,
                                         std::span<std::byte> all) { c.all_gather_v(mine, sizes, all); }
std::uint64_t gather_frames(Comm& comm, const char* who, std::span<const detail::setting> settings, std::size_t bound,
                            std::uint64_t capacity, Stage&& stage, Add&& add) {
  // What stage() returned (a vector it made, or a view of bytes it keeps), taken as it is.
  std::invoke_result_t<Stage&> staged{};
  const detail::rank_draft mine = detail::draft(who, settings, [&]() -> std::uint64_t {
    staged = stage();
    return std::span<const std::byte>(staged).size();
  });
  const std::span<const std::byte> message(staged);
  const auto ranks = static_cast<std::size_t>(comm.size());
  const std::size_t frame = detail::rank_verdict::size + bound;
  std::vector<std::byte> own(frame, std::byte{0});
  mine.verdict.write(own.data());
  if (mine.report.code == 0 && message.size() <= bound) {
    std::memcpy(own.data() + detail::rank_verdict::size, message.data(), message.size());
  }
  std::vector<std::byte> frames(ranks * frame);
  comm.all_gather(own, frames);

  std::vector<std::byte> verdicts(ranks * detail::rank_verdict::size);
  for (std::size_t r = 0; r < ranks; ++r) {
    std::memcpy(verdicts.data() + r * detail::rank_verdict::size, frames.data() + r * frame,
                detail::rank_verdict::size);
  }
  const std::vector<std::uint64_t> sizes = detail::settle(comm, who, mine, verdicts);
  // The ranks agreed on the settings that fix what their policies can write, so no
  // message of theirs outgrows this rank's capacity.
  std::uint64_t longest = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    detail::require(sizes[r] <= capacity, errc::corrupt_message, who, ": rank ", r, " reported a message of ", sizes[r],
                    " bytes, more than the ", capacity, " its policies can write");
    longest = std::max(longest, sizes[r]);
  }
  if (longest <= bound) {
    for (std::size_t r = 0; r < ranks; ++r) {
      add(std::span<const std::byte>(frames.data() + r * frame + detail::rank_verdict::size,
                                     static_cast<std::size_t>(sizes[r])),
          r);
    }
    return longest;
  }
  // A message outgrew the frame: every rank's again, at its own size.
  std::vector<std::byte> all(static_cast<std::size_t>(detail::total_size(sizes)));
  comm.all_gather_v(message, sizes, all);
  for (std::size_t r = 0, at = 0; r < ranks; at += static_cast<std::size_t>(sizes[r]), ++r) {
    add(std::span<const std::byte>(all.data() + at, static_cast<std::size_t>(sizes[r])), r);
  }
  return longest;
}

}  // namespace comm
GRADCOMP_NAMESPACE_END
