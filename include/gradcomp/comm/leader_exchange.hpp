/// \file comm/leader_exchange.hpp
/// Leader SGD's exchange (docs/algorithms.md, "Leader SGD") over any transport
/// (comm/transport.hpp): comm::mpi with parameters in host memory, comm::nccl with
/// parameters in device memory, the PyTorch binding's adapter of a c10d process group.
#pragma once

#include <gradcomp/accumulate.hpp>
#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/comm/lsgd.hpp>
#include <gradcomp/comm/transport.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>
#include <gradcomp/settings.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// to[i] = from[i].
struct copy_floats {
  const float* from;
  float* to;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { to[i] = from[i]; }
};

/// x[i] -= pull * (x[i] - leader[i]): `pull` of the way toward the leader's parameters,
/// x itself where they are equal.
struct pull_toward {
  float* x;
  const float* leader;
  float pull;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { x[i] = x[i] - pull * (x[i] - leader[i]); }
};

}  // namespace detail

namespace comm {

/// How a leader_exchange's leader sends its parameters: whole, n floats broadcast from
/// the leader, toward which the other ranks are pulled (the paper's exchange).
template <class Backend>
class whole_parameters {
 public:
  /// For parameters of n floats on `backend`.
  whole_parameters(const Backend& backend, std::size_t n)
      : backend_(backend), sent_(backend.template allocate<float>(n)) {}

  /// `comm`'s rank `root` sends its `params`; every other rank moves `strength` of the way
  /// toward them. `kind` (0: a group's pull, 1: the global pull) does not matter here.
  template <class Comm>
  void pull(Comm& comm, backend_span<Backend, float> params, int root, bool leading, float strength, int /*kind*/,
            traffic& moved) {
    const std::size_t n = params.size();
    if (leading) backend_.for_each(n, detail::copy_floats{params.data(), sent_.data()});
    comm.broadcast(span_in<typename Backend::memory, std::uint32_t>(reinterpret_cast<std::uint32_t*>(sent_.data()), n),
                   root);
    if (!leading) backend_.for_each(n, detail::pull_toward{params.data(), sent_.data(), strength});
    moved.sent += leading && comm.size() > 1 ? 4 * n : 0;
    moved.received += leading ? 0 : 4 * n;
    ++moved.collectives;
  }
  /// The parameters the last pull sent.
  [[nodiscard]] backend_span<Backend, const float> sent() const noexcept { return {sent_.data(), sent_.size()}; }

 private:
  Backend backend_;
  typename Backend::template buffer<float> sent_;
};

/// How a leader_exchange's leader sends its parameters compressed (docs/algorithms.md,
/// "Leader SGD"): the ranks of a group hold the same reference copy of their leaders'
/// parameters (one for the group's pulls, one for the global pulls), sent whole at the
/// first round of its kind; afterwards the leader sends the change of its parameters
/// against the reference, compressed by `Compressor` (one without memory: what it does
/// not send stays in the next change, so the reference is the error feedback), every
/// rank adds the decoded change to its reference, and every rank but the leader is
/// pulled toward the reference. Parameters and messages in host memory.
template <class Compressor>
class compressed_changes {
  using backend_type = typename Compressor::backend_type;
  static_assert(Compressor::corrector_type::state_arrays == 0,
                "compressed_changes: the compressor must keep no memory (the reference holds what it did not send)");
  static_assert(std::is_same_v<typename backend_type::memory, host_memory> &&
                    std::is_same_v<typename backend_type::message_memory, host_memory>,
                "compressed_changes: parameters and messages in host memory");

 public:
  /// \param compressor  of n elements, without memory: the leader compresses its change
  ///                    with it (e.g. exact_topk, correct::none, any value coding).
  explicit compressed_changes(Compressor& compressor)
      : compressor_(compressor),
        whole_(compressor.backend(), compressor.size()),
        change_(compressor.size()),
        words_((compressor.max_message_bytes() + 3) / 4) {}

  /// The reference of `kind` (0: the group's leaders', 1: the global leaders'), the same
  /// on every rank that pulled toward it.
  [[nodiscard]] std::span<const float> reference(int kind) const noexcept { return reference_[kind]; }

  /// Restores the reference of `kind` (a checkpoint's; empty: none yet, so that the next
  /// round of that kind sends the parameters whole). Every rank of the communicator must
  /// restore the same.
  /// \throws gradcomp::error, changing nothing, unless `kind` is 0 or 1 and `reference` is
  ///         empty or holds the parameters' n floats.
  void set_reference(int kind, std::span<const float> reference) {
    detail::require(kind == 0 || kind == 1, errc::invalid_argument,
                    "compressed_changes: the reference's kind must be 0 (the group's) or 1 (the global), got ", kind);
    detail::require(reference.empty() || reference.size() == change_.size(), errc::invalid_argument,
                    "compressed_changes: a reference of ", reference.size(), " floats for parameters of ",
                    change_.size());
    reference_[kind].assign(reference.begin(), reference.end());
  }
  /// The compressor the leaders compress their changes with.
  [[nodiscard]] const Compressor& compressor() const noexcept { return compressor_; }

