// gradcomp._C.LeaderExchange: Leader SGD's exchange (gradcomp/comm/leader_exchange.hpp)
// over torch.distributed process groups, on a flat float32 copy of a model's parameters in
// host memory that gradcomp.torch.lsgd keeps. The leaders send their parameters whole, or
// their changes compressed by exact_topk with any value coding (comm::compressed_changes).
#include "leader.hpp"

#include <torch/extension.h>

#include <gradcomp/comm/leader_exchange.hpp>
#include <gradcomp/gradcomp.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "compressor_handle.hpp"
#include "compressors.hpp"
#include "policy_options.hpp"
#include "process_group.hpp"
#include "tensors.hpp"

namespace gradcomp_py {

namespace py = pybind11;
namespace gc = gradcomp;

/// leader_exchange of either sender behind one interface.
class any_leader {
 public:
  virtual ~any_leader() = default;
  virtual gc::comm::leader_round step(std::span<float> params, double loss) = 0;
  [[nodiscard]] virtual std::uint64_t steps() const = 0;
  virtual void set_steps(std::uint64_t steps) = 0;
  [[nodiscard]] virtual const gc::comm::traffic& last_traffic() const = 0;
  /// The reference of `kind` (empty: none yet, or the parameters travel whole).
  [[nodiscard]] virtual std::span<const float> reference(int kind) const = 0;
  virtual void set_reference(int kind, std::span<const float> reference) = 0;
  /// The change compressor's checkpoint record ("" when the parameters travel whole).
  [[nodiscard]] virtual std::string save_compressor() const = 0;
  virtual void load_compressor(const std::string& record) = 0;
};

namespace {

using host_comm = transport_in<gc::backend::host>;
/// What a compressed leader compresses its change with: no memory of its own (the
/// reference is the error feedback), any value coding.
using change_compressor = gc::compressor<gc::backend::host, gc::select::exact_topk, gc::correct::none>;

template <class Sender>
class leader_of final : public any_leader {
  static constexpr bool compressed = !std::is_same_v<Sender, gc::comm::whole_parameters<gc::backend::host>>;

 public:
  /// The leaders send their parameters whole, or (`compressor`, null otherwise) their
  /// changes compressed by it.
  leader_of(transport world, std::optional<transport> group, std::size_t n, const gc::comm::lsgd& policy,
            std::unique_ptr<change_compressor> compressor)
      : compressor_(std::move(compressor)),
        world_(std::move(world), gc::backend::host{}),
        group_(group ? host_comm(std::move(*group), gc::backend::host{}) : world_),
        exchange_(world_, group ? group_ : world_, gc::backend::host{}, n, policy, sender(n)) {}

  gc::comm::leader_round step(std::span<float> params, double loss) override { return exchange_.step(params, loss); }
  std::uint64_t steps() const override { return exchange_.steps(); }
  void set_steps(std::uint64_t steps) override { exchange_.set_steps(steps); }
  const gc::comm::traffic& last_traffic() const override { return exchange_.last_traffic(); }
  std::span<const float> reference(int kind) const override {
    if constexpr (compressed) return exchange_.sender().reference(kind);
    return {};
  }
  void set_reference(int kind, std::span<const float> reference) override {
    if constexpr (compressed) {
      exchange_.sender().set_reference(kind, reference);
    } else {
      gc::detail::require(reference.empty(), gc::errc::invalid_argument,
                          "LeaderExchange: a reference is for leaders that send compressed changes");
    }
  }
  std::string save_compressor() const override {
    if (!compressed) return {};
    std::ostringstream out;
    compressor_->save_state(out);
    return out.str();
  }
  void load_compressor(const std::string& record) override {
    gc::detail::require(compressed || record.empty(), gc::errc::invalid_argument,
                        "LeaderExchange: a compressor's record is for leaders that send compressed changes");
    if (compressed) {
      compressor_->load_state(
          std::span<const std::byte>(reinterpret_cast<const std::byte*>(record.data()), record.size()));
    }
  }

 private:
  Sender sender(std::size_t n) {
    if constexpr (compressed) {
      return Sender(*compressor_);
    } else {
      return Sender(gc::backend::host{}, n);
    }
  }

