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
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/detail/core/wire.hpp>
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
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cyclic {

/// *refused = whether the exchange's sums may not be added: a rank's verdict says an
/// error or other settings than this rank's (`digest`), the leader chose another count
/// than the exchange moved, or the indices failed their check on some rank (`faults`).
struct refusal {
  /// every rank's detail::sized_frame, in rank order; its sizes: the count of indices the
  /// later collectives move and their root + 1
  const std::byte* frames;
  std::size_t ranks;
  std::size_t leader;
  std::uint64_t digest;
  std::uint64_t count;  ///< indices the exchange moved
  const float* faults;  ///< the ranks whose indices failed their check, summed with the values
  std::uint32_t* refused;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    const bool no = *faults != 0.0f || load_le<std::uint64_t>(frames + leader * sized_frame::size + 8) != count ||
                    !frames_alike(frames, ranks, digest);
    *refused = no ? 1u : 0u;
  }
};

/// *slot = 1 where this rank's indices failed their check (`*fault` nonzero), else 0: a
/// value that the reduce of the sums counts over the ranks, so that every rank learns
/// whether any rank's indices broke.
struct fault_count {
  const std::uint32_t* fault;
  float* slot;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const { *slot = *fault != 0 ? 1.0f : 0.0f; }
};

/// *out = the ranks whose indices failed their check (the reduced fault_count).
struct faults_counted {
  const float* summed;
  std::uint32_t* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const { *out = static_cast<std::uint32_t>(*summed); }
};

/// sums[j] = values[j] for the j < count the step sent, 0 past them.
struct sums_of {
  const float* values;
  const step_status* status;
  float* sums;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { sums[j] = j < status->count ? values[j] : 0.0f; }
};

}  // namespace cyclic
}  // namespace detail

