/// \file comm/leader_exchange.hpp
/// Leader SGD's exchange (docs/algorithms.md, "Leader SGD") over any transport
/// (comm/transport.hpp): comm::mpi with parameters in host memory, comm::nccl with
/// parameters in device memory, the PyTorch binding's adapter of a c10d process group.
#pragma once

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
template <transport Comm, class Backend>
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
      : world_(world),
        group_(group),
        backend_(backend),
        n_(n),
        policy_(policy),
        reference_(backend.template allocate<float>(n)) {
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
    pull(params, group_, round.group_leader - static_cast<int>(first), round.group_leader == world_.rank(),
         policy_.local_pull);
    if ((t / policy_.period) % policy_.global_every == 0) {
      round.global_leader = static_cast<int>(lowest(losses, 0, ranks));
      pull(params, world_, round.global_leader, round.global_leader == world_.rank(), policy_.global_pull);
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

  // The leader (`root` of `comm`) sends its parameters; every other rank pulls toward them.
  void pull(params_view params, Comm& comm, int root, bool leading, float strength) {
    if (leading) backend_.for_each(n_, detail::copy_floats{params.data(), reference_.data()});
    comm.broadcast(
        span_in<typename Backend::memory, std::uint32_t>(reinterpret_cast<std::uint32_t*>(reference_.data()), n_),
        root);
    if (!leading) backend_.for_each(n_, detail::pull_toward{params.data(), reference_.data(), strength});
    if (comm.size() > 1) note(leading ? 4 * n_ : 0, leading ? 0 : 4 * n_);
  }

  void note(std::uint64_t sent, std::uint64_t received) noexcept {
    traffic_.sent += sent;
    traffic_.received += received;
    ++traffic_.collectives;
  }

  Comm& world_;
  Comm& group_;
  Backend backend_;
  std::size_t n_;
  lsgd policy_;
  std::string policy_text_;
  typename Backend::template buffer<float> reference_;
  std::uint64_t steps_ = 0;
  traffic traffic_;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
