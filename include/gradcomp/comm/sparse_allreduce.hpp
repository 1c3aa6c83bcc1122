/// \file comm/sparse_allreduce.hpp
/// A global top-k sparse all-reduce (Ok-Topk: Li and Hoefler, PPoPP 2022) over any
/// transport with the collectives below (comm::mpi with host compressors, comm::nccl
/// with backend::cuda ones). What a rank receives stays about 2k entries whatever the
/// number of ranks. Include it through comm/mpi.hpp or comm/nccl.cuh.
#pragma once

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/comm/transport.hpp>
#include <gradcomp/compressor.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/density.hpp>
#include <gradcomp/detail/comm/shard_sums.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/step/state_io.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

/// One entry of a sparse sum on the wire: an index and its float32 value, in the
/// native byte order of the ranks (one job runs on one kind of machine).
struct sparse_entry {
  std::uint32_t index;  ///< the element
  float value;          ///< its value (a rank's, or the ranks' sum)
};
static_assert(sizeof(sparse_entry) == 8);

/// Ok-Topk's sparse all-reduce of the ranks' compressed gradients, as
/// docs/algorithms.md ("Global top-k") defines it:
/// 1. every rank stages its step with its compressor (its selector and corrector) and
///    the ranks agree, in their first exchange, that every step is accepted and that
///    they are configured alike;
/// 2. the index space is cut into one region per rank (equal at first, then balanced by
///    the previous step's global selection, which every rank holds); each rank sends
///    region j's entries to rank j, which sums each index's values in rank order;
/// 3. the exact global top-k of the sums' magnitudes, ties to the lower index, is found
///    by a radix select whose digit histograms are all-reduced (integer counts: exact);
///    each rank contributes its region's selected (index, sum) to an all-gather;
/// 4. every rank adds `scale` times the k sums to `dense` (the same bits everywhere),
///    and commits of its own step only the entries the global selection kept
///    (compressor::accept_staged(kept)): what it sent and the selection dropped stays
///    in its memory, so no gradient mass is lost.
///
/// `Comm` is the transport (comm/transport.hpp) in the compressor's memory. step()'s
/// local work (splitting, summing, selecting) runs on the host whatever that memory,
/// over the transport's collectives of host arrays: only the message and the k sums
/// cross to and from a device. reduce_scatter()'s runs where the compressor's memory is
/// (detail/comm/shard_sums.hpp), and its entries travel there (the transport's
/// all_to_all_v of that memory): what crosses to the host is the W + 1 shard starts
/// with the step's verdict (the counts every rank learns) and two fault words. `grad`,
/// `dense` and `shard` are in the compressor's memory (std::span, device_span).
template <class Compressor, transport Comm>
class sparse_allreduce {
  static_assert(std::is_same_v<typename Comm::memory, typename Compressor::backend_type::memory>,
                "sparse_allreduce: the transport moves another memory than the compressor's");
  using backend_type = typename Compressor::backend_type;
  template <class T>
  using buffer = typename backend_type::template buffer<T>;

 public:
  /// A view of the compressor's memory (std::span or device_span).
  template <class T>
  using view = typename Compressor::template view<T>;

  /// \param comm the transport, which the exchange uses until it is destroyed
  /// \param compressor this rank's compressor, staged and committed by each step
  /// \param k entries of the global selection; 0 takes the compressor's own: its
  ///          selector's density's count (followed when set_density changes it), or
  ///          max_selected(n) for a selector without a density
  /// \throws gradcomp::error if k > n
  sparse_allreduce(Comm& comm, Compressor& compressor, std::size_t k = 0)
      : comm_(comm),
        compressor_(compressor),
        k_(k),
        message_(compressor.backend().template allocate<std::byte>(compressor.max_message_bytes())),
        policies_(detail::fingerprint()
                      .add(compressor.selector().name())
                      .add(compressor.corrector().name())
                      .add(compressor.encoder().name())
                      .value()) {
    detail::require(k <= compressor.size(), errc::invalid_argument, "sparse_allreduce: k = ", k,
                    " exceeds the compressor's n = ", compressor.size());
    const auto ranks = static_cast<std::uint64_t>(comm.size());
    for (std::uint64_t j = 0; j <= ranks; ++j) {
      bounds_.push_back(static_cast<std::uint32_t>(j * compressor.size() / ranks));
    }
  }

