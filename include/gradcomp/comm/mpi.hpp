/// \file comm/mpi.hpp
/// Moving compressed messages between the ranks of an MPI communicator (needs MPI;
/// CMake: gradcomp::mpi).
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

/// How a collective moved the data.
enum class path {
  sparse,  ///< every message to every rank (all-gather), decoded and accumulated locally
  dense,   ///< each rank's message decoded, dense tensors summed (reduce + broadcast)
};

/// The aggregation collectives over one MPI communicator. Receive buffers grow to the
/// largest exchange seen and are reused, so steady-state steps allocate nothing.
class mpi {
 public:
  /// \throws gradcomp::error if the communicator is MPI_COMM_NULL.
  explicit mpi(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    detail::require(comm != MPI_COMM_NULL, errc::invalid_argument, "comm::mpi: the communicator is MPI_COMM_NULL");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] MPI_Comm communicator() const noexcept { return comm_; }

  /// Sparse all-gather: `dense += scale * sum over ranks of decode(message of rank r)`,
  /// ranks in order, identically on every rank. Messages may differ in size and count
  /// (zero entries, per-rank densities). When all messages together would be larger
  /// than the dense tensor, each rank decodes its own and the dense tensors are summed
  /// instead (reduce to rank 0, broadcast), which every rank also ends with identically.
  /// Every rank validates every message before touching `dense`; a corrupt message
  /// raises gradcomp::error on all ranks alike and leaves `dense` unchanged.
  /// \returns the path taken, the same on every rank
  path allgather_accumulate(std::span<const std::byte> message, std::span<float> dense, float scale) {
    detail::require(std::isfinite(scale), errc::invalid_argument, "allgather_accumulate: scale must be finite, got ",
                    scale);
    const auto mine = static_cast<std::uint64_t>(message.size());
    sizes_.resize(static_cast<std::size_t>(size_));
    MPI_Allgather(&mine, 1, MPI_UINT64_T, sizes_.data(), 1, MPI_UINT64_T, comm_);
    std::uint64_t total = 0;
    for (const auto s : sizes_) total += s;
    if (total > static_cast<std::uint64_t>(dense.size()) * sizeof(float)) {
      dense_path(message, dense, scale);
      return path::dense;
    }
    sparse_path(message, dense, scale, total);
    return path::sparse;
  }

 private:
  void sparse_path(std::span<const std::byte> message, std::span<float> dense, float scale, std::uint64_t total) {
    detail::require(total <= static_cast<std::uint64_t>(INT32_MAX), errc::invalid_argument,
                    "allgather_accumulate: ", total, " bytes of messages exceed what one MPI_Allgatherv moves");
    counts_.resize(static_cast<std::size_t>(size_));
    displs_.resize(static_cast<std::size_t>(size_));
    int at = 0;
    for (int r = 0; r < size_; ++r) {
      counts_[static_cast<std::size_t>(r)] = static_cast<int>(sizes_[static_cast<std::size_t>(r)]);
      displs_[static_cast<std::size_t>(r)] = at;
      at += counts_[static_cast<std::size_t>(r)];
    }
    if (gathered_.size() < total) gathered_.resize(static_cast<std::size_t>(total));
    MPI_Allgatherv(message.data(), static_cast<int>(message.size()), MPI_BYTE, gathered_.data(), counts_.data(),
                   displs_.data(), MPI_BYTE, comm_);
    // Validate all, then apply all: no rank writes unless every message is sound.
    for (int r = 0; r < size_; ++r) check(received(r), dense.size());
    for (int r = 0; r < size_; ++r) {
      const detail::message_reader reader(received(r));
      reader.visit([&](std::uint32_t index, float value) { dense[index] += scale * value; });
    }
  }

  void dense_path(std::span<const std::byte> message, std::span<float> dense, float scale) {
    // A rank with a bad message must not leave the others waiting in the reduction:
    // agree on validity first.
    int ok = 1;
    try {
      check(message, dense.size());
    } catch (const error&) {
      ok = 0;
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_);
    if (!ok) check(message, dense.size());  // rethrows this rank's own reason
    detail::require(all_ok == 1, errc::corrupt_message, "allgather_accumulate: another rank's message is corrupt");
    mine_.assign(dense.size(), 0.0f);
    detail::message_reader(message).visit([&](std::uint32_t index, float value) { mine_[index] = value; });
    sum_.resize(dense.size());
    MPI_Reduce(mine_.data(), sum_.data(), static_cast<int>(dense.size()), MPI_FLOAT, MPI_SUM, 0, comm_);
    MPI_Bcast(sum_.data(), static_cast<int>(dense.size()), MPI_FLOAT, 0, comm_);
    for (std::size_t i = 0; i < dense.size(); ++i) dense[i] += scale * sum_[i];
  }

  std::span<const std::byte> received(int r) const noexcept {
    return std::span<const std::byte>(gathered_).subspan(static_cast<std::size_t>(displs_[static_cast<std::size_t>(r)]),
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
  std::vector<int> counts_, displs_;
  std::vector<std::byte> gathered_;
  std::vector<float> mine_, sum_;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
