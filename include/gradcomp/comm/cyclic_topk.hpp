/// \file comm/cyclic_topk.hpp
/// ScaleCom's cyclic local top-k (Chen et al., NeurIPS 2020) over any transport that
/// offers the collectives it calls: comm::mpi with host compressors, comm::nccl with
/// backend::cuda compressors (comm/mpi.hpp and comm/nccl.cuh include it), and the torch
/// binding's adapter of a c10d process group with either.
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/comm/exchange_memory.hpp>
#include <gradcomp/comm/transport.hpp>
#include <gradcomp/detail/core/density.hpp>
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
namespace comm {

/// ScaleCom's cyclic local top-k. At step t the leader is rank t mod W: it selects
/// indices with `leader_selector` from its own acc (compressor::preview: the
/// corrector's update of its committed state, nothing committed) and broadcasts them;
/// every rank compresses its own acc at those indices (a given_indices compressor,
/// usually presets::scalecom); the k values are summed (reduced to the leader, then
/// broadcast, so every rank holds the same bits) and `dense[i] += scale * sum_i`.
/// Every rank commits the same index set, and each moves O(k) values whatever the
/// number of ranks.
///
/// Before any rank compresses, every rank previews its step and the ranks agree, in
/// their first exchange, on their configuration and that every step will be accepted:
/// a NaN or infinity or a bad argument on any rank, or ranks configured differently,
/// make every rank throw the same error and leave every rank's compressor as it was.
///
/// `Comm` is the transport (comm/transport.hpp) in the compressor's memory: comm::mpi
/// (host memory: backend::host compressors), comm::nccl (device memory: backend::cuda
/// compressors) or the PyTorch binding's adapter. Each rank's `grad`, `dense` and the
/// messages are in that memory, and their views say so (std::span, device_span).
template <class LeaderSelector, class Compressor, transport Comm>
class cyclic_topk {
  static_assert(std::is_same_v<typename Comm::memory, typename Compressor::backend_type::memory>,
                "cyclic_topk: the transport moves another memory than the compressor's");
  using backend_type = typename Compressor::backend_type;
  using leader_type = compressor<backend_type, LeaderSelector, correct::none, encode::index_value>;
  template <class T>
  using buffer = typename backend_type::template buffer<T>;

 public:
  /// A view of the compressor's memory (std::span or device_span).
  template <class T>
  using view = typename Compressor::template view<T>;
  /// The compressor's messages (message or device_message).
  using message_type = typename Compressor::message_type;

  /// \throws gradcomp::error if `leader_selector` is invalid for the compressor's n or
  ///         may select more indices than the compressor's selector takes.
  cyclic_topk(Comm& comm, Compressor& compressor, LeaderSelector leader_selector)
      : comm_(comm),
        compressor_(compressor),
        leader_(compressor.backend(), compressor.size(), leader_selector, correct::none{},
                encode::index_value{.index = index_coding::raw32, .value = value_coding::f32}),
        memory_(compressor.backend()),
        leader_message_(allocate<std::byte>(leader_.max_message_bytes())),
        index_(allocate<std::uint32_t>(leader_selector.max_selected(compressor.size()))),
        sums_(allocate<float>(leader_selector.max_selected(compressor.size()))),
        message_(allocate<std::byte>(compressor.max_message_bytes())),
        policies_(detail::fingerprint()
                      .add(compressor.selector().name())
                      .add(compressor.corrector().name())
                      .add(compressor.encoder().name())
                      .add(leader_selector.name())
                      .value()) {
    const std::size_t n = compressor.size();
    const std::size_t k = leader_selector.max_selected(n);
    const std::size_t takes = compressor.selector().max_selected(n);
    detail::require(k <= takes, errc::invalid_argument, "cyclic_topk: the leader's selector may choose ", k,
                    " indices, more than the compressor's selector takes (", takes, ")");
  }

  /// One step with this rank's gradient: adds `scale` times the ranks' sum to `dense`.
  /// The ranks first agree, in one exchange, on n, k, the step, the policies and
  /// that every rank's arguments and step are accepted; then the leader's indices are
  /// broadcast, and the values reduced.
  /// \returns this rank's message (its values at the shared indices), valid until the
  ///          next step
  /// \throws gradcomp::error on every rank alike, changing no compressor and no
  ///         `dense`, if any rank's dense.size() != n, `scale` is not finite or its step
  ///         would be rejected (a NaN or infinity), or if the ranks disagree on n, k, the
  ///         step or the policies.
  message_type step(view<const float> grad, view<float> dense, float scale) {
    const message_type m = stage(grad, dense, scale);
    accept_staged();
    return m;
  }

  /// step() but the commit: the compressor's step stays staged until accept_staged()
  /// (or drop_staged()), so that a DDP hook can commit all of a step's buckets together,
  /// once every one of them has succeeded on every rank. `dense` is written. The leader
  /// of the next step is chosen by the compressor's step, which a dropped step leaves.
  /// \throws gradcomp::error as step() does; nothing is staged then.
  message_type stage(view<const float> grad, view<float> dense, float scale) {
    try {
      return run(grad, dense, scale);
    } catch (...) {
      compressor_.drop_staged();
      throw;
    }
  }
  /// Commits the compressor's staged step.
  /// \throws gradcomp::error (invalid_argument) if no step is staged.
  void accept_staged() { compressor_.accept_staged(); }
  /// Drops the compressor's staged step.
  void drop_staged() noexcept { compressor_.drop_staged(); }