  /// One step with this rank's gradient: `dense[i] += scale * s_i` for the k indices i
  /// of largest |s_i|, s being the sum over ranks of what their compressors sent.
  /// `grad` is any gradient the compressor takes (gradient_view: float32, IEEE half or
  /// bfloat16, read as compressor::compress reads it).
  /// \returns the global selection, ascending (every rank's is the same), valid until
  ///          the next step or release_workspace()
  /// \throws gradcomp::error on every rank alike, changing no compressor and no `dense`,
  ///         if any rank's dense.size() != n, `scale` is not finite, its step is
  ///         rejected (a NaN or infinity) or what it received is corrupt, if a sum
  ///         overflows, or if the ranks disagree on n, k, the policies or the regions.
  template <gradient_view<backend_type> Grad>
  std::span<const std::uint32_t> step(const Grad& grad, view<float> dense, float scale) {
    const auto selected = stage(grad, dense, scale);
    accept_staged();
    return selected;
  }

  /// step() but the commit: the compressor's step stays staged until accept_staged()
  /// (or drop_staged()), so that a DDP hook can commit all of a step's buckets together,
  /// once every one of them has succeeded on every rank. `dense` is written.
  /// \throws gradcomp::error as step() does; nothing is staged then.
  template <gradient_view<backend_type> Grad>
  std::span<const std::uint32_t> stage(const Grad& grad, view<float> dense, float scale) {
    try {
      return run(grad, dense, scale);
    } catch (...) {
      compressor_.drop_staged();
      throw;
    }
  }
  /// Commits of the compressor's staged step what the global selection kept.
  /// \throws gradcomp::error (invalid_argument) if no step is staged.
  void accept_staged() { compressor_.accept_staged(global_index_); }
  /// Drops the compressor's staged step.
  void drop_staged() noexcept { compressor_.drop_staged(); }

