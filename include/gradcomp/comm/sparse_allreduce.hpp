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
#include <functional>
#include <optional>
#include <string>
#include <string_view>
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
///    in its memory, so that no gradient mass is lost.
///
/// `Comm` is the transport (comm/transport.hpp) in the compressor's memory. The local
/// work of both collectives runs where that memory is (detail/comm/region_sums.hpp,
/// detail/comm/global_topk.hpp), and every collective moves that memory, at sizes the
/// ranks agreed before the step: the first all-gathers each rank's frame (its verdict on
/// its arguments and its step, and a digest of its settings: detail::sized_frame), the entries
/// travel in blocks of an agreed room (an all-to-all of equal parts, each block headed by
/// how many entries its sender had for the region), and the selection's parts in an
/// agreed capacity. The host reads once, at the end: every rank's frame and record (its
/// region's checks and the most entries a rank had for it), the selection and the next
/// step's regions. Where blocks or parts outgrew their room (the first step; a selection
/// that grows), nothing was added, and the exchange runs again at once with room for
/// them (an eighth more and 16), agreed as it grows; sizes that the ranks' needs fell far
/// below shrink to them. (queue_step and queue_reduce_scatter read nothing before their
/// settle: their blocks and parts carry what fits, and what did not stays in the
/// sender's memory.) Every rank makes the same call (step or
/// stage, or reduce_scatter) with an exchange that took part in the same steps as the others' (or one that has agreed
/// no sizes yet, or forgot them: forget_agreed_sizes()). `grad`, `dense` and `shard` are in the compressor's memory
/// (std::span, device_span).
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
    const auto ranks = static_cast<std::size_t>(comm.size());
    // What the collectives move at the sizes agreed at first (blocks of a header only,
    // no gather): held from now on, so that a rank whose step fails can take part.
    grow(packed_, ranks);
    grow(received_on_, ranks);
    grow(bins_, top_bins + 1 + 3);
    grow(fault_, 3);
    outcome_ = compressor.backend().template allocate<std::uint32_t>(slots_at());
    forget_agreed_sizes();
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
                                       std::string_view who_agrees = "sparse_allreduce") {
    queue(grad, dense, scale, also, who_agrees);
    return settle_now();
  }

  /// stage() up to its one read: everything queued where the memory is, the outcome
  /// (outcome()) left for the caller to read, with other exchanges' outcomes, before it
  /// calls settle(). `grad` and `dense` must stay valid until settle() returns.
  /// \throws gradcomp::error only where this rank cannot queue (nothing staged then):
  ///         the errors step() raises alike on every rank come from settle().
  template <gradient_view<backend_type> Grad>
  void queue(const Grad& grad, view<float> dense, float scale, std::span<const detail::setting> also = {},
             std::string_view who_agrees = "sparse_allreduce") {
    queue_selection(grad, dense, scale, also, who_agrees, kind::selection);
  }

  /// step() with nothing read by the host (HSDP's all-reduce across replicas, settled
  /// once a backward pass): `dense` is added to as queued, predicated on the ranks'
  /// verdict reduced where the memory is (nothing added where the ranks refuse the
  /// step; nothing either where this rank's own arguments are refused), and the outcome
  /// (outcome()) is left for the caller to read, with other exchanges' outcomes, before
  /// it calls settle(), which commits the step or throws. Nothing runs again: where a
  /// rank has more entries for a region than the blocks agreed hold, its block carries
  /// the first of them (the lowest indices), and where a region's part of the selection
  /// outgrows the gather's capacity, the part carries its lowest indices; the selection
  /// is then the global top-k of what the blocks carried, cut to what the parts carried,
  /// and settle() commits of each rank's step only the selected entries its blocks
  /// carried (the rest stays in its memory, its error feedback, for the next step). The
  /// room and the capacity grow at settle(), by an agreement among the ranks (its only
  /// collective; where a rank cannot allocate them, every rank keeps what it had). A
  /// rank whose exchange has no sizes agreed yet (sizes_agreed()) carries nothing: its
  /// first call is best step(). `grad` need not outlive the call (a NaN in it is
  /// reported without its index); `dense` is written when this returns, on the
  /// compressor's stream on a device backend.
  /// \throws gradcomp::error only where this rank cannot queue (nothing staged then):
  ///         the errors step() raises alike on every rank come from settle().
  template <gradient_view<backend_type> Grad>
  void queue_step(const Grad& grad, view<float> dense, float scale) {
    queue_selection(grad, dense, scale, {}, "sparse_allreduce", kind::selection_queued);
  }

  /// The bytes queue() left for the host to read, in the compressor's memory.
  /// \throws gradcomp::error (invalid_argument) if no exchange is queued.
  [[nodiscard]] view<const std::byte> outcome() const {
    detail::require(queued_.has_value(), errc::invalid_argument, who, ": outcome without a queued exchange");
    return {reinterpret_cast<const std::byte*>(outcome_.data()), 4 * outcome_words()};
  }

  /// Completes the exchange queue() (or queue_step(), queue_reduce_scatter()) queued,
  /// from its outcome as the host read it: throws as step() does, or where blocks or
  /// parts outgrew their room runs queue()'s again at once (reading its outcome itself);
  /// queue_step()'s and queue_reduce_scatter()'s are committed here, of what they sent,
  /// and grow their room where it was outgrown.
  /// \returns the global selection, as stage() (nothing for a reduce-scatter; where
  ///          queue_step()'s parts carried what fit, what they carried)
  /// \throws gradcomp::error as step() (or reduce_scatter()) does (nothing staged then);
  ///         (invalid_argument) if
  ///         no exchange is queued or `outcome` is not outcome()'s size.
  std::span<const std::uint32_t> settle(std::span<const std::byte> outcome) {
    detail::require(queued_.has_value(), errc::invalid_argument, who, ": settle without a queued exchange");
    return settle_with([&] {
      const std::size_t words = outcome_words();
      detail::require(outcome.size() == 4 * words, errc::invalid_argument, who, ": settle: the outcome has ",
                      outcome.size(), " bytes, not ", 4 * words);
      outcome_host_.resize(words);
      std::memcpy(outcome_host_.data(), outcome.data(), outcome.size());
      return std::span<const std::uint32_t>(outcome_host_);
    });
  }
  /// Commits of the compressor's staged step what the global selection kept (read where
  /// the selection arrived: nothing is copied to a device).
  /// \throws gradcomp::error (invalid_argument) if no step is staged.
  void accept_staged() {
    compressor_.accept_staged(view<const std::uint32_t>(outcome_.data() + slots_at(), selected_));
  }
  /// Drops the compressor's staged step, and an exchange queued and not settled (the
  /// regions its selection cut for the next step on the device put back as they were).
  void drop_staged() noexcept {
    compressor_.drop_staged();
    if (queued_.has_value() && !queued_->scatter) {
      try {
        compressor_.backend().to_device(bounds_.data(), bounds_.size(), outcome_.data());
      } catch (...) {  // a device that cannot copy: this exchange's steps fail alike from now on
      }
    }
    queued_.reset();
  }

  /// A sparse reduce-scatter (FSDP's, gradcomp.torch.fsdp): the n indices are cut into W
  /// equal shards (n a multiple of W), rank j owning [j·n/W, (j+1)·n/W); each rank sends
  /// each shard's entries of its step to the shard's owner (steps 1-2 above), which
  /// writes `shard[i - j·n/W] = scale * s_i` for the sums of its shard and 0 elsewhere.
  /// There is no global selection: every rank commits its whole step. Where a rank had
  /// more entries for a shard than the blocks hold, the exchange runs again at once with
  /// room for them. On a device backend the shard's write and the commit are queued on
  /// the compressor's stream (its backend's) when this returns: work on another stream
  /// waits for it.
  /// \throws gradcomp::error on every rank alike, changing no compressor and no shard, if
  ///         n is not a multiple of W or shard.size() != n / W on any rank, `scale` is not
  ///         finite, a step is rejected, what a rank received is corrupt, a sum overflows,
  ///         a rank cannot allocate its workspace, or the ranks disagree on n or the
  ///         policies.
  template <gradient_view<backend_type> Grad>
  void reduce_scatter(const Grad& grad, view<float> shard, float scale) {
    queue_scatter(grad, shard, scale, kind::scatter_now);
    (void)settle_now();
  }

  /// reduce_scatter() with nothing read by the host: the shard's write is queued where
  /// the memory is, predicated on the ranks' verdict reduced there (the sums where every
  /// rank's step passed, zeros where the ranks refused it or a sum overflowed; left as it
  /// is where this rank's own arguments are refused), and the outcome (outcome()) is left
  /// for the caller to read, with other exchanges' outcomes, before it calls settle(),
  /// which commits the step or throws. Where a rank has more entries for a shard than the
  /// blocks agreed hold, the blocks carry the first of them (the lowest indices) and no
  /// more, nothing runs again, and settle() commits only what was sent: the rest stays in
  /// the rank's memory (its error feedback) for the next step, and the room grows (by an
  /// agreement among the ranks, settle()'s only collective; where a rank cannot allocate
  /// it, every rank keeps the room it had). A rank whose exchange has no sizes agreed yet
  /// (sizes_agreed()) sends nothing but the counts: its first call is best
  /// reduce_scatter(). `grad` need not outlive the call (a NaN in it is reported without
  /// its index); `shard` is written when this returns, on the compressor's stream on a
  /// device backend.
  /// \throws gradcomp::error only where this rank cannot queue (nothing staged then):
  ///         the errors reduce_scatter() raises alike on every rank come from settle().
  template <gradient_view<backend_type> Grad>
  void queue_reduce_scatter(const Grad& grad, view<float> shard, float scale) {
    queue_scatter(grad, shard, scale, kind::scatter_queued);
  }

  /// Whether the ranks agreed the sizes the collectives move (after a first step, until
  /// forget_agreed_sizes()).
  [[nodiscard]] bool sizes_agreed() const noexcept { return agreed_; }

  /// Makes the exchange forget the sizes its collectives move (the blocks' room, the
  /// gather's capacity) and the regions, as the ranks last agreed them: its next step
  /// runs again until they fit (three times for step(), twice for reduce_scatter()). For a caller that cannot tell
  /// whether every rank's exchange took part in the same steps (a DDP hook after a refused step, where one rank may
  /// have made its exchange anew); every rank must call it alike.
  void forget_agreed_sizes() {
    room_ = 0;
    capacity_ = 0;
    agreed_ = false;
    const auto ranks = static_cast<std::uint64_t>(comm_.size());
    bounds_.clear();
    for (std::uint64_t j = 0; j <= ranks; ++j) {
      bounds_.push_back(static_cast<std::uint32_t>(j * compressor_.size() / ranks));
    }
    // The regions in the compressor's memory too, where the step finds its region starts.
    compressor_.backend().for_each(bounds_.size(),
                                   detail::region_sums::equal_regions{compressor_.size(), ranks, outcome_.data()});
  }

  /// Gives back the exchange's workspace (memory_bytes() but what its collectives move at
  /// the sizes agreed: the message, the region's sums and the selection's lists) and the
  /// compressor's (compressor::release_workspace), until the next step allocates them
  /// again; the regions, which the next step takes from this one's selection, stay, with
  /// the selection's indices. For exchanges that take turns (FSDP's parameter groups), so
  /// that they hold one workspace at a time. The selection step() returned is given back
  /// too.
  /// \throws gradcomp::error (invalid_argument) while the compressor's step is staged
  ///         (accept_staged() reads the selection); nothing changes then.
  void release_workspace() {
    compressor_.release_workspace();
    const auto give_back = [](auto&... v) { ((v = std::remove_reference_t<decltype(v)>{}), ...); };
    give_back(message_, starts_, region_sums_, shards_, list_, chosen_, ties_, compaction_, values_, kept_);
    give_back(outcome_host_);
    listed_ = 0;
    selected_ = 0;
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
                              ties_, bins_, compaction_, part_, gathered_, values_, kept_, outcome_, outcome_host_,
                              bounds_, send_sizes_);
  }

 private:
  static constexpr const char* who = "sparse_allreduce";
  using selection = detail::global_topk::selection;
  using record = detail::global_topk::record;
  static constexpr std::size_t record_words = sizeof(record) / 4;
  static constexpr std::size_t frame_words = detail::sized_frame::size / 4;
  static_assert(detail::sized_frame::size % 4 == 0);

  // outcome_, in uint32 words: the step's regions (W + 1, kept from step to step), every
  // rank's record and frame (all-gathered), the selection's state, this rank's record,
  // frame and count of entries sent, where each rank's part starts in the selection
  // (W + 1), then the selection's k index slots. The host reads it once per step, up to
  // the slots (and the slots).
  [[nodiscard]] std::size_t ranks() const noexcept { return static_cast<std::size_t>(comm_.size()); }
  [[nodiscard]] std::size_t records_at() const noexcept { return ranks() + 1; }
  [[nodiscard]] std::size_t frames_at() const noexcept { return records_at() + ranks() * record_words; }
  [[nodiscard]] std::size_t selection_at() const noexcept { return frames_at() + ranks() * frame_words; }
  [[nodiscard]] std::size_t mine_at() const noexcept { return selection_at() + sizeof(selection) / 4; }
  [[nodiscard]] std::size_t own_frame_at() const noexcept { return mine_at() + record_words; }
  [[nodiscard]] std::size_t sent_at() const noexcept { return own_frame_at() + frame_words; }
  [[nodiscard]] std::size_t starts_at() const noexcept { return sent_at() + 2; }
  [[nodiscard]] std::size_t fitted_at() const noexcept { return starts_at() + ranks() + 1; }
  [[nodiscard]] std::size_t carried_at() const noexcept { return fitted_at() + ranks() + 1; }
  [[nodiscard]] std::size_t slots_at() const noexcept { return carried_at() + ranks() + 1; }
  std::byte* bytes_at(std::size_t word) noexcept { return reinterpret_cast<std::byte*>(outcome_.data() + word); }

  // What an exchange computes: the global selection, run again at once where blocks or
  // parts outgrew their room (step, stage, queue) or carrying what fits (queue_step), or
  // the shards of a reduce-scatter, likewise (reduce_scatter, queue_reduce_scatter).
  enum class kind { selection, selection_queued, scatter_now, scatter_queued };

  // The exchange a step queued, from its arguments to its outcome's read.
  struct queued {
    bool scatter = false;   // a reduce-scatter's (no global selection)
    bool deferred = false;  // queue_step's, queue_reduce_scatter's: blocks (and parts) carry what fits
    // The faults that stop the adds: every fault, or, where blocks carry what fits, a
    // corrupt block only.
    std::uint32_t stops = detail::region_sums::corrupt | detail::region_sums::outgrown;
    std::size_t room = 0;  // the blocks' room of its last run (room_ then)
    view<float> out;       // dense, or the shard
    float scale = 0;
    std::size_t k = 0;  // the global selection's size
    std::vector<detail::setting> settings;
    std::string who;                              // whose settings they are, as a disagreement names them
    detail::rank_draft mine;                      // this rank's verdict; its step staged where it says no error
    const detail::step_status* status = nullptr;  // the staged step's
    std::uint32_t begin = 0, end = 0;             // this rank's region
    std::function<void()> raise_non_finite;       // the staged step's error, where its status met a NaN
    int reruns = 0;
  };

  // queue() or queue_step() (`how`).
  template <class Grad>
  void queue_selection(const Grad& grad, view<float> dense, float scale, std::span<const detail::setting> also,
                       std::string_view who_agrees, kind how) {
    const std::size_t n = compressor_.size();
    const std::size_t k = this->k();
    std::vector<detail::setting> settings{{"n", n}, {"k", k}, {"the policies", policies_}};
    settings.insert(settings.end(), also.begin(), also.end());
    queue_exchange(grad, dense, scale, how, std::move(settings), who_agrees, [&] {
      detail::require(dense.size() == n, errc::invalid_argument, who, ": dense.size() = ", dense.size(),
                      " does not match n = ", n);
      detail::require(std::isfinite(scale), errc::invalid_argument, who, ": scale must be finite, got ", scale);
      grow_outcome(k);
      grow(values_, k);
      return static_cast<const std::uint32_t*>(outcome_.data());
    });
  }

  // reduce_scatter() or queue_reduce_scatter() (`how`) up to the read.
  template <class Grad>
  void queue_scatter(const Grad& grad, view<float> shard, float scale, kind how) {
    const std::size_t n = compressor_.size();
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const backend_type& be = compressor_.backend();
    queue_exchange(grad, shard, scale, how, {{"n", n}, {"the policies", policies_}}, who, [&] {
      detail::require(n % ranks == 0, errc::invalid_argument, who, ": reduce_scatter needs n = ", n,
                      " to be a multiple of the ranks, ", ranks);
      detail::require(shard.size() == n / ranks, errc::invalid_argument, who, ": shard.size() = ", shard.size(),
                      " does not match n / ranks = ", n / ranks);
      detail::require(std::isfinite(scale), errc::invalid_argument, who, ": scale must be finite, got ", scale);
      grow(shards_, ranks + 1);
      be.for_each(ranks + 1, detail::region_sums::equal_regions{n, ranks, shards_.data()});
      return static_cast<const std::uint32_t*>(shards_.data());
    });
  }

  // The queued exchange settled from its outcome as `read()` gives it: every rank
  // returns, or every rank throws alike and nothing is staged.
  template <class Read>
  std::span<const std::uint32_t> settle_with(Read&& read) {
    try {
      const auto selected = settle_outcome(read());
      queued_.reset();
      return selected;
    } catch (...) {
      queued_.reset();
      compressor_.drop_staged();
      throw;
    }
  }
  // The queued exchange's outcome read now and settled.
  std::span<const std::uint32_t> settle_now() {
    return settle_with([&] { return read_outcome(); });
  }

  // This rank's draft (its checks, its workspace, its step staged with where each
  // region's entries start in its selection: `prepare`, the caller's checks and growth,
  // returns the regions' W + 1 bounds in the compressor's memory), then the exchange's
  // collectives; nothing staged where this throws.
  template <class Grad, class Prepare>
  void queue_exchange(const Grad& grad, view<float> out, float scale, kind how, std::vector<detail::setting> settings,
                      std::string_view who_agrees, Prepare&& prepare) {
    try {
      queue_draft(grad, out, scale, how, std::move(settings), who_agrees, prepare);
      exchange();
    } catch (...) {
      queued_.reset();
      compressor_.drop_staged();
      throw;
    }
  }
  template <class Grad, class Prepare>
  void queue_draft(const Grad& grad, view<float> out, float scale, kind how, std::vector<detail::setting> settings,
                   std::string_view who_agrees, Prepare& prepare) {
    const backend_type& be = compressor_.backend();
    const std::size_t n = compressor_.size();
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    traffic_ = {};
    queued_.emplace();
    queued& q = *queued_;
    const bool scatter = how == kind::scatter_now || how == kind::scatter_queued;
    q.scatter = scatter;
    q.deferred = how == kind::selection_queued || how == kind::scatter_queued;
    if (q.deferred) q.stops = detail::region_sums::corrupt;
    q.out = out;
    q.scale = scale;
    q.k = scatter ? 0 : k();
    q.who = who_agrees;
    q.settings = std::move(settings);
    q.settings.emplace_back("the sizes the collectives move", sizes_fingerprint());
    q.begin = scatter ? static_cast<std::uint32_t>(me * (n / ranks())) : bounds_[me];
    q.end = scatter ? static_cast<std::uint32_t>((me + 1) * (n / ranks())) : bounds_[me + 1];
    q.mine = detail::draft(q.who.c_str(), q.settings, [&]() -> std::uint64_t {
      const std::uint32_t* regions = prepare();
      // The workspace of this rank's own passes (what the collectives move is held).
      const std::size_t region = q.end - q.begin;
      const std::size_t listed = std::min(region, ranks() * room_);
      grow(starts_, ranks() + 1);
      grow(region_sums_, region);
      if (!scatter) {
        if (listed > listed_) {
          for (auto* b : {&list_, &chosen_, &ties_}) grow(*b, listed);
          listed_ = listed;
        }
        grow(compaction_, compaction_bytes(region));  // the lists are no longer than the region
      }
      const auto message = message_out();
      q.status = compressor_.stage_queued(be, grad, message);
      if (q.deferred) {  // `grad` is gone by the settle: the error without its index
        q.raise_non_finite = [] {
          detail::fail(errc::non_finite, "compress: grad (or its error feedback) holds a NaN or infinity");
        };
      } else {
        q.raise_non_finite = [this, grad, message] {
          (void)compressor_.staged_message(compressor_.backend(), grad, message);
        };
      }
      const auto sent = compressor_.staged_selection();
      if (q.deferred) grow(kept_, scatter ? sent.index.size() : q.k);  // what it may commit, listed
      be.for_each(ranks() + 1, detail::region_sums::region_starts{detail::raw(sent.index).data(), q.status, regions,
                                                                  starts_.data()});
      return 0;
    });
  }

  // The queued exchange's collectives at the sizes agreed, and the local passes between
  // them where this rank's draft passed (a rank whose draft failed takes part in every
  // collective, sending nothing but its frame).
  void exchange() {
    namespace sums = detail::region_sums;
    queued& q = *queued_;
    const backend_type& be = compressor_.backend();
    const std::size_t ranks = this->ranks();
    bool ok = q.mine.report.code == 0;

    // 1. The frames: every rank's verdict, its step's status among it, and the sizes
    // (the room + 1 and the capacity, or 0 and 0 from an exchange whose sizes are not
    // agreed).
    const std::uint64_t sizes[2] = {agreed_ ? room_ + 1 : 0, agreed_ ? capacity_ : 0};
    be.for_each(detail::sized_frame::size, detail::sized_frame_byte{q.mine.report.code,
                                                                    q.mine.verdict.digest,
                                                                    ok ? q.status : nullptr,
                                                                    nullptr,
                                                                    {sizes[0], sizes[1]},
                                                                    bytes_at(own_frame_at())});
    comm_.all_gather(view<const std::byte>(bytes_at(own_frame_at()), detail::sized_frame::size),
                     view<std::byte>(bytes_at(frames_at()), ranks * detail::sized_frame::size));
    note(detail::sized_frame::size, (ranks - 1) * detail::sized_frame::size);
    if (!agreed_ && take_agreed_sizes()) ok = false;  // it takes part only: its settings' digest differs
    q.room = room_;                                   // what the blocks below hold, as its settle reads them

    // 2. The entries, in blocks of the room agreed, each checked and summed by its
    // region's owner in rank order.
    const std::size_t block = room_ + 1;
    if (ok) {
      const auto sent = compressor_.staged_selection();
      be.for_each(ranks * block,
                  sums::pack_blocks<sparse_entry>{detail::raw(sent.index).data(), detail::raw(sent.values).data(),
                                                  starts_.data(), q.status, room_, packed_.data()});
      be.for_each(1, sums::entries_sent{starts_.data(), ranks, room_, outcome_.data() + sent_at()});
      if (q.scatter) be.for_each(1, sums::kept_starts{starts_.data(), ranks, room_, outcome_.data() + starts_at()});
    } else {
      be.clear(packed_.data(), ranks * block);
    }
    send_sizes_.assign(ranks, sizeof(sparse_entry) * block);
    comm_.all_to_all_v(
        view<const std::byte>(reinterpret_cast<const std::byte*>(packed_.data()), ranks * block * 8), send_sizes_,
        view<std::byte>(reinterpret_cast<std::byte*>(received_on_.data()), ranks * block * 8), send_sizes_);
    note((ranks - 1) * block * sizeof(sparse_entry), (ranks - 1) * block * sizeof(sparse_entry));
    std::uint32_t* checked = fault_.data();
    std::uint32_t* summed = fault_.data() + 1;
    be.clear(fault_.data(), 3);
    const sparse_entry* received = received_on_.data();
    if (ok) {
      be.for_each(q.end - q.begin, sums::mark_unsent{region_sums_.data()});
      be.reduce_or(ranks * block, sums::block_faults<sparse_entry>{received, room_, q.begin, q.end}, checked);
      be.reduce_max(ranks, sums::header_count<sparse_entry>{received, room_}, fault_.data() + 2);
      for (std::size_t r = 0; r < ranks; ++r) {
        be.for_each(room_, sums::add_block<sparse_entry>{received + r * block, room_, q.begin, checked, q.stops,
                                                         region_sums_.data()});
      }
      be.reduce_or(ranks * block,
                   sums::sum_faults<sparse_entry>{received, room_, q.begin, checked, q.stops, region_sums_.data()},
                   summed);
    }
    if (q.scatter) {
      std::uint32_t* classes = bins_.data() + top_bins + 1;
      be.clear(classes, 3);
      gather_records(ok);
      std::uint32_t* refused = &reinterpret_cast<selection*>(outcome_.data() + selection_at())->refused;
      be.for_each(1, detail::global_topk::scatter_verdict{
                         reinterpret_cast<const record*>(outcome_.data() + records_at()), ranks, bytes_at(frames_at()),
                         q.mine.verdict.digest, q.stops | detail::region_sums::overflow, refused});
      // Where this rank's arguments passed, the shard is its own to write (a queued one now).
      if (q.deferred && q.mine.report.code == 0) write_shard();
      return;
    }
    select_globally(ok);
  }

  // An exchange whose sizes are not agreed (a new one, one that forgot them) reads the
  // frames (once): where another rank's exchange sent sizes it agreed on, this one takes
  // part in the collectives at those sizes (and returns true); its frame's digest (of
  // sizes not agreed) makes every rank refuse the step alike. Where none did, every
  // rank's exchange runs at the first sizes, none. (The buffers grown here for another's
  // sizes come after the frames, where a failure would leave the others waiting: this is
  // the path of a rank whose exchange is new beside agreed ones, which the DDP hook never
  // takes, forgetting every rank's sizes alike.)
  bool take_agreed_sizes() {
    const std::size_t ranks = this->ranks();
    std::vector<std::byte> frames(ranks * detail::sized_frame::size);
    compressor_.backend().to_host(static_cast<const std::byte*>(bytes_at(frames_at())), frames.size(), frames.data());
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::byte* sizes = frames.data() + r * detail::sized_frame::size + detail::sized_frame::sizes_at;
      const auto room_plus_one = detail::load_le<std::uint64_t>(sizes);
      if (room_plus_one == 0) continue;  // sizes not agreed
      // No more than the compressor's n: larger sizes come only from a broken transport.
      const std::size_t n = compressor_.size();
      room_ = static_cast<std::size_t>(std::min<std::uint64_t>(room_plus_one - 1, n));
      capacity_ = static_cast<std::size_t>(std::min<std::uint64_t>(detail::load_le<std::uint64_t>(sizes + 8), n));
      grow(packed_, ranks * (room_ + 1));
      grow(received_on_, ranks * (room_ + 1));
      grow(part_, capacity_);
      grow(gathered_, ranks * capacity_);
      return true;
    }
    room_ = 0;  // every rank's exchange runs at the first sizes
    capacity_ = 0;
    agreed_ = true;
    return false;
  }

  // Step 3: the exact global top-k of |sum|, ties to the lower index, where the sums
  // are: this region's sums listed; the k-th largest key over all ranks, digit by digit;
  // the ties it leaves split in rank (= index) order; each rank's part gathered in the
  // capacity agreed and assembled in rank order; then added to dense and cut into the
  // next regions, each where the selection is usable.
  void select_globally(bool ok) {
    namespace top = detail::global_topk;
    queued& q = *queued_;
    const backend_type& be = compressor_.backend();
    const std::size_t ranks = this->ranks();
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    const std::size_t region = q.end - q.begin;
    const std::size_t listed = std::min(region, ranks * room_);
    std::uint32_t* words = outcome_.data();
    auto* at = reinterpret_cast<selection*>(words + selection_at());
    const float* sums = region_sums_.data();
    const std::uint32_t* list = list_.data();
    if (ok) {
      be.clear(at, 1);
      if (region != 0) be.compact(region, top::is_sent{sums}, list_.data(), compaction(), &at->sums);
    }
    std::uint32_t* bins = bins_.data();
    for (std::size_t d = 0; d < detail::collective_digits.size(); ++d) {
      const auto [shift, bits] = detail::collective_digits[d];
      const std::size_t count = (std::size_t{1} << bits) + (d == 0 ? 1 : 0);  // the first carries the total
      be.clear(bins, count);
      if (ok) {
        be.histogram(listed, top::digit_bin{sums, list, at, shift, bits}, bins);
        if (d == 0) be.for_each(1, top::count_in_bin{at, bins + count - 1});
      }
      comm_.all_reduce_sum(view<std::uint32_t>(bins, count), compressor_.size());  // disjoint regions: <= n
      note(4 * count, 4 * count);
      if (ok) be.for_each(1, top::pick_digit{bins, shift, bits, d == 0, q.k, at});
    }
    std::uint32_t* classes = bins + top_bins + 1;
    be.clear(classes, 3);
    if (ok) be.histogram(listed, top::key_class{sums, list, at}, classes);
    gather_records(ok);
    std::uint32_t* starts = words + starts_at();
    std::uint32_t* fitted = q.deferred ? words + fitted_at() : starts;  // where the parts gathered start
    const std::size_t placed = std::min(q.k, capacity_);                // what a part holds (no more than k)
    if (ok) {
      be.for_each(
          1, top::split_ties{reinterpret_cast<const record*>(words + records_at()), ranks, me, bytes_at(frames_at()),
                             q.mine.verdict.digest, q.deferred ? ~detail::region_sums::outgrown : ~0u, at, starts});
      if (listed != 0) {
        be.compact(listed, top::is_tie{sums, list, at}, ties_.data(), compaction(), &at->tie_count);
        be.for_each(1, top::last_tie{ties_.data(), at});
        be.compact(listed, top::is_selected{sums, list, at}, chosen_.data(), compaction(), &at->chosen);
      }
      if (q.deferred) {  // the parts carry what fits: the selection is what they carry
        be.for_each(1, top::fit_parts{starts, ranks, capacity_, at, fitted});
      } else {
        be.for_each(1, top::parts_fit{starts, ranks, capacity_, at});
      }
      be.for_each(listed,
                  top::place<sparse_entry>{chosen_.data(), &at->chosen, list, sums, q.begin, placed, part_.data()});
    } else if (capacity_ != 0) {
      be.clear(part_.data(), capacity_);
    }
    if (capacity_ != 0) {
      const std::size_t bytes = capacity_ * sizeof(sparse_entry);
      comm_.all_gather(view<const std::byte>(reinterpret_cast<const std::byte*>(part_.data()), bytes),
                       view<std::byte>(reinterpret_cast<std::byte*>(gathered_.data()), ranks * bytes));
      note(bytes, (ranks - 1) * bytes);
    }
    if (!ok) return;
    std::uint32_t* slots = words + slots_at();
    if (capacity_ != 0) {
      be.for_each(ranks * capacity_,
                  top::assemble<sparse_entry>{gathered_.data(), capacity_, q.k, fitted, at, slots, values_.data()});
    }
    be.reduce_or(q.k, top::selection_faults{slots, values_.data(), compressor_.size(), at}, &at->broken);
    be.for_each(q.k, top::add_selection{slots, values_.data(), at, q.scale, detail::raw(q.out).data()});
    be.for_each(ranks + 1, top::next_regions{slots, ranks, compressor_.size(), at, words});
    if (q.deferred) {  // what of the selection this rank's blocks carried, for settle's commit
      const auto sent = compressor_.staged_selection();
      be.for_each(1, top::kept_parts{detail::raw(sent.index).data(), starts_.data(), room_, slots, fitted, ranks, at,
                                     words + carried_at()});
      if (capacity_ != 0) {
        be.for_each(ranks * capacity_, top::keep_carried{slots, fitted, words + carried_at(), capacity_, kept_.data()});
      }
    }
  }

  // Every rank's record (its region's checks and the most entries a rank had for it;
  // with its share of the selection where there is one), all-gathered.
  void gather_records(bool ok) {
    const backend_type& be = compressor_.backend();
    const std::size_t ranks = this->ranks();
    auto* mine = reinterpret_cast<record*>(outcome_.data() + mine_at());
    if (ok) {
      be.for_each(1, detail::global_topk::record_of{bins_.data() + top_bins + 1, fault_.data(), mine});
    } else {
      be.clear(mine, 1);
    }
    comm_.all_gather(view<const std::byte>(reinterpret_cast<const std::byte*>(mine), sizeof(record)),
                     view<std::byte>(bytes_at(records_at()), ranks * sizeof(record)));
    note(sizeof(record), (ranks - 1) * sizeof(record));
  }

  // What the host reads of outcome_: up to the slots, and the k index slots of a step
  // whose draft passed (which grew outcome_ to hold them).
  [[nodiscard]] std::size_t outcome_words() const {
    const queued& q = *queued_;
    return slots_at() + (q.mine.report.code == 0 ? q.k : 0);
  }
  // outcome_ read into outcome_host_.
  std::span<const std::uint32_t> read_outcome() {
    const std::size_t words = outcome_words();
    outcome_host_.resize(words);
    compressor_.backend().to_host(static_cast<const std::uint32_t*>(outcome_.data()), words, outcome_host_.data());
    return outcome_host_;
  }

  // The queued exchange settled from its outcome, read: every rank judges the same
  // frames, records and selection, and throws alike, runs the exchange again with room
  // for what outgrew it, or returns the selection.
  std::span<const std::uint32_t> settle_outcome(std::span<const std::uint32_t> read) {
    queued& q = *queued_;
    const std::size_t ranks = this->ranks();
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    const auto* frames = reinterpret_cast<const std::byte*>(read.data() + frames_at());
    std::vector<std::byte> verdicts(ranks * detail::rank_verdict::size);
    for (std::size_t r = 0; r < ranks; ++r) {
      std::memcpy(verdicts.data() + r * detail::rank_verdict::size, frames + r * detail::sized_frame::size,
                  detail::rank_verdict::size);
    }
    if (q.mine.report.code == 0 &&
        detail::rank_verdict::read(verdicts.data() + me * detail::rank_verdict::size).code != 0) {
      // The step's status met a NaN or infinity: its error, read now (the step is dropped).
      q.mine = detail::draft(who, q.settings, [&]() -> std::uint64_t {
        q.raise_non_finite();
        detail::fail(errc::invalid_argument, who, ": a step's status said a value was not finite; it is not");
      });
    }
    (void)detail::settle(comm_, q.who.c_str(), q.mine, verdicts);
    traffic_.entries = read[sent_at() + 1];  // what its blocks carried

    // The ranks' drafts passed alike: each reads the same records.
    std::vector<record> records(ranks);
    std::memcpy(records.data(), read.data() + records_at(), ranks * sizeof(record));
    std::uint64_t largest = 0;
    std::vector<std::uint32_t> faults(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      faults[r] = records[r].fault;
      largest = std::max<std::uint64_t>(largest, records[r].largest);
    }
    raise_faults(faults);
    const bool blocks_outgrown = largest > q.room;
    if (q.scatter) {
      if (blocks_outgrown && !q.deferred) return again(largest, capacity_);
      commit_scatter(read[sent_at()], read[starts_at() + ranks]);
      fit_room(blocks_outgrown, largest, capacity_, capacity_);
      return {};
    }
    selection state{};
    std::memcpy(&state, read.data() + selection_at(), sizeof(state));
    std::uint64_t longest = 0;  // the largest part, the same on every rank
    for (std::size_t r = 0; r < ranks; ++r) {
      longest = std::max<std::uint64_t>(longest, read[starts_at() + r + 1] - read[starts_at() + r]);
    }
    if (blocks_outgrown && !q.deferred) return again(largest, capacity_);  // the parts came from partial sums
    detail::require(longest <= q.k, errc::corrupt_message, who, ": a rank's part of the selection exceeds k = ", q.k);
    if (state.outgrown != 0) return again(room_, longest);  // never where the parts carry what fits
    detail::require(state.refused == 0, errc::corrupt_message, who, ": a rank's record holds a fault it cannot have");
    detail::require(state.broken == 0, errc::corrupt_message, who, ": the gathered global selection is corrupt");
    bounds_.assign(read.begin(), read.begin() + static_cast<std::ptrdiff_t>(ranks + 1));
    selected_ = state.take;
    if (q.deferred) {  // of its step, the selected entries its blocks carried
      compressor_.accept_staged(view<const std::uint32_t>(kept_.data(), read[carried_at() + ranks]));
      fit_room(blocks_outgrown || longest > capacity_, largest,
               longest > capacity_ ? std::min(q.k, roomy(longest)) : capacity_,
               std::min(q.k, shrunk(capacity_, longest)));
    } else {
      room_ = shrunk(room_, largest);
      capacity_ = std::min(q.k, shrunk(capacity_, longest));
      agreed_ = true;
    }
    return read.subspan(slots_at(), selected_);
  }

  // After a committed step that carried what fit (queue_step, queue_reduce_scatter): the
  // room and the capacity grown where a block or part was `outgrown` (to `largest` in a
  // block, and to `capacity`), agreed among the ranks, or shrunk to what the ranks
  // needed (`largest`, `fewer`) where they fell far below it.
  void fit_room(bool outgrown, std::size_t largest, std::size_t capacity, std::size_t fewer) {
    const queued& q = *queued_;
    agreed_ = true;
    if (!outgrown) {
      room_ = shrunk(q.room, largest);
      capacity_ = fewer;
      return;
    }
    try {
      grow_agreed(largest > q.room ? roomy(largest) : q.room, capacity);
    } catch (const error& e) {
      // A rank could not allocate them (errc::device, raised alike on every rank by the
      // agreement): every rank keeps what it had, the step committed, and the next call
      // carries what fits again and grows then.
      if (e.code() != errc::device) throw;
    }
  }

  // The exchange again, at once, with room for `room` entries in each block and
  // `capacity` in each part of the gather (an eighth more and 16 where they grow),
  // agreed as the ranks grow what their collectives move; twice at most (the blocks,
  // then the parts that came of their sums).
  std::span<const std::uint32_t> again(std::size_t room, std::size_t capacity) {
    queued& q = *queued_;
    detail::require(q.reruns < 2, errc::corrupt_message, who, ": the exchange outgrew the room it agreed on ",
                    "after running again with room for it");
    ++q.reruns;
    grow_agreed(room > room_ ? roomy(room) : room_, capacity > capacity_ ? std::min(q.k, roomy(capacity)) : capacity_);
    exchange();
    return settle_outcome(read_outcome());
  }

  // The blocks' room and the gather's capacity grown to `room` and `capacity`, agreed
  // as the ranks grow what their collectives move (every rank alike, or every rank
  // throws).
  void grow_agreed(std::size_t room, std::size_t capacity) {
    const queued& q = *queued_;
    const std::size_t ranks = this->ranks();
    const std::size_t region = q.end - q.begin;
    const std::size_t listed = q.scatter ? 0 : std::min(region, ranks * room);
    (void)detail::agree(comm_, who, {{"the blocks' room", room}, {"the gather's capacity", capacity}},
                        [&]() -> std::uint64_t {
                          grow(packed_, ranks * (room + 1));
                          grow(received_on_, ranks * (room + 1));
                          grow(part_, capacity);
                          grow(gathered_, ranks * capacity);
                          if (listed > listed_) {  // the lists grow with the room, as the draft grows them
                            for (auto* b : {&list_, &chosen_, &ties_}) grow(*b, listed);
                            listed_ = listed;
                          }
                          return 0;
                        });
    note(detail::rank_verdict::size, (ranks - 1) * detail::rank_verdict::size);
    room_ = room;
    capacity_ = capacity;
    agreed_ = true;
  }

  // The queued reduce-scatter's shard, written where the ranks' verdict (scatter_verdict)
  // passed, zeros where it refused.
  void write_shard() {
    const queued& q = *queued_;
    const auto* at = reinterpret_cast<const selection*>(outcome_.data() + selection_at());
    compressor_.backend().for_each(
        q.out.size(),
        detail::region_sums::write_shard{region_sums_.data(), q.scale, &at->refused, detail::raw(q.out).data()});
  }

  // The settled reduce-scatter's commit (its shard written first where it was not as it
  // was queued): the whole step where its blocks carried all `sent` entries, or the
  // `kept` its blocks carried, listed where they are (kept_starts, keep_sent), the rest
  // staying in the compressor's memory.
  void commit_scatter(std::size_t sent, std::size_t kept) {
    const queued& q = *queued_;
    if (!q.deferred) write_shard();
    if (kept == sent) return compressor_.accept_staged();
    const auto staged = compressor_.staged_selection();
    compressor_.backend().for_each(
        sent, detail::region_sums::keep_sent{detail::raw(staged.index).data(), starts_.data(),
                                             outcome_.data() + starts_at(), q.out.size(), q.room, kept_.data()});
    compressor_.accept_staged(view<const std::uint32_t>(kept_.data(), kept));
  }

  // Room for `need` entries, with an eighth more and 16, so that a size creeping up
  // does not make the exchange run again at every step.
  static std::size_t roomy(std::size_t need) noexcept { return need + need / 8 + 16; }
  // A size the ranks' needs fell far below shrinks to them (roomy): nothing allocated.
  static std::size_t shrunk(std::size_t size, std::size_t need) noexcept {
    return roomy(need) < size / 2 ? roomy(need) : size;
  }

  // Every rank raises alike for a rank's fault (`faults`: every rank's, in rank order).
  void raise_faults(std::span<const std::uint32_t> faults) const {
    const std::size_t ranks = faults.size();
    for (std::size_t r = 0; r < ranks; ++r) {
      detail::require((faults[r] & detail::region_sums::corrupt) == 0, errc::corrupt_message, who, ": rank ", r, " of ",
                      ranks, " received entries outside its region or out of order");
      detail::require((faults[r] & detail::region_sums::overflow) == 0, errc::invalid_argument, who, ": a sum in rank ",
                      r, " of ", ranks, "'s region overflows (not finite)");
    }
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
  // outcome_ with room for k indices, its regions kept (and the words only a step that
  // carries what fits writes zeroed, so that the host never reads what nothing wrote).
  void grow_outcome(std::size_t k) {
    const std::size_t words = slots_at() + k;
    if (static_cast<std::size_t>(outcome_.size()) >= words) return;
    auto grown = detail::allocate_scratch<std::uint32_t>(compressor_.backend(), words);
    compressor_.backend().for_each(bounds_.size(), detail::copy_elements<std::uint32_t>{outcome_.data(), grown.data()});
    compressor_.backend().clear(grown.data() + fitted_at(), slots_at() - fitted_at());
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

  // The sizes the collectives move and the regions, which every rank must hold alike,
  // and whether they are agreed: an exchange that takes part at another's sizes never
  // passes for one that agreed them.
  [[nodiscard]] std::uint64_t sizes_fingerprint() const {
    detail::fingerprint f;
    for (const std::uint32_t b : bounds_) f.add(b);
    return f.add(room_).add(capacity_).add(agreed_ ? 1 : 0).value();
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
  // blocks sent and received, the region's sums, the checks' words (the blocks', the
  // sums', the largest header count), reduce_scatter's shards, the global selection's
  // lists (the region's sums, the ties, the chosen), the histograms, the compactions'
  // workspace, and outcome_ (see records_at()).
  buffer<std::uint64_t> starts_;
  buffer<sparse_entry> packed_, received_on_;
  buffer<float> region_sums_;
  buffer<std::uint32_t> fault_, shards_, list_, chosen_, ties_, bins_;
  buffer<sparse_entry> part_, gathered_;  // this rank's part of the selection, every rank's as gathered
  buffer<float> values_;                  // the selection's sums, in slot order
  buffer<std::uint32_t> kept_;            // what a queued reduce-scatter's blocks carried of its selection
  buffer<std::byte> compaction_;
  buffer<std::uint32_t> outcome_;
  std::size_t room_ = 0;      // entries each block holds beside its header (the same on every rank)
  std::size_t capacity_ = 0;  // entries of each part of the selection's gather (the same on every rank)
  bool agreed_ = false;       // whether every rank's exchange holds room_ and capacity_ (and the regions) alike
  std::size_t listed_ = 0;    // entries the global selection's lists hold
  std::size_t selected_ = 0;  // the last step's global selection's size
  std::uint64_t policies_;
  std::vector<std::uint32_t> bounds_;  // the W + 1 region bounds, as outcome_ holds them
  std::vector<std::uint32_t> outcome_host_;
  std::vector<std::uint64_t> send_sizes_;
  std::optional<queued> queued_;
  comm::traffic traffic_;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
