// gradcomp::compressor behind gradcomp_py::any_compressor, built from options: the
// presets of gradcomp/presets.hpp by name, or a composition ("compose") of one selector,
// one corrector (behind clip_norm when max_norm is given) and the index_value encoder.
// Included by one translation unit per backend and selector (generated from names.hpp
// by setup.py and tests/CMakeLists.txt), each instantiating build<Backend, Selector> and
// nothing else, and by each backend's factory (host/factory.cpp, cuda/factory.cu).
#pragma once

#include "api.hpp"
#include "names.hpp"
#include "policy_options.hpp"

#include <gradcomp/comm/cyclic_topk.hpp>
#include <gradcomp/comm/sparse_allreduce.hpp>
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace gradcomp_py {

namespace gc = gradcomp;

// -- the type-erased compressor ---------------------------------------------------------------

/// A process group's transport as a gradcomp::comm::transport in the memory of a
/// compressor on `Backend` (where broadcast and reduce_broadcast read and write): what
/// comm::cyclic_topk and comm::sparse_allreduce run over.
template <class Backend>
class transport_in {
 public:
  using memory = typename Backend::memory;

  transport_in(transport t, const Backend& be) : t_(std::move(t)), backend_(be) {}
  [[nodiscard]] int rank() const noexcept { return t_.rank(); }
  [[nodiscard]] int size() const noexcept { return t_.size(); }
  [[nodiscard]] const Backend& backend() const noexcept { return backend_; }
  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) { t_.all_gather(mine, all); }
  void broadcast(gc::backend_span<Backend, std::uint32_t> data, int root) { t_.broadcast(gc::detail::raw(data), root); }
  void reduce_broadcast(gc::backend_span<Backend, float> values, int root) {
    t_.reduce_broadcast(gc::detail::raw(values), root);
  }
  void all_gather_v(std::span<const std::byte> mine, std::span<const std::uint64_t> sizes, std::span<std::byte> all) {
    t_.all_gather_v(mine, sizes, all);
  }
  void all_to_all(std::span<const std::uint64_t> mine, std::span<std::uint64_t> theirs) { t_.all_to_all(mine, theirs); }
  void all_to_all_v(std::span<const std::byte> send, std::span<const std::uint64_t> send_sizes,
                    std::span<std::byte> recv, std::span<const std::uint64_t> recv_sizes) {
    t_.all_to_all_v(send, send_sizes, recv, recv_sizes);
  }
  void all_reduce_sum(std::span<std::uint32_t> values, std::uint64_t max_sum) { t_.all_reduce_sum(values, max_sum); }

 private:
  transport t_;
  Backend backend_;
};
static_assert(gc::comm::collectives<transport>);
static_assert(gc::comm::transport<transport_in<gc::backend::host>>);

/// What compressor_of needs of a backend beyond gradcomp's API: the execution context of a
/// call on a stream, copies within its memory, its own stream, and waiting for its work
/// (specialised for backend::cuda in cuda/compressors_cuda.cuh).
template <class Backend>
struct backend_ops;

template <>
struct backend_ops<gc::backend::host> {
  /// The host has no streams: a call runs on the calling thread's OpenMP default (what
  /// torch.set_num_threads set), at most the threads the compressor was made with.
  static gc::backend::host on(const gc::backend::host&, void*) { return gc::backend::host{}; }
  static void copy(const gc::backend::host&, const void* from, void* to, std::size_t bytes) {
    if (bytes != 0) std::memcpy(to, from, bytes);
  }
  static void* stream(const gc::backend::host&) noexcept { return nullptr; }
  static void wait(const gc::backend::host&) noexcept {}
};

template <class Compressor>
class compressor_of final : public any_compressor {
  using backend_type = typename Compressor::backend_type;
  using selector_type = typename Compressor::selector_type;

 public:
  template <class Make>
  explicit compressor_of(Make&& make) : c_(make()) {}
  /// Nothing may still run on the compressor's memory when it goes back to the pool.
  ~compressor_of() override { backend_ops<backend_type>::wait(c_.backend()); }

  std::size_t size() const override { return c_.size(); }
  std::size_t max_message_bytes() const override { return c_.max_message_bytes(); }
  std::uint64_t step() const override { return c_.step(); }
  std::string signature() const override {
    return gc::detail::signature_of(c_.selector(), c_.corrector(), c_.encoder());
  }
  void* stream() const override { return backend_ops<backend_type>::stream(c_.backend()); }