  /// A sparse reduce-scatter (FSDP's, gradcomp.torch.fsdp): the n indices are cut into W
  /// equal shards (n a multiple of W), rank j owning [j·n/W, (j+1)·n/W); each rank sends
  /// each shard's entries of its step to the shard's owner (steps 1-3 above), which
  /// writes `shard[i - j·n/W] = scale * s_i` for the sums of its shard and 0 elsewhere.
  /// There is no global selection: every rank commits its whole step. On a device
  /// backend the shard's write and the commit are queued on the compressor's stream
  /// (its backend's) when this returns: work on another stream waits for it.
  /// \throws gradcomp::error on every rank alike, changing no compressor and no shard, if
  ///         n is not a multiple of W or shard.size() != n / W on any rank, `scale` is not
  ///         finite, a step is rejected, what a rank received is corrupt, a sum overflows,
  ///         a rank cannot allocate its workspace, or the ranks disagree on n or the
  ///         policies.
  template <gradient_view<backend_type> Grad>
  void reduce_scatter(const Grad& grad, view<float> shard, float scale) {
    namespace sums = detail::shard_sums;
    const std::size_t n = compressor_.size();
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    const std::size_t shard_n = n / ranks;
    const auto begin = static_cast<std::uint32_t>(me * n / ranks);
    const auto end = static_cast<std::uint32_t>((me + 1) * n / ranks);
    const backend_type& be = compressor_.backend();
    try {
      // Step 1: this rank stages its step, and finds where each shard's entries start in
      // its selection (one read back, with the step's verdict on its values); the ranks
      // agree, and learn each other's counts for each shard in the same all-gather (so
      // that each knows what every rank receives) and their room for what they receive
      // (their own value).
      traffic_ = {};
      send_counts_.assign(ranks, 0);
      counts_of_all_.resize(ranks * ranks);
      const std::vector<std::uint64_t> room = detail::agree(
          comm_, who, {{"n", n}, {"the policies", policies_}},
          [&]() -> std::uint64_t {
            detail::require(n % ranks == 0, errc::invalid_argument, who, ": reduce_scatter needs n = ", n,
                            " to be a multiple of the ranks, ", ranks);
            detail::require(shard.size() == n / ranks, errc::invalid_argument, who, ": shard.size() = ", shard.size(),
                            " does not match n / ranks = ", n / ranks);
            detail::require(std::isfinite(scale), errc::invalid_argument, who, ": scale must be finite, got ", scale);
            // The workspace allocated here, where a failure is every rank's error.
            grow(starts_, ranks + 2);
            grow(shard_sums_, shard_n);
            grow(fault_, 2);
            const auto out = message_out();
            const detail::step_status* status = compressor_.stage_queued(be, grad, out);
            const auto sent = compressor_.staged_selection();
            be.for_each(ranks + 2,
                        sums::shard_starts{detail::raw(sent.index).data(), status, n, ranks, starts_.data()});
            first_.resize(ranks + 2);
            be.to_host(starts_.data(), ranks + 2, first_.data());
            if (first_[ranks + 1] != 0) {  // a value was not finite: its error, read now (the step is dropped)
              (void)compressor_.staged_message(be, grad, out);
              detail::fail(errc::invalid_argument, who, ": a step's status said a value was not finite; it is not");
            }
            for (std::size_t j = 0; j < ranks; ++j) send_counts_[j] = first_[j + 1] - first_[j];
            grow_roomy(packed_, static_cast<std::size_t>(first_[ranks]));
            return static_cast<std::uint64_t>(received_on_.size());
          },
          std::as_writable_bytes(std::span(send_counts_)), std::as_writable_bytes(std::span(counts_of_all_)));
      note(detail::rank_verdict::size + 8 * ranks, (ranks - 1) * (detail::rank_verdict::size + 8 * ranks));
      const auto count = static_cast<std::size_t>(first_[ranks]);
      const auto sent = compressor_.staged_selection();
      traffic_.entries = count;
      recv_counts_.resize(ranks);
      for (std::size_t r = 0; r < ranks; ++r) recv_counts_[r] = counts_of_all_[r * ranks + me];
      const std::size_t received = make_room(room);

      // The entries packed where the compressor's memory is and exchanged there.
      be.for_each(count, sums::pack<sparse_entry>{detail::raw(sent.index).data(), detail::raw(sent.values).data(),
                                                  packed_.data()});
      bytes_of(send_counts_, send_sizes_);
      bytes_of(recv_counts_, recv_sizes_);
      comm_.all_to_all_v(view<const std::byte>(reinterpret_cast<const std::byte*>(packed_.data()), 8 * count),
                         send_sizes_, view<std::byte>(reinterpret_cast<std::byte*>(received_on_.data()), 8 * received),
                         recv_sizes_);
      note(sizeof(sparse_entry) * (count - send_counts_[me]), sizeof(sparse_entry) * (received - recv_counts_[me]));

      // The parts received, rank after rank: checked (fault word 0), then summed in rank
      // order and the sums checked (word 1).
      const sparse_entry* parts = received_on_.data();
      std::uint32_t* checked = fault_.data();
      std::uint32_t* summed = fault_.data() + 1;
      be.for_each(shard_n, sums::mark_unsent{shard_sums_.data()});
      be.clear(fault_.data(), 2);
      for (std::size_t r = 0, at = 0; r < ranks; at += recv_counts_[r], ++r) {
        be.reduce_or(recv_counts_[r], sums::part_faults<sparse_entry>{parts + at, begin, end}, checked);
      }
      for (std::size_t r = 0, at = 0; r < ranks; at += recv_counts_[r], ++r) {
        be.for_each(recv_counts_[r], sums::add_part<sparse_entry>{parts + at, begin, checked, shard_sums_.data()});
      }
      be.reduce_or(received, sums::sum_faults<sparse_entry>{parts, begin, checked, shard_sums_.data()}, summed);
      std::uint32_t words[2] = {};
      be.to_host(static_cast<const std::uint32_t*>(fault_.data()), 2, words);
      (void)agree_on_sums(words[0] != 0 ? corrupt : words[1] != 0 ? overflow : 0u, 0);
    } catch (...) {
      compressor_.drop_staged();
      throw;
    }
    be.for_each(shard_n, sums::write_shard{shard_sums_.data(), scale, detail::raw(shard).data()});
    compressor_.accept_staged();
  }

  /// Gives back the exchange's workspace (memory_bytes(): the message, the lists of
  /// entries it sent, received and summed, the selection, reduce_scatter's shard-sized
  /// sums and shard starts) and the compressor's
  /// (compressor::release_workspace), until the next step allocates them again; the
  /// regions, which the next step takes from this one's selection, stay. For exchanges
  /// that take turns (FSDP's parameter groups), so that they hold one workspace at a time.
  /// The selection step() returned is given back too.
  /// \throws gradcomp::error (invalid_argument) while the compressor's step is staged
  ///         (accept_staged() reads the selection); nothing changes then.
  void release_workspace() {
    compressor_.release_workspace();
    const auto give_back = [](auto&... v) { ((v = std::remove_reference_t<decltype(v)>{}), ...); };
    give_back(message_, index_, values_, starts_, packed_, received_on_, shard_sums_, fault_);
    give_back(host_message_, global_value_, mine_, received_, sums_, selected_, global_, first_, counts_of_all_,
              global_index_);
  }