  /// `comm`'s rank `root` sends its change against the reference of `kind` (whole at the
  /// first round of that kind); every rank adds it to that reference and every other
  /// rank moves `strength` of the way toward it.
  template <class Comm>
  void pull(Comm& comm, std::span<float> params, int root, bool leading, float strength, int kind, traffic& moved) {
    const std::size_t n = params.size();
    std::vector<float>& reference = reference_[kind];
    if (reference.empty()) {  // the first round of its kind: the parameters whole
      whole_.pull(comm, params, root, leading, strength, kind, moved);
      reference.assign(whole_.sent().begin(), whole_.sent().end());
      return;
    }
    // The leader's message size first (every rank reads the same, so a size that cannot
    // be refuses alike), then the message, every rank adding it to its reference.
    std::uint32_t size = 0;
    if (leading) {
      for (std::size_t i = 0; i < n; ++i) change_[i] = params[i] - reference[i];
      try {
        size = static_cast<std::uint32_t>(
            compressor_.compress(change_, std::as_writable_bytes(std::span(words_))).bytes().size());
      } catch (const error&) {
        size = failed;  // told to every rank, which all throw alike below
      }
    }
    comm.broadcast(std::span(&size, 1), root);
    detail::require(size != failed, errc::non_finite, "leader_exchange: the leader (rank ", root,
                    " of its communicator) could not compress the change of its parameters (not finite)");
    detail::require(size <= 4 * words_.size(), errc::corrupt_message, "leader_exchange: the leader (rank ", root,
                    ") announced a message of ", size, " bytes, more than its compressor's ", 4 * words_.size());
    comm.broadcast(std::span(words_.data(), (size + 3) / 4), root);
    accumulate(compressor_.backend(), std::as_bytes(std::span(words_)).first(size), std::span(reference), 1.0f);
    if (!leading) compressor_.backend().for_each(n, detail::pull_toward{params.data(), reference.data(), strength});
    moved.sent += leading && comm.size() > 1 ? 4 + size : 0;
    moved.received += leading ? 0 : 4 + size;
    moved.collectives += 2;
  }

 private:
  static constexpr std::uint32_t failed = ~std::uint32_t{0};
  Compressor& compressor_;
  whole_parameters<backend_type> whole_;
  std::vector<float> change_;
  std::vector<std::uint32_t> words_;
  std::vector<float> reference_[2];
};

/// What one step of a leader_exchange did.
struct leader_round {
  bool held = false;       ///< whether the step held a round (every period-th step)
  int group_leader = -1;   ///< the rank (of the world) whose parameters pulled this rank's group, or -1
  int global_leader = -1;  ///< the rank whose parameters then pulled every rank, or -1 (no global pull)
};

/// Leader SGD among the ranks of `world` for parameters of n floats in `Backend`'s
/// memory: each rank trains its own copy and calls step() after each local step with its
/// recent training loss. Every lsgd::period-th step is a round: the ranks agree, in one
/// all-gather, on their settings and their losses (a rank whose loss is not finite, or
/// whose arguments are wrong, makes every rank throw the same error and leaves every
/// rank's parameters and step count as they were); the group's leader broadcasts its
/// parameters over `group` and every rank of the group moves lsgd::local_pull of the way
/// toward them; every lsgd::global_every-th round the global leader's (after that pull)
/// then pull every rank by lsgd::global_pull, broadcast over `world`. A leader's own
/// parameters do not change in its pull.
template <transport Comm, class Backend, class Sender = whole_parameters<Backend>>
class leader_exchange {
  static_assert(std::is_same_v<typename Comm::memory, typename Backend::memory>,
                "leader_exchange: the transport moves another memory than the parameters'");

 public:
  /// The parameters' view (std::span, device_span).
  using params_view = backend_span<Backend, float>;

  /// `group` is this rank's group: ranks [g G, (g + 1) G) of `world` in world's order
  /// (G = policy.group_of(world.size()), e.g. MPI_Comm_split by rank / G), or `world`
  /// itself with one group. The ranks check that it is, at every round.
  /// \throws gradcomp::error if `policy` is invalid for world's size.
  leader_exchange(Comm& world, Comm& group, const Backend& backend, std::size_t n, lsgd policy)
      : leader_exchange(world, group, backend, n, policy, Sender(backend, n)) {}