  written compress(void* stream, const void* grad, element type, std::byte* out, std::size_t out_size,
                   bool staged) override {
    const backend_type on = backend_ops<backend_type>::on(c_.backend(), stream);
    const typename Compressor::message_bytes o(out, out_size);
    const auto m =
        with_gradient(grad, type, [&](auto g) { return staged ? c_.stage(on, g, o) : c_.compress(on, g, o); });
    return {m.bytes().size(), m.count()};
  }
  void accept_staged() override { c_.accept_staged(); }
  bool has_staged() const override { return c_.has_staged(); }
  void preview(void* stream, const void* grad, element type, float* out) override {
    const backend_type on = backend_ops<backend_type>::on(c_.backend(), stream);
    const auto acc = with_gradient(grad, type, [&](auto g) { return c_.preview(on, g); });
    backend_ops<backend_type>::copy(on, acc.data(), out, acc.size() * sizeof(float));
  }

  std::optional<double> density() const override {
    if constexpr (requires { c_.selector().density; }) {
      if (c_.selector().density > 0.0) return c_.selector().density;
    }
    return std::nullopt;
  }
  void set_density(double d) override {
    if constexpr (requires { c_.set_density(d); }) {
      c_.set_density(d);
    } else {
      gc::detail::fail(gc::errc::invalid_argument, "set_density: ", c_.selector().name(), " has no density");
    }
  }
  void set_indices(std::span<const std::uint32_t> indices) override {
    if constexpr (requires { c_.set_indices(indices); }) {
      c_.set_indices(indices);
    } else {
      gc::detail::fail(gc::errc::invalid_argument, "set_indices: ", c_.selector().name(),
                       " chooses its own indices (given_indices takes them)");
    }
  }

  std::string save_state() const override {
    std::ostringstream out;
    c_.save_state(out);
    return out.str();
  }
  void load_state(const std::string& record) override {
    c_.load_state(std::span<const std::byte>(reinterpret_cast<const std::byte*>(record.data()), record.size()));
  }
  std::size_t state_arrays() const override { return Compressor::corrector_type::state_arrays; }
  std::vector<float> corrector_state(std::size_t a) const override {
    const auto s = c_.corrector_state(a);
    return {s.begin(), s.end()};
  }

  std::unique_ptr<cyclic_exchange> cyclic(transport t, double leader_density) override;
  std::unique_ptr<sparse_exchange> sparse(transport t, std::size_t k) override;

 private:
  // Calls `f` with the gradient as a view (of the backend's memory) of its element type.
  template <class F>
  decltype(auto) with_gradient(const void* grad, element type, F&& f) {
    using half_view = typename Compressor::template view<const gc::half>;
    using bfloat16_view = typename Compressor::template view<const gc::bfloat16>;
    using float_view = typename Compressor::template view<const float>;
    switch (type) {
      case element::f16:
        return f(half_view(static_cast<const gc::half*>(grad), c_.size()));
      case element::bf16:
        return f(bfloat16_view(static_cast<const gc::bfloat16*>(grad), c_.size()));
      case element::f32:
        break;
    }
    return f(float_view(static_cast<const float*>(grad), c_.size()));
  }

  Compressor c_;
};

/// comm::cyclic_topk over a torch.distributed transport.
template <class Compressor>
class cyclic_exchange_of final : public cyclic_exchange {
  using backend_type = typename Compressor::backend_type;

 public:
  cyclic_exchange_of(Compressor& c, transport t, double leader_density)
      : comm_(std::move(t), c.backend()), exchange_(comm_, c, gc::select::exact_topk{.density = leader_density}) {}

  written step(const float* grad, float* dense, std::size_t n, float scale, std::byte* out,
               std::size_t out_size) override;

 private:
  transport_in<backend_type> comm_;
  gc::comm::cyclic_topk<gc::select::exact_topk, Compressor, transport_in<backend_type>> exchange_;
};

template <class Compressor>
written cyclic_exchange_of<Compressor>::step(const float* grad, float* dense, std::size_t n, float scale,
                                             std::byte* out, std::size_t out_size) {
  const auto m = exchange_.step(typename Compressor::template view<const float>(grad, n),
                                typename Compressor::template view<float>(dense, n), scale);
  gc::detail::require(m.bytes().size() <= out_size, gc::errc::buffer_too_small, "cyclic exchange: the message of ",
                      m.bytes().size(), " bytes does not fit ", out_size);
  backend_ops<backend_type>::copy(comm_.backend(), m.bytes().data(), out, m.bytes().size());
  return {m.bytes().size(), m.count()};
}

template <class Compressor>
std::unique_ptr<cyclic_exchange> compressor_of<Compressor>::cyclic(transport t, double leader_density) {
  if constexpr (std::is_same_v<selector_type, gc::select::given_indices>) {
    return std::make_unique<cyclic_exchange_of<Compressor>>(c_, std::move(t), leader_density);
  } else {
    gc::detail::fail(gc::errc::invalid_argument, "cyclic exchange: the compressor's selector is ", c_.selector().name(),
                     "; ScaleCom's ranks compress at the leader's indices (method='scalecom')");
  }
}

