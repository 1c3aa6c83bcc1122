/// \file comm/lsgd.hpp
/// Leader SGD's schedule and pull strengths (Teng et al., NeurIPS 2019; docs/algorithms.md,
/// "Leader SGD"): the policy comm::leader_exchange runs.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/settings.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

/// Every `period` local steps the ranks hold a round: each group's leader (its rank of the
/// lowest loss, ties to the lower rank) sends its parameters to its group and every rank
/// of the group moves `local_pull` of the way toward them; every `global_every`-th round
/// the global leader's parameters then pull every rank by `global_pull`. Groups are
/// `group_size` consecutive ranks (0: one group of every rank).
struct lsgd {
  std::size_t period = 4;        ///< local steps between rounds, >= 1 (the authors' l_comm)
  std::size_t global_every = 4;  ///< rounds between pulls toward the global leader, >= 1 (g_comm / l_comm)
  float local_pull = 0.1f;       ///< c1: the pull toward the group's leader, in [0, 1]
  float global_pull = 0.1f;      ///< c2: the pull toward the global leader, in [0, 1]
  std::size_t group_size = 0;    ///< ranks per group, dividing the ranks (0: every rank, one group)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"period", &lsgd::period}, setting{"global_every", &lsgd::global_every},
                      setting{"local_pull", &lsgd::local_pull}, setting{"global_pull", &lsgd::global_pull},
                      setting{"group_size", &lsgd::group_size}};
  }

  /// The policy's name, as messages of errors record it.
  [[nodiscard]] std::string name() const { return "lsgd"; }

  /// Ranks per group among `ranks`.
  [[nodiscard]] std::size_t group_of(std::size_t ranks) const { return group_size == 0 ? ranks : group_size; }

  /// \throws gradcomp::error unless the periods are >= 1, the pulls in [0, 1] and
  ///         group_size divides `ranks`.
  void validate(std::size_t ranks) const {
    detail::require(period >= 1, errc::invalid_argument, "lsgd: period must be >= 1, got ", period);
    detail::require(global_every >= 1, errc::invalid_argument, "lsgd: global_every must be >= 1, got ", global_every);
    detail::require(local_pull >= 0.0f && local_pull <= 1.0f, errc::invalid_argument,
                    "lsgd: local_pull must be in [0, 1], got ", local_pull);
    detail::require(global_pull >= 0.0f && global_pull <= 1.0f, errc::invalid_argument,
                    "lsgd: global_pull must be in [0, 1], got ", global_pull);
    detail::require(group_size == 0 || (group_size <= ranks && ranks % group_size == 0), errc::invalid_argument,
                    "lsgd: group_size must divide the ", ranks, " ranks, got ", group_size);
  }
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