namespace comm {

/// ScaleCom's cyclic local top-k. At step t the leader is rank t mod W: it selects
/// indices with `leader_selector` from its own acc (compressor::preview_queued: the
/// corrector's update of its committed state, nothing committed) and broadcasts them;
/// every rank compresses its own acc at those indices (a given_indices compressor,
/// usually presets::scalecom); the k values are summed (reduced to the leader, then
/// broadcast, so every rank holds the same bits) and `dense[i] += scale * sum_i`.
/// Every rank commits the same index set, and each moves O(k) values whatever the
/// number of ranks.
///
/// The exchange runs where the compressor's memory is and the host reads its outcome
/// once, at its end. Each rank previews its step, and the ranks tell each other, in an
/// all-gather of that memory, their verdicts: an error met on the host (a bad argument),
/// a NaN or infinity in the preview, a digest of their configuration (n, k, the step,
/// the policies), and the leader's count. The indices and sums follow, sized as the
/// ranks last agreed (the collectives of every rank must match before any rank has heard
/// of the others), and the sums are added to `dense` only where every verdict is clean
/// (a pass reads them there). The host then reads the verdicts: a failed or disagreeing
/// rank makes every rank throw the same error and leaves every rank's compressor and
/// `dense` as they were; a leader or a count that the exchange did not expect (the
/// first step, a new density, a leader selector whose count varies) makes every rank run
/// the exchange again at once, sized as now agreed.
///
/// `Comm` is the transport (comm/transport.hpp) in the compressor's memory: comm::mpi
/// (host memory: backend::host compressors), comm::nccl (device memory: backend::cuda
/// compressors) or the PyTorch binding's adapter. Each rank's `grad`, `dense` and the
/// messages are in that memory, and their views say so (std::span, device_span). Every
/// rank's exchange must take part in the same steps (it keeps the sizes the ranks last
/// agreed on). The leader's own compressor counts the steps its rank led: a leader
/// selector seeded by the step (random_k, sampled_threshold) draws from that count.
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
        leader_message_(allocate<std::byte>(leader_.max_message_bytes())),
        index_(allocate<std::uint32_t>(leader_selector.max_selected(compressor.size()))),
        sums_(allocate<float>(leader_selector.max_selected(compressor.size()) + 1)),
        message_(allocate<std::byte>(compressor.max_message_bytes())),
        verdict_(allocate<std::byte>(detail::sized_frame::size)),
        outcome_(allocate<std::byte>(outcome_bytes())),
        refused_(allocate<std::uint32_t>(1)),
        outcome_host_(outcome_bytes()),
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
  /// The ranks tell each other their verdicts (n, k, the step, the policies, and
  /// whether every rank's arguments and step are accepted), the leader's indices are
  /// broadcast and the values reduced, all where the memory is; the host reads the
  /// verdicts once, at the end.
  /// \returns this rank's message (its values at the shared indices), valid until the
  ///          next step
  /// \throws gradcomp::error on every rank alike, changing no compressor and no
  ///         `dense`, if any rank's dense.size() != n, `scale` is not finite or its step
  ///         would be rejected (a NaN or infinity), or if the ranks disagree on n, k, the
  ///         step or the policies; (corrupt_message) where the leader's indices reached
  ///         a rank not ascending below n (a broken transport).
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
    queue(grad, dense, scale);
    std::span<const std::byte> outcome;
    try {
      outcome = read_outcome();
    } catch (...) {
      queued_.reset();
      compressor_.drop_staged();
      throw;
    }
    return settle(outcome);
  }

  /// stage() up to its one read: everything queued where the memory is, the outcome
  /// (outcome()) left for the caller to read, with other exchanges' outcomes, before it
  /// calls settle(). `also`: settings the ranks must share beside the exchange's own (a
  /// DDP hook's), a disagreement on any of them reported as `who`'s. The views must stay
  /// valid until settle() returns.
  void queue(view<const float> grad, view<float> dense, float scale, std::span<const detail::setting> also = {},
             std::string_view who = "cyclic_topk") {
    try {
      queued q;
      q.grad = grad;
      q.dense = dense;
      q.scale = scale;
      q.also.assign(also.begin(), also.end());
      q.who = who;
      queued_ = std::move(q);
      run_queued();
    } catch (...) {
      queued_.reset();
      compressor_.drop_staged();
      throw;
    }
  }

  /// The bytes queue() left for the host to read, in the compressor's memory.
  [[nodiscard]] view<const std::byte> outcome() const { return {outcome_.data(), outcome_bytes()}; }

  /// Completes the exchange queue() queued, from its outcome as the host read it: throws
  /// as step() does, or where the ranks agree on a leader or count other than those the
  /// exchange moved runs it again at once (reading its outcome itself).
  /// \returns this rank's message, as step()
  /// \throws gradcomp::error as step() does (nothing staged then); (invalid_argument) if
  ///         no exchange is queued or `outcome` is not outcome()'s size.
  message_type settle(std::span<const std::byte> outcome) {
    detail::require(queued_.has_value(), errc::invalid_argument, "cyclic_topk: settle without a queued exchange");
    try {
      detail::require(outcome.size() == outcome_bytes(), errc::invalid_argument,
                      "cyclic_topk: settle: the outcome has ", outcome.size(), " bytes, not ", outcome_bytes());
      const message_type m = settle_queued(outcome);
      queued_.reset();
      return m;
    } catch (...) {
      queued_.reset();
      compressor_.drop_staged();
      throw;
    }
  }

  /// Commits the compressor's staged step.
  /// \throws gradcomp::error (invalid_argument) if no step is staged.
  void accept_staged() { compressor_.accept_staged(); }
  /// Drops the compressor's staged step.
  void drop_staged() noexcept { compressor_.drop_staged(); }

  /// Forgets the sizes the ranks last agreed for the collectives, so that the next step
  /// runs the exchange again at the sizes it agrees (as a first step does). For a caller
  /// that cannot tell whether every rank's exchange took part in the same steps (a DDP
  /// hook after a refused step, where one rank may have made its exchange anew); every
  /// rank must call it alike.
  void forget_agreed_sizes() noexcept { moved_ = {}; }

  /// Bytes the exchange holds beside its compressor's (the leader's compressor, the
  /// messages, the selection and its sums, the verdicts): all workspace.
  [[nodiscard]] std::size_t memory_bytes() const {
    return leader_.memory_bytes().total() +
           detail::bytes_held(leader_message_, index_, sums_, message_, verdict_, outcome_, refused_);
  }

 private:
  static constexpr std::size_t frame_bytes = detail::sized_frame::size;

  // What the host reads at the end of an exchange, in one copy: every rank's frame, then
  // this rank's step's status and the indices' check (a fault word).
  std::size_t outcome_bytes() const {
    return static_cast<std::size_t>(comm_.size()) * frame_bytes + sizeof(detail::step_status) + 8;
  }
  detail::step_status* outcome_status() {
    return reinterpret_cast<detail::step_status*>(outcome_.data() + comm_.size() * frame_bytes);
  }
  std::uint32_t* outcome_fault() {
    return reinterpret_cast<std::uint32_t*>(outcome_.data() + comm_.size() * frame_bytes + sizeof(detail::step_status));
  }
  std::span<const std::byte> read_outcome() {
    compressor_.backend().to_host(static_cast<const std::byte*>(outcome_.data()), outcome_host_.size(),
                                  outcome_host_.data());
    return outcome_host_;
  }

  // The exchange queue() queued, from its arguments to its one read.
  struct queued {
    view<const float> grad;
    view<float> dense;
    float scale = 0;
    std::vector<detail::setting> also;      // beside the exchange's own
    std::string who;                        // whose settings they are, as a disagreement names them
    std::vector<detail::setting> settings;  // the exchange's own and `also`
    detail::rank_draft mine;
    std::uint64_t k = 0, takes = 0, step = 0;
    std::size_t leader = 0, count = 0;
    bool as_moved = false;
    bool again = false;  // run again at once: the ranks agreed on another leader or count
  };

  // The exchange of step() with the compressor's step staged, queued up to its outcome.
  void run_queued() {
    queued& q = *queued_;
    const backend_type& be = compressor_.backend();
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    const std::size_t n = compressor_.size();
    q.k = leader_k();
    q.takes = compressor_.selector().max_selected(n);
    q.step = compressor_.step();
    q.leader = static_cast<std::size_t>(q.step % ranks);
    q.settings = {detail::setting{"n", n}, detail::setting{"k", q.k}, detail::setting{"the capacity", q.takes},
                  detail::setting{"the step", q.step}, detail::setting{"the policies", policies_}};
    q.settings.insert(q.settings.end(), q.also.begin(), q.also.end());
    // The collectives move what the ranks last agreed on (the leader's count, and the
    // step, whose leader is the root); this rank's step goes through them only where
    // that is its step, with room for the count.
    q.count = moved_.count;
    const auto root = static_cast<int>(moved_.step % ranks);
    q.as_moved = q.step == moved_.step && q.count <= q.takes;
    compressor_.drop_staged();  // a step staged by the pass before this one
    const detail::step_status* preview = nullptr;
    const detail::step_status* chosen = nullptr;
    q.mine = detail::draft("cyclic_topk", q.settings, [&]() -> std::uint64_t {
      detail::require(q.dense.size() == n, errc::invalid_argument, "cyclic_topk: dense.size() = ", q.dense.size(),
                      " does not match n = ", n);
      detail::require(std::isfinite(q.scale), errc::invalid_argument, "cyclic_topk: scale must be finite, got ",
                      q.scale);
      follow_density();              // where it fails, the buffers hold what the ranks agreed before
      compressor_.hold_workspace();  // what the step allocates, allocated before the collectives
      const auto previewed = compressor_.preview_queued(be, q.grad);
      preview = previewed.status;
      if (me == q.leader) {  // staged until the exchange succeeds (a step-seeded selector moves on then)
        chosen = leader_.stage_queued(be, previewed.acc, view_of(leader_message_));
        const auto selected = detail::raw(leader_.staged_selection().index);
        if (q.as_moved) {
          be.for_each(std::min(q.count, selected.size()),
                      detail::copy_elements<std::uint32_t>{selected.data(), index_.data()});
        }
      }
      return 0;
    });
    const std::size_t count = q.count;
    const std::uint64_t digest = q.mine.verdict.digest;
    be.for_each(frame_bytes, detail::sized_frame_byte{q.mine.report.code,
                                                      digest,
                                                      preview,
                                                      chosen,
                                                      {count, static_cast<std::uint64_t>(root) + 1},
                                                      verdict_.data()});
    comm_.all_gather(view<const std::byte>(verdict_.data(), frame_bytes),
                     view<std::byte>(outcome_.data(), ranks * frame_bytes));
    be.clear(outcome_.data() + ranks * frame_bytes, sizeof(detail::step_status) + 8);
    if (count > 0) comm_.broadcast(view<std::uint32_t>(index_.data(), count), root);
    const bool staged = q.as_moved && q.mine.report.code == 0;
    float* faults = sums_.data() + count;  // how many ranks' indices failed their check, summed with the values
    if (staged) {
      compressor_.set_indices_queued(be, view<const std::uint32_t>(index_.data(), count),
                                     view<std::uint32_t>(outcome_fault(), 1));
      const detail::step_status* status = compressor_.stage_queued(be, q.grad, view_of(message_));
      be.for_each(count, detail::cyclic::sums_of{detail::raw(compressor_.staged_selection().values).data(), status,
                                                 sums_.data()});
      be.for_each(1, detail::copy_elements<detail::step_status>{status, outcome_status()});
    } else {
      be.clear(sums_.data(), count);
    }
    be.for_each(1, detail::cyclic::fault_count{outcome_fault(), faults});
    comm_.reduce_broadcast(view<float>(sums_.data(), count + 1), root);
    if (staged) {
      be.for_each(1, detail::cyclic::refusal{outcome_.data(), ranks, q.leader, digest, count, faults, refused_.data()});
      be.for_each(count, detail::decoding::scatter_add_if_clean{refused_.data(), index_.data(), sums_.data(), q.scale,
                                                                detail::raw(q.dense).data()});
    }
    be.for_each(1, detail::cyclic::faults_counted{faults, outcome_fault()});
  }

  // The queued exchange settled from its outcome, read: the verdicts, this rank's status
  // and the ranks' faults.
  message_type settle_queued(std::span<const std::byte> outcome) {
    queued& q = *queued_;
    const auto ranks = static_cast<std::size_t>(comm_.size());
    const auto me = static_cast<std::size_t>(comm_.rank());
    const std::size_t n = compressor_.size();
    std::vector<std::byte> verdicts(ranks * detail::rank_verdict::size);
    for (std::size_t r = 0; r < ranks; ++r) {
      std::memcpy(verdicts.data() + r * detail::rank_verdict::size, outcome.data() + r * frame_bytes,
                  detail::rank_verdict::size);
    }
    if (q.mine.report.code == 0 &&
        detail::rank_verdict::read(verdicts.data() + me * detail::rank_verdict::size).code != 0) {
      // The preview met a NaN or infinity: its error, read now (the step is dropped).
      q.mine = detail::draft("cyclic_topk", q.settings, [&]() -> std::uint64_t {
        (void)compressor_.preview(q.grad);
        detail::fail(errc::invalid_argument,
                     "cyclic_topk: the preview's status said a value was not finite; it is not");
      });
    }
    const std::vector<std::uint64_t> own = detail::settle(comm_, q.who.c_str(), q.mine, verdicts);
    // The ranks agreed on their settings: each reads the same leader's count and faults,
    // and every rank throws alike or none does.
    const std::uint64_t chose = own[q.leader];
    detail::require(chose <= q.k && chose <= q.takes, errc::corrupt_message, "cyclic_topk: the leader (rank ", q.leader,
                    ") reported ", chose, " indices, more than k = ", q.k, " or the ", q.takes,
                    " the compressor takes");
    if (!q.as_moved || chose != q.count) {
      detail::require(!q.again, errc::corrupt_message, "cyclic_topk: the leader (rank ", q.leader, ") chose ", q.count,
                      " indices, then ", chose, " in the same step");
      moved_ = {static_cast<std::size_t>(chose), q.step};
      q.again = true;
      run_queued();
      return settle_queued(read_outcome());
    }
    const std::byte* after = outcome.data() + ranks * frame_bytes;
    const auto broken = detail::load_le<std::uint32_t>(after + sizeof(detail::step_status));
    detail::require(broken == 0, errc::corrupt_message, "cyclic_topk: the indices of the leader (rank ", q.leader,
                    ") arrived on ", broken, " of ", ranks, " ranks not ascending below n = ", n);
    detail::step_status status{};
    std::memcpy(&status, after, sizeof(status));
    moved_ = {q.count, q.step + 1};  // the next step's leader, once this step is accepted
    if (me == q.leader) leader_.accept_staged();
    return message_type(typename message_type::bytes_type(message_.data(), static_cast<std::size_t>(status.bytes)), n,
                        status.count);
  }

  // The leader's k: at the compressor's density where its selector has one
  // (follow_density), else its own.
  [[nodiscard]] std::uint64_t leader_k() {
    if constexpr (requires {
                    compressor_.selector().density;
                    leader_.set_density(1.0);
                  }) {
      const double density = compressor_.selector().density;
      if (density != 0.0) return detail::with_density(leader_.selector(), density).max_selected(compressor_.size());
    }
    return leader_.selector().max_selected(compressor_.size());
  }

  // Where the compressor's selector has a density (presets::scalecom's given_indices),
  // the leader selects at it: compressor::set_density (a warm-up schedule, a restored
  // checkpoint) moves the leader's k with the compressor's capacity, and the buffers
  // grow with them (never shrinking: the exchange may still move the count agreed before).
  void follow_density() {
    if constexpr (requires {
                    compressor_.selector().density;
                    leader_.set_density(1.0);
                  }) {
      const double density = compressor_.selector().density;
      if (density == 0.0 || density == leader_.selector().density) return;
      const std::size_t n = compressor_.size();
      const std::size_t k = leader_k();  // at the compressor's new density
      // Allocated first: should that throw, nothing has changed.
      auto index = allocate<std::uint32_t>(std::max<std::size_t>(k, static_cast<std::size_t>(index_.size())));
      auto sums = allocate<float>(std::max<std::size_t>(k + 1, static_cast<std::size_t>(sums_.size())));
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

  // What the exchange's collectives move, as the ranks last agreed: the leader's count
  // of indices (none at first), and the step whose leader is their root (the step
  // agreed on, one more once it is accepted).
  struct moved {
    std::size_t count = 0;
    std::uint64_t step = 0;
  };

  Comm& comm_;
  Compressor& compressor_;
  leader_type leader_;
  buffer<std::byte> leader_message_;
  buffer<std::uint32_t> index_;
  buffer<float> sums_;
  buffer<std::byte> message_;
  buffer<std::byte> verdict_;            // this rank's frame
  buffer<std::byte> outcome_;            // outcome_bytes(): what the host reads
  buffer<std::uint32_t> refused_;        // whether the sums may not be added
  std::vector<std::byte> outcome_host_;  // outcome_, read
  moved moved_;
  std::optional<queued> queued_;  // the exchange queue() queued, until settle()
  std::uint64_t policies_;        // the policies' names, which every rank must share
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