/// comm::sparse_allreduce over a torch.distributed transport.
template <class Compressor>
class sparse_exchange_of final : public sparse_exchange {
  using backend_type = typename Compressor::backend_type;
  template <class T>
  using view = typename Compressor::template view<T>;

 public:
  sparse_exchange_of(Compressor& c, transport t, std::size_t k)
      : comm_(std::move(t), c.backend()), exchange_(comm_, c, k) {}

  void stage(const float* grad, float* dense, std::size_t n, float scale) override {
    (void)exchange_.stage(view<const float>(grad, n), view<float>(dense, n), scale);
  }
  void accept() override { exchange_.accept_staged(); }
  void reduce_scatter(const float* grad, std::size_t n, float* shard, std::size_t shard_n, float scale) override {
    exchange_.reduce_scatter(view<const float>(grad, n), view<float>(shard, shard_n), scale);
  }
  void drop() noexcept override { exchange_.drop_staged(); }
  [[nodiscard]] std::size_t k() const override { return exchange_.k(); }
  [[nodiscard]] std::uint64_t entries() const override { return exchange_.last_traffic().entries; }

 private:
  transport_in<backend_type> comm_;
  gc::comm::sparse_allreduce<Compressor, transport_in<backend_type>> exchange_;
};

template <class Compressor>
std::unique_ptr<sparse_exchange> compressor_of<Compressor>::sparse(transport t, std::size_t k) {
  return std::make_unique<sparse_exchange_of<Compressor>>(c_, std::move(t), k);
}

/// A compressor_of whatever `make()` returns, behind any_compressor.
template <class Make>
std::unique_ptr<any_compressor> erased(Make&& make) {
  using compressor_type = std::invoke_result_t<Make&>;
  return std::make_unique<compressor_of<compressor_type>>(std::forward<Make>(make));
}

// -- presets and compositions, one selector at a time -----------------------------------------

/// The preset `method` if it uses `Selector`, or a composition with `Selector`.
template <class Backend, class Selector>
std::unique_ptr<any_compressor> build(const Backend& be, std::size_t n, const std::string& method, options& o) {
  namespace presets = gc::presets;
  using S = Selector;
  if constexpr (std::is_same_v<S, gc::select::exact_topk>) {
    if (method == "topk_ef") {
      const presets::topk_ef_options p{.density = o.number("density", 0.001)};
      return erased([&] { return presets::topk_ef(be, n, p); });
    }
  }
  if constexpr (std::is_same_v<S, gc::select::sampled_threshold> || std::is_same_v<S, gc::select::exact_topk>) {
    if (method == "dgc") {
      const presets::dgc_options d{};
      const presets::dgc_options p{.density = o.number("density", d.density),
                                   .momentum = static_cast<float>(o.number("momentum", d.momentum)),
                                   .nesterov = o.flag("nesterov", d.nesterov),
                                   .max_norm = static_cast<float>(o.number("max_norm", d.max_norm)),
                                   .workers = static_cast<int>(o.integer("workers", d.workers)),
                                   .seed = o.seed("selector", d.seed),
                                   .reuse_threshold = o.flag("reuse_threshold", d.reuse_threshold)};
      if constexpr (std::is_same_v<S, gc::select::exact_topk>) {  // dgc with selector="exact_topk"
        return erased([&] { return presets::dgc(be, n, p, gc::select::exact_topk{.density = p.density}); });
      } else {
        return erased([&] { return presets::dgc(be, n, p); });
      }
    }
  }
  if constexpr (std::is_same_v<S, gc::select::chunk_local>) {
    if (method == "adacomp") {
      const presets::adacomp_options p{.bin = o.size("bin", 50)};
      return erased([&] { return presets::adacomp(be, n, p); });
    }
  }
  if constexpr (std::is_same_v<S, gc::select::random_k>) {
    if (method == "randomk_ef") {
      const presets::randomk_ef_options p{.density = o.number("density", 0.001), .seed = o.seed("selector", 0)};
      return erased([&] { return presets::randomk_ef(be, n, p); });
    }
  }
  if constexpr (std::is_same_v<S, gc::select::threshold>) {
    if (method == "threshold_ef") {
      const presets::threshold_ef_options p{.tau = static_cast<float>(o.number("tau", 0.0))};
      return erased([&] { return presets::threshold_ef(be, n, p); });
    }
  }
  if constexpr (std::is_same_v<S, gc::select::given_indices>) {
    if (method == "scalecom") {
      const presets::scalecom_options p{.density = o.number("density", 0.001),
                                        .beta = static_cast<float>(o.number("beta", 1.0))};
      return erased([&] { return presets::scalecom(be, n, p); });
    }
  }
  // A composition.
  const S selector = read_selector<S>(o, n);
  const gc::encode::index_value encoder = read_encoder(o);
  const std::string corrector = o.text("corrector", "none");
  const auto with = [&](auto c) -> std::unique_ptr<any_compressor> {
    if (o.has("max_norm")) {
      const gc::correct::clip_norm clip{.max_norm = static_cast<float>(o.number("max_norm", 0.0)),
                                        .workers = static_cast<int>(o.integer("workers", 1))};
      if constexpr (decltype(c)::state_arrays == 0) {
        gc::detail::fail(gc::errc::invalid_argument, "corrector ", c.name(),
                         " cannot be chained behind clip_norm (max_norm): name a corrector with memory, or "
                         "corrector='clip_norm'");
      } else {
        return erased([&] { return gc::compressor{be, n, selector, gc::correct::chain{clip, c}, encoder}; });
      }
    }
    return erased([&] { return gc::compressor{be, n, selector, c, encoder}; });
  };
  if (corrector == "none") return with(gc::correct::none{});
  if (corrector == "error_feedback") {
    return with(gc::correct::error_feedback{.beta = static_cast<float>(o.number("beta", 1.0)),
                                            .gamma = static_cast<float>(o.number("gamma", 1.0))});
  }
  if (corrector == "momentum") {
    return with(gc::correct::momentum{.beta = static_cast<float>(o.number("beta", 0.9)),
                                      .nesterov = o.flag("nesterov", false),
                                      .masking = o.flag("masking", true)});
  }
  if (corrector == "low_pass") return with(gc::correct::low_pass{.beta = static_cast<float>(o.number("beta", 1.0))});
  if (corrector == "clip_norm") {
    const gc::correct::clip_norm clip{.max_norm = static_cast<float>(o.number("max_norm", 0.0)),
                                      .workers = static_cast<int>(o.integer("workers", 1))};
    return erased([&] { return gc::compressor{be, n, selector, clip, encoder}; });
  }
  gc::detail::fail(gc::errc::invalid_argument,
                   "corrector must be one of none, error_feedback, momentum, low_pass, "
                   "clip_norm; got '",
                   corrector, "'");
}