  /// The same, the leaders sending their parameters as `sender` sends them (e.g.
  /// compressed_changes: their changes compressed) on `Backend` (the sender's own).
  leader_exchange(Comm& world, Comm& group, const Backend& /*backend*/, std::size_t n, lsgd policy, Sender sender)
      : world_(world), group_(group), n_(n), policy_(policy), sender_(std::move(sender)) {
    policy_.validate(static_cast<std::size_t>(world.size()));
    std::ostringstream text;
    for_each_setting(policy_, [&](const char* name, const auto& value) { text << name << '=' << value << ' '; });
    policy_text_ = text.str();
  }

  /// Counts this rank's local step (`params`: its parameters after it, `loss`: its recent
  /// training loss) and, every lsgd::period-th step, holds a round (a collective: every
  /// rank calls it at the same step).
  /// \throws gradcomp::error on every rank alike at a round, changing no rank's
  ///         parameters and no step count, if any rank's params.size() != n, its loss is
  ///         not finite (non_finite), its `group` is not the one the policy describes, or
  ///         the ranks' step counts, n or policies differ. Between rounds, a wrong
  ///         params.size() throws on this rank alone (there is no collective).
  leader_round step(params_view params, double loss) {
    const std::uint64_t t = steps_ + 1;
    if (t % policy_.period != 0) {
      check_size(params);
      steps_ = t;
      return {};
    }
    const auto ranks = static_cast<std::size_t>(world_.size());
    const std::size_t group_size = policy_.group_of(ranks);
    const auto me = static_cast<std::size_t>(world_.rank());
    traffic_ = {};
    const std::vector<std::uint64_t> losses =
        detail::agree(world_, who, {{"n", n_}, {"the step", t}, {"the policy", policy_text_}}, [&]() -> std::uint64_t {
          check_size(params);
          detail::require(std::isfinite(loss), errc::non_finite, who, ": the loss must be finite, got ", loss);
          detail::require(static_cast<std::size_t>(group_.size()) == group_size &&
                              static_cast<std::size_t>(group_.rank()) == me % group_size,
                          errc::invalid_argument, who, ": the group communicator's rank ", group_.rank(), " of ",
                          group_.size(), " is not this rank's place in its group of ", group_size, " (rank ",
                          me % group_size, ")");
          return std::bit_cast<std::uint64_t>(loss);
        });
    note(detail::rank_verdict::size, (ranks - 1) * detail::rank_verdict::size);
    leader_round round{.held = true};
    const std::size_t first = me / group_size * group_size;
    round.group_leader = static_cast<int>(lowest(losses, first, first + group_size));
    sender_.pull(group_, params, round.group_leader - static_cast<int>(first), round.group_leader == world_.rank(),
                 policy_.local_pull, 0, traffic_);
    if ((t / policy_.period) % policy_.global_every == 0) {
      round.global_leader = static_cast<int>(lowest(losses, 0, ranks));
      sender_.pull(world_, params, round.global_leader, round.global_leader == world_.rank(), policy_.global_pull, 1,
                   traffic_);
    }
    steps_ = t;
    return round;
  }

  /// Local steps counted so far.
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  /// Resumes the count at `steps` (a checkpoint's): every rank must resume at the same.
  void set_steps(std::uint64_t steps) noexcept { steps_ = steps; }
  /// The policy.
  [[nodiscard]] const lsgd& policy() const noexcept { return policy_; }
  /// What this rank moved in its last round (also one that threw).
  [[nodiscard]] const traffic& last_traffic() const noexcept { return traffic_; }
  /// \name How the leaders send their parameters
  /// The mutable one restores a checkpoint's references (compressed_changes::set_reference).
  /// @{
  [[nodiscard]] const Sender& sender() const noexcept { return sender_; }  ///< the sender
  [[nodiscard]] Sender& sender() noexcept { return sender_; }              ///< the sender, to change

  /// @}

 private:
  static constexpr const char* who = "leader_exchange";

  void check_size(params_view params) const {
    detail::require(params.size() == n_, errc::invalid_argument, who, ": params.size() = ", params.size(),
                    " does not match n = ", n_);
  }

  // The rank in [begin, end) of the lowest loss, ties to the lower rank.
  static std::size_t lowest(const std::vector<std::uint64_t>& losses, std::size_t begin, std::size_t end) {
    std::size_t best = begin;
    for (std::size_t r = begin + 1; r < end; ++r) {
      if (std::bit_cast<double>(losses[r]) < std::bit_cast<double>(losses[best])) best = r;
    }
    return best;
  }

  void note(std::uint64_t sent, std::uint64_t received) noexcept {
    traffic_.sent += sent;
    traffic_.received += received;
    ++traffic_.collectives;
  }

  Comm& world_;
  Comm& group_;
  std::size_t n_;
  lsgd policy_;
  std::string policy_text_;
  Sender sender_;
  std::uint64_t steps_ = 0;
  traffic traffic_;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