  /// The global selection's size this step takes.
  [[nodiscard]] std::size_t k() const {
    if (k_ != 0) return k_;
    const double density = detail::density_of(compressor_.selector());
    const std::size_t n = compressor_.size();
    return density > 0.0 ? detail::entries_at_density(density, n) : compressor_.selector().max_selected(n);
  }
  /// The regions' bounds: rank j sums the indices in [regions()[j], regions()[j + 1]).
  [[nodiscard]] std::span<const std::uint32_t> regions() const noexcept { return bounds_; }
  /// What this rank moved in its last step (also one that threw).
  [[nodiscard]] const comm::traffic& last_traffic() const noexcept { return traffic_; }
  /// Bytes the exchange holds beside its compressor's (its message, the selection and
  /// their sums, the lists of entries it exchanges): all workspace.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return detail::bytes_held(message_, index_, values_, host_message_, global_value_, starts_, packed_, received_on_,
                              shard_sums_, fault_, bounds_, mine_, received_, sums_, selected_, global_, first_,
                              counts_of_all_, send_counts_, recv_counts_, send_sizes_, recv_sizes_, pairs_,
                              global_sizes_, verdicts_, global_index_);
  }

 private:
  static constexpr const char* who = "sparse_allreduce";

  template <class Grad>
  std::span<const std::uint32_t> run(const Grad& grad, view<float> dense, float scale) {
    const std::size_t n = compressor_.size();
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    const std::size_t k = this->k();
    const std::size_t total = reduce_in_regions(
        grad, bounds_, {{"n", n}, {"k", k}, {"the policies", policies_}, {"the regions", regions_fingerprint()}}, [&] {
          detail::require(dense.size() == n, errc::invalid_argument, who, ": dense.size() = ", dense.size(),
                          " does not match n = ", n);
          detail::require(std::isfinite(scale), errc::invalid_argument, who, ": scale must be finite, got ", scale);
        });

    // 4. The exact global top-k of |sum|, ties to the lower index: the k-th largest
    // magnitude key over all ranks, then the ties it leaves split in rank (= index) order.
    const auto key_at = [&](std::size_t j) { return detail::magnitude_key(sums_[j].value); };
    detail::kth_key kth{0, 0};
    const bool take_all = total <= k;
    if (!take_all) {
      kth = detail::kth_largest(
          key_at, sums_.size(), k, 0, 0,
          [&](std::span<std::uint32_t> bins) {
            comm_.all_reduce_sum(bins, total);  // a bin counts some of the `total` sums
            note(4 * bins.size(), 4 * bins.size());
          },
          detail::collective_digits);
    }
    std::uint64_t above = 0, ties = 0;
    for (std::size_t j = 0; j < sums_.size(); ++j) {
      const std::uint32_t key = key_at(j);
      above += take_all || key > kth.key ? 1 : 0;
      ties += !take_all && key == kth.key ? 1 : 0;
    }
    // Each rank's count above the k-th key and of ties at it: the ties go to the lowest
    // ranks' regions first, which hold the lower indices.
    pairs_.assign(2 * ranks, 0);
    const std::uint64_t mine_pair[2] = {above, ties};
    comm_.all_gather(std::as_bytes(std::span(mine_pair)), std::as_writable_bytes(std::span(pairs_)));
    note(16, 16 * (ranks - 1));
    std::uint64_t ties_left = kth.ties_left;
    global_sizes_.resize(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::uint64_t take = std::min<std::uint64_t>(pairs_[2 * r + 1], ties_left);
      ties_left -= take;
      pairs_[2 * r + 1] = take;
      global_sizes_[r] = sizeof(sparse_entry) * detail::saturating_add(pairs_[2 * r], take);
    }
    selected_.clear();
    for (std::size_t j = 0, ties_taken = 0; j < sums_.size(); ++j) {
      const std::uint32_t key = key_at(j);
      const bool tie = !take_all && key == kth.key && ties_taken < pairs_[2 * me + 1];
      ties_taken += tie ? 1 : 0;
      if (take_all || key > kth.key || tie) selected_.push_back(sums_[j]);
    }
    global_.resize(detail::total_size(global_sizes_) / sizeof(sparse_entry));
    comm_.all_gather_v(std::as_bytes(std::span(selected_)), global_sizes_, std::as_writable_bytes(std::span(global_)));
    note(sizeof(sparse_entry) * selected_.size(), sizeof(sparse_entry) * (global_.size() - selected_.size()));
    check_global(n, std::min(k, total));

    // 5. Every rank adds the same sums (each commits what the selection kept of its own
    // in accept_staged()); the next step's regions follow this selection.
    global_index_.resize(global_.size());
    global_value_.resize(global_.size());
    for (std::size_t j = 0; j < global_.size(); ++j) {
      global_index_[j] = global_[j].index;
      global_value_[j] = global_[j].value;
    }
    add(detail::raw(dense), scale);
    balance_regions(n);
    return global_index_;
  }

  // Step 1 of both collectives: this rank stages its step and the ranks agree (on
  // `settings`, and that `check_args`, every stage and `after_stage` passed: what may
  // fail on one rank only, an allocation, a copy, goes there, so that no rank waits).
  // Returns every rank's value of after_stage(), in rank order.
  template <class Grad, class CheckArgs, class AfterStage>
  std::vector<std::uint64_t> stage_agreed(const Grad& grad, std::initializer_list<detail::setting> settings,
                                          CheckArgs&& check_args, AfterStage&& after_stage) {
    const auto ranks = static_cast<std::size_t>(comm_.size());
    traffic_ = {};
    std::vector<std::uint64_t> values = detail::agree(comm_, who, settings, [&]() -> std::uint64_t {
      check_args();
      const auto m = compressor_.stage(grad, message_out());
      message_bytes_ = detail::raw(m.bytes()).size();
      return after_stage();
    });
    note(detail::rank_verdict::size, (ranks - 1) * detail::rank_verdict::size);
    return values;
  }

  // Steps 1-3 of the global top-k: this rank's step staged and agreed on; each rank
  // sends the entries of region j = [bounds[j], bounds[j + 1]) to rank j, which sums
  // them in rank order into sums_; the ranks agree that what each received and summed
  // is sound. Returns the number of sums over all ranks.
  template <class Grad, class CheckArgs>
  std::size_t reduce_in_regions(const Grad& grad, std::span<const std::uint32_t> bounds,
                                std::initializer_list<detail::setting> settings, CheckArgs&& check_args) {
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    (void)stage_agreed(grad, settings, check_args, [&] {  // this rank's entries, read from its message
      host_message_.resize(message_bytes_);
      compressor_.backend().to_host(message_.data(), message_bytes_, host_message_.data());
      mine_.clear();
      detail::message_reader(host_message_).visit([&](std::uint32_t i, float v) { mine_.push_back({i, v}); });
      return std::uint64_t{0};
    });
    traffic_.entries = mine_.size();
    send_counts_.assign(ranks, 0);
    for (std::size_t j = 0, at = 0; j < ranks; ++j) {
      const auto end = std::lower_bound(mine_.begin() + static_cast<std::ptrdiff_t>(at), mine_.end(), bounds[j + 1],
                                        [](const sparse_entry& e, std::uint32_t b) { return e.index < b; });
      send_counts_[j] = static_cast<std::uint64_t>(end - mine_.begin()) - at;
      at += send_counts_[j];
    }
    exchange_entries(mine_);
    const std::uint32_t my_verdict = sum_region(bounds[me], bounds[me + 1]);
    return agree_on_sums(my_verdict, sums_.size());
  }

  // Sends send_counts_[j] entries of `mine` (host memory, ascending by destination) to
  // rank j, the counts first; what each rank sent this one goes to received_, rank
  // after rank, with their counts in recv_counts_.
  void exchange_entries(std::span<const sparse_entry> mine) {
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    recv_counts_.assign(ranks, 0);
    comm_.all_to_all(send_counts_, recv_counts_);
    note(8 * (ranks - 1), 8 * (ranks - 1));
    received_.resize(detail::total_size(recv_counts_));
    bytes_of(send_counts_, send_sizes_);
    bytes_of(recv_counts_, recv_sizes_);
    comm_.all_to_all_v(std::as_bytes(mine), send_sizes_, std::as_writable_bytes(std::span(received_)), recv_sizes_);
    note(sizeof(sparse_entry) * (mine.size() - send_counts_[me]),
         sizeof(sparse_entry) * (received_.size() - recv_counts_[me]));
  }

  // Every rank's verdict on what it received (0, corrupt or overflow; this rank's is
  // `mine`) and the number of sums over all ranks (this rank's `sums`, which the
  // regions being disjoint add up): every rank raises alike for a rank's fault.
  std::size_t agree_on_sums(std::uint32_t mine, std::size_t sums) {
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    verdicts_.assign(ranks + 1, 0);
    verdicts_[me] = mine;
    verdicts_[ranks] = static_cast<std::uint32_t>(sums);
    comm_.all_reduce_sum(verdicts_, std::max<std::uint64_t>(compressor_.size(), overflow));
    note(4 * verdicts_.size(), 4 * verdicts_.size());
    for (std::size_t r = 0; r < ranks; ++r) {
      detail::require(verdicts_[r] != corrupt, errc::corrupt_message, who, ": rank ", r, " of ", ranks,
                      " received entries outside its region or out of order");
      detail::require(verdicts_[r] != overflow, errc::invalid_argument, who, ": a sum in rank ", r, " of ", ranks,
                      "'s region overflows (not finite)");
    }
    return verdicts_[ranks];
  }

  // Room in received_on_ for the entries this rank receives now, whose number it returns:
  // `room` holds every rank's (from the agreement), so where one lacks it every rank
  // knows, and the ranks agree again while those grow theirs (an eighth more than they
  // need, grow_roomy): the first call, a larger selection, a workspace given back. A
  // rank that cannot allocate it fails that agreement, and every rank raises its error.
  std::size_t make_room(std::span<const std::uint64_t> room) {
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    bool short_of_room = false;
    std::uint64_t mine = 0;
    for (std::size_t j = 0; j < ranks; ++j) {
      std::uint64_t total = 0;
      for (std::size_t r = 0; r < ranks; ++r) total = detail::saturating_add(total, counts_of_all_[r * ranks + j]);
      short_of_room = short_of_room || total > room[j];
      if (j == me) mine = total;
    }
    if (short_of_room) {
      (void)detail::agree(comm_, who, {}, [&]() -> std::uint64_t {
        grow_roomy(received_on_, static_cast<std::size_t>(mine));
        return 0;
      });
      note(detail::rank_verdict::size, (ranks - 1) * detail::rank_verdict::size);
    }
    return static_cast<std::size_t>(mine);
  }
  // This rank's message buffer, room for the compressor's largest message.
  typename Compressor::message_bytes message_out() {
    if (static_cast<std::size_t>(message_.size()) < compressor_.max_message_bytes()) {
      message_ = compressor_.backend().template allocate<std::byte>(compressor_.max_message_bytes());
    }
    return {message_.data(), static_cast<std::size_t>(message_.size())};
  }
  // Grows a buffer of reduce_scatter's workspace to `count` elements (never shrinks):
  // scratch that its passes write before they read it (on a device, nothing zeroed and
  // nothing waited for).
  template <class T>
  void grow(buffer<T>& b, std::size_t count) {
    if (static_cast<std::size_t>(b.size()) < count) b = detail::allocate_scratch<T>(compressor_.backend(), count);
  }
  // grow() for a count that changes from call to call (the entries sent and received):
  // an eighth more, so that a count creeping up does not allocate at every call.
  template <class T>
  void grow_roomy(buffer<T>& b, std::size_t count) {
    if (static_cast<std::size_t>(b.size()) < count) grow(b, count + count / 8);
  }

  // The entries received (rank after rank, each ascending) summed per index in rank
  // order into sums_, ascending; the verdict on them (0, corrupt or overflow).
  std::uint32_t sum_region(std::uint32_t begin, std::uint32_t end) {
    std::uint32_t verdict = 0;
    for (std::size_t r = 0, at = 0; r < recv_counts_.size(); at += recv_counts_[r], ++r) {
      for (std::size_t j = at; j < at + recv_counts_[r]; ++j) {
        const sparse_entry e = received_[j];
        const bool ordered = j == at || received_[j - 1].index < e.index;
        const bool finite = detail::magnitude_key(e.value) < detail::non_finite_key;
        if (e.index < begin || e.index >= end || !ordered || !finite) verdict = corrupt;
      }
    }
    sums_.clear();
    if (verdict != 0) return verdict;
    // A stable sort by index keeps each index's values in rank order.
    std::stable_sort(received_.begin(), received_.end(),
                     [](const sparse_entry& a, const sparse_entry& b) { return a.index < b.index; });
    for (const sparse_entry& e : received_) {
      if (!sums_.empty() && sums_.back().index == e.index) {
        sums_.back().value += e.value;
      } else {
        sums_.push_back(e);
      }
    }
    for (const sparse_entry& s : sums_) {
      if (detail::magnitude_key(s.value) >= detail::non_finite_key) return overflow;
    }
    return 0;
  }

  // dense[i] += scale * s_i for the selection, in the compressor's memory (the transport's
  // way of adding there: a kernel on a device).
  void add(std::span<float> dense, float scale) {
    const std::size_t count = global_index_.size();
    if (static_cast<std::size_t>(index_.size()) < count) {
      index_ = compressor_.backend().template allocate<std::uint32_t>(count);
      values_ = compressor_.backend().template allocate<float>(count);
    }
    compressor_.backend().to_device(global_index_.data(), count, index_.data());
    compressor_.backend().to_device(global_value_.data(), count, values_.data());
    compressor_.backend().for_each(count, detail::scatter_add{index_.data(), values_.data(), scale, dense.data()});
  }

  // The all-gathered selection, the same bytes on every rank, so every rank judges it
  // alike: `expected` entries, indices ascending and below n, values finite.
  void check_global(std::size_t n, std::size_t expected) const {
    bool sound = global_.size() == expected;
    for (std::size_t j = 0; sound && j < global_.size(); ++j) {
      sound = global_[j].index < n && (j == 0 || global_[j - 1].index < global_[j].index) &&
              detail::magnitude_key(global_[j].value) < detail::non_finite_key;
    }
    detail::require(sound, errc::corrupt_message, who, ": the gathered global selection is corrupt");
  }

  // Regions for the next step: the previous selection cut into equal parts, so that
  // each region holds about k / W of the indices that are likely to come again.
  void balance_regions(std::size_t n) {
    const std::size_t ranks = bounds_.size() - 1;
    if (global_index_.empty()) return;
    bounds_[0] = 0;
    bounds_[ranks] = static_cast<std::uint32_t>(n);
    for (std::size_t j = 1; j < ranks; ++j) bounds_[j] = global_index_[j * global_index_.size() / ranks];
  }

  [[nodiscard]] std::uint64_t regions_fingerprint() const {
    detail::fingerprint f;
    for (const std::uint32_t b : bounds_) f.add(b);
    return f.value();
  }

  static void bytes_of(const std::vector<std::uint64_t>& counts, std::vector<std::uint64_t>& bytes) {
    bytes.resize(counts.size());
    for (std::size_t j = 0; j < counts.size(); ++j) bytes[j] = sizeof(sparse_entry) * counts[j];
  }
  void note(std::uint64_t sent, std::uint64_t received) noexcept {
    traffic_.sent += sent;
    traffic_.received += received;
    ++traffic_.collectives;
  }

  static constexpr std::uint32_t corrupt = 1;
  static constexpr std::uint32_t overflow = 2;

  Comm& comm_;
  Compressor& compressor_;
  std::size_t k_;
  buffer<std::byte> message_;            // this rank's message, in the compressor's memory
  std::size_t message_bytes_ = 0;        // its size
  buffer<std::uint32_t> index_;          // the selection, in the compressor's memory
  buffer<float> values_;                 // its sums
  std::vector<std::byte> host_message_;  // the message on the host
  std::vector<float> global_value_;
  // reduce_scatter's, in the compressor's memory: where each shard starts in the
  // selection, the entries packed, those received, the shard's sums, and the checks'
  // fault word.
  buffer<std::uint64_t> starts_;
  buffer<sparse_entry> packed_, received_on_;
  buffer<float> shard_sums_;
  buffer<std::uint32_t> fault_;
  std::uint64_t policies_;
  std::vector<std::uint32_t> bounds_;  // W + 1 region bounds
  std::vector<sparse_entry> mine_, received_, sums_, selected_, global_;
  std::vector<std::uint64_t> first_, counts_of_all_, send_counts_, recv_counts_, send_sizes_, recv_sizes_, pairs_,
      global_sizes_;
  std::vector<std::uint32_t> verdicts_, global_index_;
  comm::traffic traffic_;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