// -- which selector a method uses (names.hpp) -----------------------------------------------------

/// Builds `method` for `n` elements on `be`, dispatching on its selector to the
/// build<Backend, S> instantiated in that selector's translation unit, then refuses any
/// option that no policy took.
template <class Backend>
std::unique_ptr<any_compressor> make(const Backend& be, std::size_t n, const std::string& method, options& o) {
  std::string selector;
#define GRADCOMP_PY_PRESET_SELECTOR(M, S) \
  if (method == #M) selector = #S;
  GRADCOMP_PY_PRESETS(GRADCOMP_PY_PRESET_SELECTOR)
#undef GRADCOMP_PY_PRESET_SELECTOR
  if (method == "dgc") selector = o.text("selector", selector);  // dgc with selector="exact_topk"
  if (method == "compose") selector = o.text("selector", "");
  gc::detail::require(!selector.empty() || method != "compose", gc::errc::invalid_argument,
                      "method 'compose' needs selector=");
  gc::detail::require(!selector.empty(), gc::errc::invalid_argument, "method must be one of ", joined(method_names()),
                      "; got '", method, "'");
  gc::detail::require(method != "dgc" || selector == "sampled_threshold" || selector == "exact_topk",
                      gc::errc::invalid_argument, "dgc's selector must be sampled_threshold or exact_topk, got '",
                      selector, "'");
  std::unique_ptr<any_compressor> made;
#define GRADCOMP_PY_DISPATCH(S) \
  if (selector == #S) made = build<Backend, gc::select::S>(be, n, method, o);
  GRADCOMP_PY_SELECTORS(GRADCOMP_PY_DISPATCH)
#undef GRADCOMP_PY_DISPATCH
  gc::detail::require(made != nullptr, gc::errc::invalid_argument, "selector must be one of ", joined(selector_names()),
                      "; got '", selector, "'");
  o.finish(method);
  return made;
}

/// Declares (`Kind` = `extern template`) or instantiates (`Kind` = `template`)
/// build<Backend, select::S>: each selector's instantiation has a translation unit of its
/// own (generated from names.hpp), which keeps the compiler's memory and time per file low.
#define GRADCOMP_PY_BUILD(Kind, Backend, S)                                                                           \
  Kind std::unique_ptr<any_compressor> build<Backend, gc::select::S>(const Backend&, std::size_t, const std::string&, \
                                                                     options&);

}  // namespace gradcomp_py
