/// \file comm/mpi.hpp
/// Moving compressed messages between the ranks of an MPI communicator (needs MPI;
/// CMake: gradcomp::mpi).
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/comm/path.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/aggregation_args.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

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
    detail::check_aggregation_args(1, 1, scale);
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

  /// Bucketed sparse all-gather for many tensors (a model's layers) in one exchange:
  /// `messages[t]` is this rank's message for tensor t and `dense[t]` its aggregate, for
  /// every t; then `dense[t] += scale * sum over ranks of decode(message of rank r for
  /// tensor t)`, ranks in order. One size exchange and one MPI_Allgatherv carry all the
  /// tensors, whatever their number. Every message of every rank is validated first.
  void allgather_accumulate(std::span<const std::span<const std::byte>> messages, std::span<const std::span<float>> dense,
                            float scale) {
    detail::check_aggregation_args(messages.size(), dense.size(), scale);
    // This rank's bucket: u64 tensor count, u64 size of each message, the messages.
    bucket_.assign(8 * (1 + messages.size()), std::byte{0});
    detail::store_le<std::uint64_t>(bucket_.data(), messages.size());
    for (std::size_t t = 0; t < messages.size(); ++t) {
      detail::store_le<std::uint64_t>(bucket_.data() + 8 * (1 + t), messages[t].size());
      bucket_.insert(bucket_.end(), messages[t].begin(), messages[t].end());
    }
    const auto mine = static_cast<std::uint64_t>(bucket_.size());
    sizes_.resize(static_cast<std::size_t>(size_));
    MPI_Allgather(&mine, 1, MPI_UINT64_T, sizes_.data(), 1, MPI_UINT64_T, comm_);
    std::uint64_t total = 0;
    for (const auto s : sizes_) total += s;
    gather(bucket_, total);
    // Split every rank's bucket and check all of it before any accumulation.
    parts_.clear();
    for (int r = 0; r < size_; ++r) {
      const auto b = received(r);
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

 private:
  void gather(std::span<const std::byte> mine, std::uint64_t total) {
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
    MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, gathered_.data(), counts_.data(),
                   displs_.data(), MPI_BYTE, comm_);
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
  std::vector<std::byte> gathered_, bucket_;
  std::vector<std::span<const std::byte>> parts_;
  std::vector<float> mine_, sum_;
};

/// ScaleCom's cyclic local top-k (Chen et al., NeurIPS 2020) on host compressors: at
/// step t the leader is rank t mod W. It previews its own acc (the corrector's update on
/// its committed state, nothing committed), picks indices with `leader_selector`, and
/// broadcasts them; every rank compresses its own acc at those indices (a given_indices
/// compressor, usually presets::scalecom); the k values are summed (reduce to the
/// leader, broadcast) and `dense[i] += scale * sum`. Every rank commits the same index
/// set, and each moves O(k) values whatever the number of ranks. If any rank's step is
/// rejected, every rank throws. (A rejected step elsewhere leaves this rank's
/// compressor one step ahead: restore a checkpoint on all ranks to resume in step.)
template <class LeaderSelector, class Compressor>
class cyclic_topk {
 public:
  cyclic_topk(mpi& comm, Compressor& compressor, LeaderSelector leader_selector)
      : comm_(comm),
        compressor_(compressor),
        policy_(leader_selector),
        leader_(backend::host{}, leader_selector, compressor.size()),
        acc_(compressor.size()),
        index_(leader_selector.max_selected(compressor.size())),
        message_(compressor.max_message_bytes()) {
    leader_selector.validate(compressor.size());
  }

  /// One step with this rank's gradient. Returns this rank's message (its values at the
  /// shared indices), valid until the next step.
  message step(std::span<const float> grad, std::span<float> dense, float scale) {
    detail::require(dense.size() == compressor_.size(), errc::invalid_argument, "cyclic_topk: dense.size() = ",
                    dense.size(), " does not match n = ", compressor_.size());
    const int leader = static_cast<int>(compressor_.step() % static_cast<std::uint64_t>(comm_.size()));
    std::uint64_t count = 0;
    if (comm_.rank() == leader) {
      preview(grad);
      count = leader_.select(policy_, {acc_, grad, compressor_.step()}, index_).count;
    }
    MPI_Bcast(&count, 1, MPI_UINT64_T, leader, comm_.communicator());
    MPI_Bcast(index_.data(), static_cast<int>(count), MPI_UINT32_T, leader, comm_.communicator());
    compressor_.set_indices(std::span<const std::uint32_t>(index_.data(), static_cast<std::size_t>(count)));
    if (message_.size() < compressor_.max_message_bytes()) message_.resize(compressor_.max_message_bytes());
    // A rank whose step is rejected (a NaN, say) must not leave the others waiting in
    // the reduction: agree first, then every rank throws or none does.
    message m;
    int ok = 1;
    try {
      m = compressor_.compress(grad, message_);
    } catch (const error&) {
      ok = 0;
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_.communicator());
    if (!ok) (void)compressor_.compress(grad, message_);  // rethrows this rank's own reason, unchanged state
    detail::require(all_ok == 1, errc::non_finite, "cyclic_topk: another rank rejected its gradient this step");
    values_.clear();
    detail::message_reader(m.bytes()).visit([&](std::uint32_t, float v) { values_.push_back(v); });
    sum_.resize(values_.size());
    MPI_Reduce(values_.data(), sum_.data(), static_cast<int>(values_.size()), MPI_FLOAT, MPI_SUM, leader,
               comm_.communicator());
    MPI_Bcast(sum_.data(), static_cast<int>(sum_.size()), MPI_FLOAT, leader, comm_.communicator());
    for (std::size_t j = 0; j < sum_.size(); ++j) dense[index_[j]] += scale * sum_[j];
    return m;
  }

 private:
  // acc as the corrector's update would make it from the committed state.
  void preview(std::span<const float> grad) {
    const auto& corrector = compressor_.corrector();
    using corrector_type = std::remove_cvref_t<decltype(corrector)>;
    constexpr std::size_t arrays = corrector_type::state_arrays;
    for (std::size_t i = 0; i < acc_.size(); ++i) {
      float s[arrays + 1];
      for (std::size_t a = 0; a < arrays; ++a) s[a] = compressor_.corrector_state(a)[i];
      acc_[i] = corrector.update(s, grad[i]);
    }
  }

  mpi& comm_;
  Compressor& compressor_;
  LeaderSelector policy_;
  detail::engine<LeaderSelector, backend::host> leader_;
  std::vector<float> acc_;
  std::vector<std::uint32_t> index_;
  std::vector<std::byte> message_;
  std::vector<float> values_, sum_;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