  std::unique_ptr<change_compressor> compressor_;  // the one the sender refers to (compressed only)
  host_comm world_;
  host_comm group_;
  gc::comm::leader_exchange<host_comm, gc::backend::host, Sender> exchange_;
};

}  // namespace

leader_handle::leader_handle(const py::object& world, const py::object& group, std::int64_t numel,
                             const py::dict& policy, const py::object& compressed) {
  if (numel < 1) invalid("LeaderExchange: numel must be >= 1, got ", numel);
  const auto n = static_cast<std::size_t>(numel);
  options o = options_of(policy);
  policy_ = read_settings(o, gc::comm::lsgd{}, "lsgd");
  o.finish("lsgd");
  transport w = transport_of(group_of(world), torch::kCPU, nullptr);
  std::optional<transport> g;
  if (!group.is_none()) g = transport_of(group_of(group), torch::kCPU, nullptr);
  std::unique_ptr<change_compressor> compressor;
  if (!compressed.is_none()) {
    options c = options_of(compressed.cast<py::dict>());
    compressor = std::make_unique<change_compressor>(gc::backend::host{}, n, read_selector<gc::select::exact_topk>(c),
                                                     gc::correct::none{}, read_encoder(c));
    c.finish("the compressed leader's exact_topk");
  }
  py::gil_scoped_release unlocked;
  if (compressor) {
    impl_ = std::make_unique<leader_of<gc::comm::compressed_changes<change_compressor>>>(
        std::move(w), std::move(g), n, policy_, std::move(compressor));
  } else {
    impl_ = std::make_unique<leader_of<gc::comm::whole_parameters<gc::backend::host>>>(std::move(w), std::move(g), n,
                                                                                       policy_, nullptr);
  }
}

leader_handle::~leader_handle() = default;

py::dict leader_handle::step(torch::Tensor& params, double loss) {
  check_tensor("LeaderExchange.step", "params", params, torch::kFloat, torch::Device(torch::kCPU));
  check_written("LeaderExchange.step", "params", params);
  gc::comm::leader_round round;
  {
    py::gil_scoped_release unlocked;
    round = impl_->step(std::span(params.data_ptr<float>(), static_cast<std::size_t>(params.numel())), loss);
  }
  py::dict out;
  out["held"] = round.held;
  out["group_leader"] = round.group_leader;
  out["global_leader"] = round.global_leader;
  return out;
}

std::uint64_t leader_handle::steps() const { return impl_->steps(); }
void leader_handle::set_steps(std::uint64_t steps) { impl_->set_steps(steps); }

py::dict leader_handle::last_traffic() const {
  const gc::comm::traffic& t = impl_->last_traffic();
  py::dict out;
  out["bytes_sent"] = t.sent;
  out["bytes_received"] = t.received;
  out["collectives"] = t.collectives;
  return out;
}

torch::Tensor leader_handle::reference(int kind) const {
  gc::detail::require(kind == 0 || kind == 1, gc::errc::invalid_argument,
                      "LeaderExchange.reference: kind must be 0 (the group's) or 1 (the global), got ", kind);
  const std::span<const float> r = impl_->reference(kind);
  torch::Tensor out = torch::empty({static_cast<std::int64_t>(r.size())}, torch::kFloat);
  std::copy(r.begin(), r.end(), out.data_ptr<float>());
  return out;
}

void leader_handle::set_reference(int kind, const torch::Tensor& reference) {
  check_tensor("LeaderExchange.set_reference", "reference", reference, torch::kFloat, torch::Device(torch::kCPU));
  const torch::Tensor r = values_of(reference);
  impl_->set_reference(kind, std::span(r.data_ptr<float>(), static_cast<std::size_t>(r.numel())));
}

py::bytes leader_handle::save_compressor() const { return py::bytes(impl_->save_compressor()); }
void leader_handle::load_compressor(const std::string& record) { impl_->load_compressor(record); }

py::dict leader_handle::policy() const {
  py::dict out;
  gc::for_each_setting(policy_, [&](const char* name, const auto& value) { out[name] = value; });
  return out;
}

void bind_leader(py::module_& m) {
  py::class_<leader_handle>(m, "LeaderExchange")
      .def(py::init<const py::object&, const py::object&, std::int64_t, const py::dict&, const py::object&>(),
           py::arg("world"), py::arg("group"), py::arg("numel"), py::arg("policy"), py::arg("compressed"))
      .def("step", &leader_handle::step, py::arg("params"), py::arg("loss"))
      .def_property("steps", &leader_handle::steps, &leader_handle::set_steps)
      .def("last_traffic", &leader_handle::last_traffic)
      .def("reference", &leader_handle::reference, py::arg("kind"))
      .def("set_reference", &leader_handle::set_reference, py::arg("kind"), py::arg("reference"))
      .def("save_compressor", &leader_handle::save_compressor)
      .def("load_compressor", &leader_handle::load_compressor, py::arg("record"))
      .def_property_readonly("policy", &leader_handle::policy);
}

}  // namespace gradcomp_py
