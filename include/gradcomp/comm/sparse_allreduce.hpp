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
#include <gradcomp/detail/comm/global_topk.hpp>
#include <gradcomp/detail/comm/region_sums.hpp>
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
#include <cstring>
#include <initializer_list>
#include <limits>
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
///    each rank's part of it (its region's selected (index, sum)) is all-gathered and
///    the parts assembled in rank order;
/// 4. every rank adds `scale` times the k sums to `dense` (the same bits everywhere),
///    and commits of its own step only the entries the global selection kept
///    (compressor::accept_staged(kept)): what it sent and the selection dropped stays
///    in its memory, so no gradient mass is lost.
///
/// `Comm` is the transport (comm/transport.hpp) in the compressor's memory. The local
/// work of both collectives runs where that memory is (detail/comm/region_sums.hpp,
/// detail/comm/global_topk.hpp), and the entries, histograms and selection travel there
/// (the transport's collectives of that memory). What crosses to the host: the W + 2
/// region starts with the step's verdict (the counts every rank learns in the
/// agreement), and once, at the end, every rank's verdict on its region, the selection
/// and the next step's regions (step()) or two fault words (reduce_scatter()). `grad`,
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
    // The regions in the compressor's memory too, where the step finds its region starts.
    outcome_ = compressor.backend().template allocate<std::uint32_t>(slots_at());
    compressor.backend().for_each(bounds_.size(),
                                  detail::region_sums::equal_regions{compressor.size(), ranks, outcome_.data()});
  }

  /// One step with this rank's gradient: `dense[i] += scale * s_i` for the k indices i
  /// of largest |s_i|, s being the sum over ranks of what their compressors sent.
  /// `grad` is any gradient the compressor takes (gradient_view: float32, IEEE half or
  /// bfloat16, read as compressor::compress reads it).
  /// \returns the global selection, ascending (every rank's is the same), in host
  ///          memory, valid until the next step or release_workspace()
  /// \throws gradcomp::error on every rank alike, changing no compressor and no `dense`,
  ///         if any rank's dense.size() != n, `scale` is not finite, its step is
  ///         rejected (a NaN or infinity) or what it received is corrupt, if a sum
  ///         overflows, or if the ranks disagree on n, k, the policies or the regions;
  ///         (corrupt_message) where the gathered selection is not ascending below n
  ///         with finite sums (a broken transport).
  template <gradient_view<backend_type> Grad>
  std::span<const std::uint32_t> step(const Grad& grad, view<float> dense, float scale) {
    const auto selected = stage(grad, dense, scale);
    accept_staged();
    return selected;
  }

  /// step() but the commit: the compressor's step stays staged until accept_staged()
  /// (or drop_staged()), so that a DDP hook can commit all of a step's buckets together,
  /// once every one of them has succeeded on every rank. `dense` is written. `also`:
  /// settings the ranks must share beside the exchange's own (a DDP hook's), agreed in
  /// the same first exchange, a disagreement on any of them reported as `who`'s.
  /// \throws gradcomp::error as step() does; nothing is staged then.
  template <gradient_view<backend_type> Grad>
  std::span<const std::uint32_t> stage(const Grad& grad, view<float> dense, float scale,
                                       std::span<const detail::setting> also = {},
                                       const char* who_agrees = "sparse_allreduce") {
    try {
      return run(grad, dense, scale, also, who_agrees);
    } catch (...) {
      compressor_.drop_staged();
      throw;
    }
  }
  /// Commits of the compressor's staged step what the global selection kept (read where
  /// the selection arrived: nothing is copied to a device).
  /// \throws gradcomp::error (invalid_argument) if no step is staged.
  void accept_staged() {
    compressor_.accept_staged(view<const std::uint32_t>(outcome_.data() + slots_at(), selected_));
  }
  /// Drops the compressor's staged step.
  void drop_staged() noexcept { compressor_.drop_staged(); }

  /// A sparse reduce-scatter (FSDP's, gradcomp.torch.fsdp): the n indices are cut into W
  /// equal shards (n a multiple of W), rank j owning [j·n/W, (j+1)·n/W); each rank sends
  /// each shard's entries of its step to the shard's owner (steps 1-2 above), which
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
    const std::size_t n = compressor_.size();
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    const backend_type& be = compressor_.backend();
    try {
      const detail::setting settings[] = {{"n", n}, {"the policies", policies_}};
      (void)sum_in_regions(
          grad, settings, who,
          [&] {
            detail::require(n % ranks == 0, errc::invalid_argument, who, ": reduce_scatter needs n = ", n,
                            " to be a multiple of the ranks, ", ranks);
            detail::require(shard.size() == n / ranks, errc::invalid_argument, who, ": shard.size() = ", shard.size(),
                            " does not match n / ranks = ", n / ranks);
            detail::require(std::isfinite(scale), errc::invalid_argument, who, ": scale must be finite, got ", scale);
            grow(shards_, ranks + 1);
            be.for_each(ranks + 1, detail::region_sums::equal_regions{n, ranks, shards_.data()});
            return shards_.data();
          },
          static_cast<std::uint32_t>(me * n / ranks), static_cast<std::uint32_t>((me + 1) * n / ranks), false);
      std::uint32_t words[2] = {};
      be.to_host(static_cast<const std::uint32_t*>(fault_.data()), 2, words);
      agree_on_sums(words[0] != 0 ? detail::region_sums::corrupt : words[1] != 0 ? detail::region_sums::overflow : 0u);
    } catch (...) {
      compressor_.drop_staged();
      throw;
    }
    be.for_each(shard.size(), detail::region_sums::write_shard{region_sums_.data(), scale, detail::raw(shard).data()});
    compressor_.accept_staged();
  }

  /// Gives back the exchange's workspace (memory_bytes(): the message, the lists of
  /// entries it sent, received and summed, the region's sums and the selection's
  /// lists) and the compressor's (compressor::release_workspace), until the next step
  /// allocates them again; the regions, which the next step takes from this one's
  /// selection, stay, with the selection's indices. For exchanges that take turns (FSDP's
  /// parameter groups), so that they hold one workspace at a time. The selection step()
  /// returned is given back too.
  /// \throws gradcomp::error (invalid_argument) while the compressor's step is staged
  ///         (accept_staged() reads the selection); nothing changes then.
  void release_workspace() {
    compressor_.release_workspace();
    const auto give_back = [](auto&... v) { ((v = std::remove_reference_t<decltype(v)>{}), ...); };
    give_back(message_, starts_, packed_, received_on_, region_sums_, fault_, shards_, list_, chosen_, ties_, bins_,
              compaction_, part_, gathered_, values_);
    give_back(outcome_host_, first_, counts_of_all_);
    room_ = 0;
    listed_ = 0;
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
  /// Bytes the exchange holds beside its compressor's (its message, the entries it
  /// exchanges and their sums, the selection's lists, parts and outcome): workspace, but
  /// for the regions and the selection's indices (a few words and k).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return detail::bytes_held(message_, starts_, packed_, received_on_, region_sums_, fault_, shards_, list_, chosen_,
                              ties_, bins_, compaction_, part_, gathered_, values_, outcome_, outcome_host_, bounds_,
                              first_, counts_of_all_, send_counts_, recv_counts_, send_sizes_, recv_sizes_, verdicts_);
  }

 private:
  static constexpr const char* who = "sparse_allreduce";
  using selection = detail::global_topk::selection;
  using record = detail::global_topk::record;

  // outcome_, in uint32 words: the step's regions (W + 1, kept from step to step), every
  // rank's record (all-gathered), the selection's state, this rank's record, where each
  // rank's part starts in the selection (W + 1), then the selection's k index slots.
  // The host reads it once per step (twice where a part outgrew the gather).
  [[nodiscard]] std::size_t records_at() const noexcept { return bounds_.size(); }
  [[nodiscard]] std::size_t selection_at() const noexcept {
    return records_at() + (bounds_.size() - 1) * sizeof(record) / 4;
  }
  [[nodiscard]] std::size_t mine_at() const noexcept { return selection_at() + sizeof(selection) / 4; }
  [[nodiscard]] std::size_t starts_at() const noexcept { return mine_at() + sizeof(record) / 4; }
  [[nodiscard]] std::size_t slots_at() const noexcept { return starts_at() + bounds_.size(); }

  template <class Grad>
  std::span<const std::uint32_t> run(const Grad& grad, view<float> dense, float scale,
                                     std::span<const detail::setting> also, const char* who_agrees) {
    namespace top = detail::global_topk;
    const std::size_t n = compressor_.size();
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    const std::size_t k = this->k();
    const backend_type& be = compressor_.backend();
    const std::uint32_t begin = bounds_[me];
    const std::size_t region = bounds_[me + 1] - begin;
    const std::size_t capacity = std::min(capacity_, k);  // the gather's, the same on every rank (k may have dropped)
    std::vector<detail::setting> settings{{"n", n},
                                          {"k", k},
                                          {"the policies", policies_},
                                          {"the regions and the gather's capacity", regions_fingerprint()}};
    settings.insert(settings.end(), also.begin(), also.end());
    const std::size_t received = sum_in_regions(
        grad, settings, who_agrees,
        [&] {
          detail::require(dense.size() == n, errc::invalid_argument, who, ": dense.size() = ", dense.size(),
                          " does not match n = ", n);
          detail::require(std::isfinite(scale), errc::invalid_argument, who, ": scale must be finite, got ", scale);
          grow_outcome(k);
          grow(bins_, top_bins + 1 + 3);
          grow(compaction_, compaction_bytes(std::max(region, listed_)));
          grow(part_, k);
          grow(values_, k);
          grow(gathered_, ranks * capacity);
          outcome_host_.resize(slots_at() + k);
          verdicts_.resize(ranks);
          return static_cast<const std::uint32_t*>(outcome_.data());
        },
        begin, bounds_[me + 1], true);

    // 4. The exact global top-k of |sum|, ties to the lower index, where the sums are:
    // this region's sums listed; the k-th largest key over all ranks, digit by digit;
    // the ties it leaves split in rank (= index) order; each rank's part gathered and
    // assembled in rank order.
    std::uint32_t* words = outcome_.data();
    auto* at = reinterpret_cast<selection*>(words + selection_at());
    const float* sums = region_sums_.data();
    const std::uint32_t* list = list_.data();
    be.clear(at, 1);
    if (region != 0) be.compact(region, top::is_sent{sums}, list_.data(), compaction(), &at->sums);
    std::uint32_t* bins = bins_.data();
    for (std::size_t d = 0; d < detail::collective_digits.size(); ++d) {
      const auto [shift, bits] = detail::collective_digits[d];
      const std::size_t count = (std::size_t{1} << bits) + (d == 0 ? 1 : 0);  // the first carries the total
      be.clear(bins, count);
      be.histogram(received, top::digit_bin{sums, list, at, shift, bits}, bins);
      if (d == 0) be.for_each(1, top::count_in_bin{at, bins + count - 1});
      comm_.all_reduce_sum(view<std::uint32_t>(bins, count), n);  // the regions are disjoint: no count above n
      note(4 * count, 4 * count);
      be.for_each(1, top::pick_digit{bins, shift, bits, d == 0, k, at});
    }
    std::uint32_t* classes = bins + top_bins + 1;
    be.clear(classes, 3);
    be.histogram(received, top::key_class{sums, list, at}, classes);
    auto* mine = reinterpret_cast<record*>(words + mine_at());
    be.for_each(1, top::record_of{classes, fault_.data(), mine});
    comm_.all_gather(view<const std::byte>(reinterpret_cast<const std::byte*>(mine), sizeof(record)),
                     view<std::byte>(reinterpret_cast<std::byte*>(words + records_at()), ranks * sizeof(record)));
    note(sizeof(record), (ranks - 1) * sizeof(record));
    std::uint32_t* starts = words + starts_at();
    be.for_each(1, top::split_ties{reinterpret_cast<const record*>(words + records_at()), ranks, me, at, starts});
    if (received != 0) be.compact(received, top::is_tie{sums, list, at}, ties_.data(), compaction(), &at->tie_count);
    be.for_each(1, top::last_tie{ties_.data(), at});
    if (received != 0) {
      be.compact(received, top::is_selected{sums, list, at}, chosen_.data(), compaction(), &at->chosen);
    }
    be.for_each(received, top::place<sparse_entry>{chosen_.data(), &at->chosen, list, sums, begin, k, part_.data()});
    gather_selection(capacity, k, dense, scale);

    // The step's one read, from the regions through the selection's indices; every
    // rank judges the same records and the same selection, and raises alike.
    read_outcome(k);
    selection state = read_selection();
    const std::uint32_t* read = outcome_host_.data();
    for (std::size_t r = 0; r < ranks; ++r) verdicts_[r] = read[records_at() + r * sizeof(record) / 4 + 2];
    raise_faults(verdicts_);
    detail::require(state.refused == 0, errc::corrupt_message, who, ": a rank's record holds a fault it cannot have");
    std::uint64_t longest = 0;  // the largest part, the same on every rank
    for (std::size_t r = 0; r < ranks; ++r) {
      longest = std::max<std::uint64_t>(longest, read[starts_at() + r + 1] - read[starts_at() + r]);
    }
    detail::require(longest <= k, errc::corrupt_message, who, ": a rank's part of the selection exceeds k = ", k);
    const std::size_t next_capacity = std::min<std::size_t>(k, static_cast<std::size_t>(longest + longest / 8 + 16));
    if (state.outgrown != 0) {  // a part outgrew the gather: again, with room for the largest, agreed
      (void)detail::agree(comm_, who, {{"the largest part", longest}}, [&]() -> std::uint64_t {
        grow(gathered_, ranks * next_capacity);  // room for the next steps' gathers too
        return 0;
      });
      note(detail::rank_verdict::size, (ranks - 1) * detail::rank_verdict::size);
      gather_selection(static_cast<std::size_t>(longest), k, dense, scale);
      read_outcome(k);
      state = read_selection();
      detail::require(state.outgrown == 0, errc::corrupt_message, who, ": the selection's parts outgrew ", longest,
                      " entries, their largest");
    }
    detail::require(state.broken == 0, errc::corrupt_message, who, ": the gathered global selection is corrupt");
    bounds_.assign(read, read + ranks + 1);
    capacity_ = next_capacity;
    selected_ = state.take;
    return std::span<const std::uint32_t>(read + slots_at(), selected_);
  }

  // The gather of the selection's parts with room for `capacity` entries each (the same
  // on every rank): assembled in rank order where every part fits, then checked, added
  // to `dense` and cut into the next regions, each where the selection is usable.
  void gather_selection(std::size_t capacity, std::size_t k, view<float> dense, float scale) {
    namespace top = detail::global_topk;
    const backend_type& be = compressor_.backend();
    const auto ranks = static_cast<std::size_t>(comm_.size());
    std::uint32_t* words = outcome_.data();
    auto* at = reinterpret_cast<selection*>(words + selection_at());
    const std::uint32_t* starts = words + starts_at();
    std::uint32_t* slots = words + slots_at();
    be.for_each(1, top::parts_fit{starts, ranks, capacity, at});
    if (capacity != 0) {
      const std::size_t bytes = capacity * sizeof(sparse_entry);
      comm_.all_gather(view<const std::byte>(reinterpret_cast<const std::byte*>(part_.data()), bytes),
                       view<std::byte>(reinterpret_cast<std::byte*>(gathered_.data()), ranks * bytes));
      note(bytes, (ranks - 1) * bytes);
      be.for_each(ranks * capacity,
                  top::assemble<sparse_entry>{gathered_.data(), capacity, k, starts, at, slots, values_.data()});
    }
    be.reduce_or(k, top::selection_faults{slots, values_.data(), compressor_.size(), at}, &at->broken);
    be.for_each(k, top::add_selection{slots, values_.data(), at, scale, detail::raw(dense).data()});
    be.for_each(ranks + 1, top::next_regions{slots, ranks, compressor_.size(), at, words});
  }
  // outcome_ read into outcome_host_ (sized in the agreement), up to the k index slots.
  void read_outcome(std::size_t k) {
    compressor_.backend().to_host(static_cast<const std::uint32_t*>(outcome_.data()), slots_at() + k,
                                  outcome_host_.data());
  }
  [[nodiscard]] selection read_selection() const {
    selection state{};
    std::memcpy(&state, outcome_host_.data() + selection_at(), sizeof(state));
    return state;
  }

  // Steps 1-3 of both collectives, where the compressor's memory is: this rank stages
  // its step and finds where each region's entries start in its selection (`prepare()`,
  // which checks the arguments and grows what the caller needs, returns the regions'
  // W + 1 bounds in that memory), which it reads back with the step's verdict; the
  // ranks agree (on `settings`, a disagreement reported as `who_agrees`', and that
  // `prepare`, every stage and the workspace's growth passed: what may fail on one rank
  // only goes there, so that no rank waits) and learn each other's counts for each
  // region in the same all-gather, so that each knows what every rank receives. Each
  // rank sends region j's entries to rank j, which checks them and sums them in rank
  // order into region_sums_ (its region is [begin, end)); fault_ holds the checks' words
  // (a corrupt part, an overflowed sum). `listed`: the global selection's lists grow
  // with the room for the entries received. Returns the entries this rank received.
  template <class Grad, class Prepare>
  std::size_t sum_in_regions(const Grad& grad, std::span<const detail::setting> settings, const char* who_agrees,
                             Prepare&& prepare, std::uint32_t begin, std::uint32_t end, bool listed) {
    namespace sums = detail::region_sums;
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    const backend_type& be = compressor_.backend();
    traffic_ = {};
    send_counts_.assign(ranks, 0);
    counts_of_all_.resize(ranks * ranks);
    const std::vector<std::uint64_t> room = detail::agree(
        comm_, who_agrees, settings,
        [&]() -> std::uint64_t {
          const std::uint32_t* regions = prepare();
          // The workspace allocated here, where a failure is every rank's error.
          grow(starts_, ranks + 2);
          grow(region_sums_, end - begin);
          grow(fault_, 2);
          const auto out = message_out();
          const detail::step_status* status = compressor_.stage_queued(be, grad, out);
          const auto sent = compressor_.staged_selection();
          be.for_each(ranks + 2,
                      sums::region_starts{detail::raw(sent.index).data(), status, regions, ranks, starts_.data()});
          first_.resize(ranks + 2);
          be.to_host(static_cast<const std::uint64_t*>(starts_.data()), ranks + 2, first_.data());
          if (first_[ranks + 1] != 0) {  // a value was not finite: its error, read now (the step is dropped)
            (void)compressor_.staged_message(be, grad, out);
            detail::fail(errc::invalid_argument, who, ": a step's status said a value was not finite; it is not");
          }
          for (std::size_t j = 0; j < ranks; ++j) send_counts_[j] = first_[j + 1] - first_[j];
          grow_roomy(packed_, static_cast<std::size_t>(first_[ranks]));
          return listed ? std::min(room_, listed_) : room_;
        },
        std::as_writable_bytes(std::span(send_counts_)), std::as_writable_bytes(std::span(counts_of_all_)));
    note(detail::rank_verdict::size + detail::region_sums::counts_bytes(ranks),
         (ranks - 1) * (detail::rank_verdict::size + detail::region_sums::counts_bytes(ranks)));
    const auto count = static_cast<std::size_t>(first_[ranks]);
    const auto sent = compressor_.staged_selection();
    traffic_.entries = count;
    recv_counts_.resize(ranks);
    for (std::size_t r = 0; r < ranks; ++r) recv_counts_[r] = counts_of_all_[r * ranks + me];
    const std::size_t received = make_room(room, listed);

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
    be.for_each(end - begin, sums::mark_unsent{region_sums_.data()});
    be.clear(fault_.data(), 2);
    for (std::size_t r = 0, at = 0; r < ranks; at += recv_counts_[r], ++r) {
      be.reduce_or(recv_counts_[r], sums::part_faults<sparse_entry>{parts + at, begin, end}, checked);
    }
    for (std::size_t r = 0, at = 0; r < ranks; at += recv_counts_[r], ++r) {
      be.for_each(recv_counts_[r], sums::add_part<sparse_entry>{parts + at, begin, checked, region_sums_.data()});
    }
    be.reduce_or(received, sums::sum_faults<sparse_entry>{parts, begin, checked, region_sums_.data()}, summed);
    return received;
  }

  // Every rank's verdict on what it received (0, corrupt or overflow; this rank's is
  // `mine`), summed over the ranks; then raise_faults.
  void agree_on_sums(std::uint32_t mine) {
    const auto ranks = static_cast<std::size_t>(comm_.size());
    verdicts_.assign(ranks, 0);
    verdicts_[static_cast<std::size_t>(comm_.rank())] = mine;
    comm_.all_reduce_sum(std::span<std::uint32_t>(verdicts_), detail::region_sums::overflow);
    note(4 * verdicts_.size(), 4 * verdicts_.size());
    raise_faults(verdicts_);
  }
  // Every rank raises alike for a rank's fault (`faults`: every rank's, in rank order).
  void raise_faults(std::span<const std::uint32_t> faults) const {
    const std::size_t ranks = faults.size();
    for (std::size_t r = 0; r < ranks; ++r) {
      detail::require(faults[r] != detail::region_sums::corrupt, errc::corrupt_message, who, ": rank ", r, " of ",
                      ranks, " received entries outside its region or out of order");
      detail::require(faults[r] != detail::region_sums::overflow, errc::invalid_argument, who, ": a sum in rank ", r,
                      " of ", ranks, "'s region overflows (not finite)");
    }
  }

  // Room for the entries this rank receives now, whose number it returns: `room` holds
  // every rank's (from the agreement), so where one lacks it every rank knows, and the
  // ranks agree again while those grow theirs (an eighth more than they need): the
  // first call, a larger selection, a workspace given back. A rank that cannot allocate
  // it fails that agreement, and every rank raises its error. What grows with it: the
  // entries received, and where `listed`, the lists of the global selection and their
  // compactions' workspace.
  std::size_t make_room(std::span<const std::uint64_t> room, bool listed) {
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
        const auto need = static_cast<std::size_t>(mine);
        const std::size_t roomy = need + need / 8;
        if (need > room_) {
          grow(received_on_, roomy);
          room_ = roomy;
        }
        if (listed && need > listed_) {
          for (auto* b : {&list_, &chosen_, &ties_}) grow(*b, roomy);
          grow(compaction_, compaction_bytes(std::max<std::size_t>(roomy, region_sums_.size())));
          listed_ = roomy;
        }
        return 0;
      });
      note(detail::rank_verdict::size, (ranks - 1) * detail::rank_verdict::size);
    }
    return static_cast<std::size_t>(mine);
  }
  // Workspace bytes of the compactions of up to `count` items (the region's sums, the
  // lists of received entries).
  [[nodiscard]] std::size_t compaction_bytes(std::size_t count) const {
    namespace top = detail::global_topk;
    const backend_type& be = compressor_.backend();
    return std::max({be.template compact_workspace<top::is_sent>(count),
                     be.template compact_workspace<top::is_tie>(count),
                     be.template compact_workspace<top::is_selected>(count)});
  }
  std::span<std::byte> compaction() noexcept {
    return {compaction_.data(), static_cast<std::size_t>(compaction_.size())};
  }
  // outcome_ with room for k indices, its regions kept.
  void grow_outcome(std::size_t k) {
    const std::size_t words = slots_at() + k;
    if (static_cast<std::size_t>(outcome_.size()) >= words) return;
    auto grown = detail::allocate_scratch<std::uint32_t>(compressor_.backend(), words);
    compressor_.backend().for_each(bounds_.size(), detail::copy_elements<std::uint32_t>{outcome_.data(), grown.data()});
    outcome_ = std::move(grown);
  }
  // This rank's message buffer, room for the compressor's largest message.
  typename Compressor::message_bytes message_out() {
    if (static_cast<std::size_t>(message_.size()) < compressor_.max_message_bytes()) {
      message_ = compressor_.backend().template allocate<std::byte>(compressor_.max_message_bytes());
    }
    return {message_.data(), static_cast<std::size_t>(message_.size())};
  }
  // Grows a buffer of the workspace to `count` elements (never shrinks): scratch that
  // the passes write before they read it (on a device, nothing zeroed and nothing
  // waited for).
  template <class T>
  void grow(buffer<T>& b, std::size_t count) {
    if (static_cast<std::size_t>(b.size()) < count) b = detail::allocate_scratch<T>(compressor_.backend(), count);
  }
  // grow() for a count that changes from call to call (the entries sent): an eighth
  // more, so that a count creeping up does not allocate at every call.
  template <class T>
  void grow_roomy(buffer<T>& b, std::size_t count) {
    if (static_cast<std::size_t>(b.size()) < count) grow(b, count + count / 8);
  }

  [[nodiscard]] std::uint64_t regions_fingerprint() const {
    detail::fingerprint f;
    for (const std::uint32_t b : bounds_) f.add(b);
    return f.add(capacity_).value();
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

  // The first digit's bins (the most of any digit).
  static constexpr std::size_t top_bins = std::size_t{1} << detail::collective_digits[0].bits;

  Comm& comm_;
  Compressor& compressor_;
  std::size_t k_;
  buffer<std::byte> message_;  // this rank's message, in the compressor's memory
  // In the compressor's memory: where each region's entries start in the selection, the
  // entries packed, those received, the region's sums, the checks' fault words,
  // reduce_scatter's shards, the global selection's lists (the region's sums, the ties,
  // the chosen), the histograms, the compactions' workspace, and outcome_ (the regions,
  // the records, the selection's state, the parts' starts and the selection's indices:
  // see records_at()).
  buffer<std::uint64_t> starts_;
  buffer<sparse_entry> packed_, received_on_;
  buffer<float> region_sums_;
  buffer<std::uint32_t> fault_, shards_, list_, chosen_, ties_, bins_;
  buffer<sparse_entry> part_, gathered_;  // this rank's part of the selection, every rank's as gathered
  buffer<float> values_;                  // the selection's sums, in slot order
  buffer<std::byte> compaction_;
  buffer<std::uint32_t> outcome_;
  std::size_t room_ = 0;      // entries received_on_ holds
  std::size_t listed_ = 0;    // entries the global selection's lists hold
  std::size_t selected_ = 0;  // the last step's global selection's size
  std::size_t capacity_ = 0;  // entries of each part of the selection's gather (the same on every rank)
  std::uint64_t policies_;
  std::vector<std::uint32_t> bounds_;  // the W + 1 region bounds, as outcome_ holds them
  std::vector<std::uint32_t> outcome_host_;
  std::vector<std::uint64_t> first_, counts_of_all_, send_counts_, recv_counts_, send_sizes_, recv_sizes_;
  std::vector<std::uint32_t> verdicts_;
  comm::traffic traffic_;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
