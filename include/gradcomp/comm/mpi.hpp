/// \file comm/mpi.hpp
/// Moving compressed messages between the ranks of an MPI communicator (needs MPI;
/// CMake: gradcomp::mpi). Also brings comm::cyclic_topk and comm::sparse_allreduce.
#pragma once

#include <gradcomp/comm/cyclic_topk.hpp>
#include <gradcomp/comm/frames.hpp>
#include <gradcomp/comm/path.hpp>
#include <gradcomp/comm/sparse_allreduce.hpp>
#include <gradcomp/comm/transport.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/detail/core/wire.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

/// The aggregation collectives over one MPI communicator. Receive buffers grow to the
/// largest exchange seen and are reused, so steady-state steps allocate nothing.
class mpi {
 public:
  /// The memory of the compressors it serves (comm::transport): the host's.
  using memory = host_memory;

  /// \throws gradcomp::error if the communicator is MPI_COMM_NULL.
  explicit mpi(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    detail::require(comm != MPI_COMM_NULL, errc::invalid_argument, "comm::mpi: the communicator is MPI_COMM_NULL");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }               ///< this process's rank
  [[nodiscard]] int size() const noexcept { return size_; }               ///< ranks in the communicator
  [[nodiscard]] MPI_Comm communicator() const noexcept { return comm_; }  ///< the communicator

  /// Sparse all-gather: `dense += scale * sum over ranks of decode(message of rank r)`,
  /// ranks in order, identically on every rank. Messages may differ in size and count
  /// (zero entries, per-rank densities). When all messages together would be larger
  /// than the dense tensor, each rank decodes its own and the dense tensors are summed
  /// instead (reduce to rank 0, broadcast), which every rank also ends with identically.
  /// Every rank validates every message before touching `dense`; a corrupt message
  /// raises gradcomp::error on all ranks alike and leaves `dense` unchanged.
  /// \returns the path taken, the same on every rank
  path allgather_accumulate(std::span<const std::byte> message, std::span<float> dense, float scale) {
    sizes_ = detail::agree(*this, who, {{"n", dense.size()}}, [&] {
      detail::check_aggregation_args(1, 1, scale);
      return message.size();
    });
    const std::uint64_t total = detail::total_size(sizes_);
    if (total > static_cast<std::uint64_t>(dense.size()) * sizeof(float)) {
      dense_path(message, dense, scale);
      return path::dense;
    }
    sparse_path(message, dense, scale, total);
    return path::sparse;
  }

