// gradcomp._C.LeaderExchange (leader.cpp): Leader SGD's exchange over torch.distributed
// process groups, for gradcomp.torch.lsgd.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include <gradcomp/comm/lsgd.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace gradcomp_py {

class any_leader;

/// comm::leader_exchange over the world's process group and this rank's group's (None:
/// one group, the world), for parameters of `numel` float32 in host memory; the policy
/// from `policy` (the fields of comm::lsgd by name); the leaders send their parameters
/// whole when `compressed` is None, else their changes by exact_topk with the options
/// it holds (density or count, index, value, levels, seed, checksum).
class leader_handle {
 public:
  leader_handle(const pybind11::object& world, const pybind11::object& group, std::int64_t numel,
                const pybind11::dict& policy, const pybind11::object& compressed);
  ~leader_handle();

  /// One local step (a collective every policy.period-th step): {held, group_leader,
  /// global_leader}.
  pybind11::dict step(torch::Tensor& params, double loss);
  [[nodiscard]] std::uint64_t steps() const;
  void set_steps(std::uint64_t steps);
  /// What this rank moved in its last round.
  [[nodiscard]] pybind11::dict last_traffic() const;
  /// The compressed leaders' reference of `kind` (0: the group's, 1: the global), empty
  /// when none yet or the parameters travel whole.
  [[nodiscard]] torch::Tensor reference(int kind) const;
  void set_reference(int kind, const torch::Tensor& reference);
  [[nodiscard]] pybind11::bytes save_compressor() const;
  void load_compressor(const std::string& record);
  [[nodiscard]] pybind11::dict policy() const;

 private:
  gradcomp::comm::lsgd policy_;
  std::unique_ptr<any_leader> impl_;
};

/// Adds LeaderExchange to the module.
void bind_leader(pybind11::module_& m);

}  // namespace gradcomp_py