  /// Bytes the exchange holds beside its compressor's (the leader's compressor, the
  /// messages, the selection and its sums): all workspace.
  [[nodiscard]] std::size_t memory_bytes() const {
    return leader_.memory_bytes().total() + memory_.held_bytes() +
           detail::bytes_held(leader_message_, index_, sums_, message_);
  }

 private:
  // The exchange of step() with the compressor's step staged.
  message_type run(view<const float> grad, view<float> dense, float scale) {
    follow_density();
    const int leader = static_cast<int>(compressor_.step() % static_cast<std::uint64_t>(comm_.size()));
    const std::uint64_t k = leader_.selector().max_selected(compressor_.size());
    const std::vector<std::uint64_t> counts = detail::agree(
        comm_, "cyclic_topk",
        {{"n", compressor_.size()}, {"k", k}, {"the step", compressor_.step()}, {"the policies", policies_}},
        [&]() -> std::uint64_t {
          detail::require(dense.size() == compressor_.size(), errc::invalid_argument,
                          "cyclic_topk: dense.size() = ", dense.size(), " does not match n = ", compressor_.size());
          detail::require(std::isfinite(scale), errc::invalid_argument, "cyclic_topk: scale must be finite, got ",
                          scale);
          const view<const float> acc = compressor_.preview(grad);  // throws where the step would be rejected
          if (comm_.rank() != leader) return 0;
          const auto chosen = leader_.compress(acc, view_of(leader_message_));
          memory_.indices_of(detail::raw(chosen.bytes()), std::span<std::uint32_t>(index_.data(), chosen.count()));
          return chosen.count();
        });
    // The ranks agreed on k, and the leader chose at most k: a count above it is a
    // broken peer's, refused on every rank alike (each reads the same count).
    const std::uint64_t count = counts[static_cast<std::size_t>(leader)];
    detail::require(count <= k, errc::corrupt_message, "cyclic_topk: the leader (rank ", leader, ") reported ", count,
                    " indices, more than k = ", k);
    const std::span<std::uint32_t> index(index_.data(), static_cast<std::size_t>(count));
    comm_.broadcast(view<std::uint32_t>(index.data(), index.size()), leader);
    // The leader's selector chose them (ascending, below n, no more than the
    // compressor takes), so this does not throw, and every rank's step is accepted.
    compressor_.set_indices(memory_.on_host(index));
    const message_type m = compressor_.stage(grad, view_of(message_));
    const std::span<float> sums(sums_.data(), index.size());
    memory_.values_of(detail::raw(m.bytes()), m.size(), sums);
    comm_.reduce_broadcast(view<float>(sums.data(), sums.size()), leader);
    memory_.add(index, sums, detail::raw(dense), scale);
    return m;
  }

  // Where the compressor's selector has a density (presets::scalecom's given_indices),
  // the leader selects at it: compressor::set_density (a warm-up schedule, a restored
  // checkpoint) moves the leader's k with the compressor's capacity, and the buffers
  // grow with them.
  void follow_density() {
    if constexpr (requires {
                    compressor_.selector().density;
                    leader_.set_density(1.0);
                  }) {
      const double density = compressor_.selector().density;
      if (density == 0.0 || density == leader_.selector().density) return;
      const std::size_t n = compressor_.size();
      const std::size_t k = detail::with_density(leader_.selector(), density).max_selected(n);
      // Allocated first: should that throw, nothing has changed.
      auto index = allocate<std::uint32_t>(std::max<std::size_t>(k, static_cast<std::size_t>(index_.size())));
      auto sums = allocate<float>(std::max<std::size_t>(k, static_cast<std::size_t>(sums_.size())));
      auto leader_message = allocate<std::byte>(leader_.encoder().max_bytes(n, k));
      auto message = allocate<std::byte>(compressor_.max_message_bytes());
      leader_.set_density(density);  // valid: the compressor took it
      index_ = std::move(index);
      sums_ = std::move(sums);
      leader_message_ = std::move(leader_message);
      message_ = std::move(message);
    }
  }

  template <class T>
  buffer<T> allocate(std::size_t count) const {
    return compressor_.backend().template allocate<T>(count);
  }
  // A message buffer (in the memory of the compressor's backend, which for the transports
  // here is where its messages live too) as the view compress() writes to.
  static typename Compressor::message_bytes view_of(buffer<std::byte>& b) noexcept {
    return {b.data(), static_cast<std::size_t>(b.size())};
  }

  Comm& comm_;
  Compressor& compressor_;
  leader_type leader_;
  detail::exchange_memory<backend_type> memory_;
  buffer<std::byte> leader_message_;
  buffer<std::uint32_t> index_;
  buffer<float> sums_;
  buffer<std::byte> message_;
  std::uint64_t policies_;  // the policies' names, which every rank must share
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