  /// Bucketed sparse all-gather for many tensors (a model's layers) in one exchange:
  /// `messages[t]` is this rank's message for tensor t and `dense[t]` its aggregate, for
  /// every t; then `dense[t] += scale * sum over ranks of decode(message of rank r for
  /// tensor t)`, ranks in order. The tensors travel together in one bucket per rank
  /// (u64 tensor count, u64 size of each message, the messages), exchanged as the DDP
  /// hook exchanges its buckets (comm/frames.hpp): in the steady state one MPI_Allgather
  /// whatever the number of tensors, each rank's frame carrying its verdict and its
  /// bucket padded to the bound the last call set. Every message of every rank is
  /// validated first.
  void allgather_accumulate(std::span<const std::span<const std::byte>> messages,
                            std::span<const std::span<float>> dense, float scale) {
    // The ranks agree on the layout (the number of tensors and their sizes) first.
    detail::fingerprint layout;
    for (const auto d : dense) layout.add(d.size());
    const detail::setting settings[] = {{"the number of tensors", dense.size()}, {"the tensor sizes", layout.value()}};
    const auto stage = [&] {
      detail::check_aggregation_args(messages.size(), dense.size(), scale);
      bucket_.assign(8 * (1 + messages.size()), std::byte{0});
      detail::store_le<std::uint64_t>(bucket_.data(), messages.size());
      for (std::size_t t = 0; t < messages.size(); ++t) {
        detail::store_le<std::uint64_t>(bucket_.data() + 8 * (1 + t), messages[t].size());
        bucket_.insert(bucket_.end(), messages[t].begin(), messages[t].end());
      }
      return std::span<const std::byte>(bucket_);
    };
    gathered_.clear();
    bucket_at_.clear();
    const auto keep = [&](std::span<const std::byte> bucket, std::size_t /*rank*/) {
      bucket_at_.push_back(gathered_.size());
      gathered_.insert(gathered_.end(), bucket.begin(), bucket.end());
    };
    const std::uint64_t longest = gather_frames(*this, who, settings, frame_bound_, max_bytes, stage, keep);
    frame_bound_ = next_frame_bound(longest, max_bytes);
    bucket_at_.push_back(gathered_.size());
    // Split every rank's bucket and check all of it before any accumulation.
    parts_.clear();
    for (int r = 0; r < size_; ++r) {
      const auto b = std::span<const std::byte>(gathered_).subspan(
          bucket_at_[static_cast<std::size_t>(r)],
          bucket_at_[static_cast<std::size_t>(r) + 1] - bucket_at_[static_cast<std::size_t>(r)]);
      detail::require(b.size() >= 8 && detail::load_le<std::uint64_t>(b.data()) == messages.size() &&
                          b.size() >= 8 * (1 + messages.size()),
                      errc::corrupt_message, "allgather_accumulate: rank ", r, "'s bucket does not hold ",
                      messages.size(), " tensors");
      std::uint64_t at = 8 * (1 + messages.size());
      for (std::size_t t = 0; t < messages.size(); ++t) {
        const auto len = detail::load_le<std::uint64_t>(b.data() + 8 * (1 + t));
        detail::require(len <= b.size() - at, errc::corrupt_message, "allgather_accumulate: rank ", r,
                        "'s bucket is shorter than its directory says");
        parts_.push_back(b.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(len)));
        at += len;
      }
      detail::require(at == b.size(), errc::corrupt_message, "allgather_accumulate: rank ", r,
                      "'s bucket has trailing bytes");
    }
    for (std::size_t p = 0; p < parts_.size(); ++p) check(parts_[p], dense[p % messages.size()].size());
    for (std::size_t p = 0; p < parts_.size(); ++p) {
      const std::span<float> d = dense[p % messages.size()];
      detail::message_reader(parts_[p]).visit([&](std::uint32_t index, float value) { d[index] += scale * value; });
    }
  }

  /// \name Collectives that comm::cyclic_topk and the agreement build on (host memory)
  /// @{

  /// Every rank's `mine` (the same size on every rank) into `all`, in rank order.
  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
    MPI_Allgather(mine.data(), mpi_count(mine.size()), MPI_BYTE, all.data(), mpi_count(mine.size()), MPI_BYTE, comm_);
  }
  /// Rank `root`'s `data` into every rank's `data` (the same size everywhere).
  void broadcast(std::span<std::uint32_t> data, int root) {
    MPI_Bcast(data.data(), mpi_count(data.size()), MPI_UINT32_T, root, comm_);
  }
  /// Every rank's `mine` (sizes[r] bytes from rank r, as every rank knows them) into
  /// `all`, in rank order.
  void all_gather_v(std::span<const std::byte> mine, std::span<const std::uint64_t> sizes, std::span<std::byte> all) {
    displace(sizes, counts_, displs_);
    MPI_Allgatherv(mine.data(), mpi_count(mine.size()), MPI_BYTE, all.data(), counts_.data(), displs_.data(), MPI_BYTE,
                   comm_);
  }
  /// The parts of `send` (send_sizes[j] bytes for rank j, in rank order) to their ranks;
  /// rank r's part for this rank (recv_sizes[r] bytes) into `recv`, in rank order.
  void all_to_all_v(std::span<const std::byte> send, std::span<const std::uint64_t> send_sizes,
                    std::span<std::byte> recv, std::span<const std::uint64_t> recv_sizes) {
    displace(send_sizes, send_counts_, send_displs_);
    displace(recv_sizes, counts_, displs_);
    MPI_Alltoallv(send.data(), send_counts_.data(), send_displs_.data(), MPI_BYTE, recv.data(), counts_.data(),
                  displs_.data(), MPI_BYTE, comm_);
  }
  /// `values` becomes the sum over ranks (integers: exact, whatever the order). No sum
  /// exceeds `max_sum` (< 2^32), which lets a transport sum in a narrower type; MPI sums
  /// uint32 whatever it is.
  void all_reduce_sum(std::span<std::uint32_t> values, std::uint64_t /*max_sum*/) {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), mpi_count(values.size()), MPI_UINT32_T, MPI_SUM, comm_);
  }
  /// `values` becomes the sum over ranks, the same bits on every rank: summed at
  /// `root`, then broadcast.
  void reduce_broadcast(std::span<float> values, int root) {
    const int count = mpi_count(values.size());
    const bool at_root = rank_ == root;
    MPI_Reduce(at_root ? MPI_IN_PLACE : values.data(), at_root ? values.data() : nullptr, count, MPI_FLOAT, MPI_SUM,
               root, comm_);
    MPI_Bcast(values.data(), count, MPI_FLOAT, root, comm_);
  }
  /// @}

 private:
  static constexpr const char* who = "allgather_accumulate";
  // The most bytes one MPI call moves: the bound of a rank's bucket.
  static constexpr std::uint64_t max_bytes = INT32_MAX;

  static int mpi_count(std::size_t count) {
    detail::require(count <= static_cast<std::size_t>(INT32_MAX), errc::invalid_argument, "comm::mpi: ", count,
                    " elements exceed what one MPI call moves");
    return static_cast<int>(count);
  }

  // MPI's counts and displacements of parts of `sizes` bytes laid end to end.
  static void displace(std::span<const std::uint64_t> sizes, std::vector<int>& counts, std::vector<int>& displs) {
    detail::require(detail::total_size(sizes) <= static_cast<std::uint64_t>(INT32_MAX), errc::invalid_argument,
                    "comm::mpi: ", detail::total_size(sizes), " bytes exceed what one MPI call moves");
    counts.resize(sizes.size());
    displs.resize(sizes.size());
    int at = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      counts[r] = static_cast<int>(sizes[r]);
      displs[r] = at;
      at += counts[r];
    }
  }

  void gather(std::span<const std::byte> mine, std::uint64_t total) {
    detail::require(total <= static_cast<std::uint64_t>(INT32_MAX), errc::invalid_argument,
                    "allgather_accumulate: ", total, " bytes of messages exceed what one MPI_Allgatherv moves");
    if (gathered_.size() < total) gathered_.resize(static_cast<std::size_t>(total));
    all_gather_v(mine, sizes_, gathered_);
  }

  void sparse_path(std::span<const std::byte> message, std::span<float> dense, float scale, std::uint64_t total) {
    gather(message, total);
    // Validate all, then apply all: no rank writes unless every message is sound.
    for (int r = 0; r < size_; ++r) check(received(r), dense.size());
    for (int r = 0; r < size_; ++r) {
      const detail::message_reader reader(received(r));
      reader.visit([&](std::uint32_t index, float value) { dense[index] += scale * value; });
    }
  }

  void dense_path(std::span<const std::byte> message, std::span<float> dense, float scale) {
    (void)detail::agree(*this, who, {}, [&] {
      check(message, dense.size());
      return 0;
    });
    mine_.assign(dense.size(), 0.0f);
    detail::message_reader(message).visit([&](std::uint32_t index, float value) { mine_[index] = value; });
    reduce_broadcast(mine_, 0);
    for (std::size_t i = 0; i < dense.size(); ++i) dense[i] += scale * mine_[i];
  }

  std::span<const std::byte> received(int r) const noexcept {
    return std::span<const std::byte>(gathered_).subspan(
        static_cast<std::size_t>(displs_[static_cast<std::size_t>(r)]),
        static_cast<std::size_t>(counts_[static_cast<std::size_t>(r)]));
  }

  static void check(std::span<const std::byte> bytes, std::size_t n) {
    const detail::message_reader reader(bytes);
    detail::require(reader.header().n == n, errc::invalid_argument, "allgather_accumulate: dense.size() = ", n,
                    " does not match a message's n = ", reader.header().n);
    reader.validate_entries();
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::uint64_t> sizes_;
  std::vector<int> counts_, displs_, send_counts_, send_displs_;
  std::vector<std::byte> gathered_, bucket_;
  std::vector<std::size_t> bucket_at_;  // where each rank's bucket starts in gathered_ (bucketed path)
  std::size_t frame_bound_ = 0;         // the bucket bytes the next bucketed exchange's frames hold
  std::vector<std::span<const std::byte>> parts_;
  std::vector<float> mine_;
};

static_assert(transport<mpi>);

}  // namespace comm
GRADCOMP_NAMESPACE_END
