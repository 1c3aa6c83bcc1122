/// \file compressor.hpp
/// The facade: one selector, one corrector and one encoder composed on one backend.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/detail/core/density.hpp>
#include <gradcomp/detail/core/non_finite.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/detail/step/state_io.hpp>
#include <gradcomp/detail/step/step_engines.hpp>
#include <gradcomp/detail/step/widening.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/float16.hpp>
#include <gradcomp/held_memory.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/registry.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN

/// Compresses successive gradients of one tensor of n elements.
///
/// All state and workspace is allocated here, once; compress() allocates nothing, unless
/// release_workspace() gave the workspace back (the next step allocates it again). Every
/// member that throws gradcomp::error leaves the compressor as it was.
///
/// The parameters are checked against the concepts of concepts.hpp by static assertions
/// rather than constraints, so misuse reports the missing member by name.
template <class Backend, class Selector, class Corrector = correct::none, class Encoder = encode::index_value>
class compressor {
  static_assert(detail::check_policies<Backend, Selector, Corrector, Encoder>());
  static_assert(detail::check_engines<Backend, Selector, Corrector, Encoder>());

  // Backends whose steps run on a device (backend::cuda): messages and gradients are
  // device memory, and a step can be queued without reading anything back.
  static constexpr bool on_device = std::is_same_v<typename Backend::message_memory, device_memory>;

  using engines = detail::step_engines<Backend, Selector, Corrector, Encoder>;
  using select_engine = typename engines::select_engine;

 public:
  using backend_type = Backend;      ///< where it runs
  using selector_type = Selector;    ///< which entries are sent
  using corrector_type = Corrector;  ///< what is remembered
  using encoder_type = Encoder;      ///< how messages are written

  /// \throws gradcomp::error if n is 0 or above 2^32 - 1, or a policy's parameters are invalid.
  compressor(Backend backend, std::size_t n, Selector selector, Corrector corrector = {}, Encoder encoder = {})
      : backend_(detail::checked_backend(backend, n, selector, corrector, encoder)),
        n_(n),
        selector_(selector),
        corrector_(corrector),
        encoder_(encoder),
        engines_(backend_, selector_, corrector_, encoder_, n) {}

  /// Elements of the tensor.
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// Successful compress() calls so far; seeds the sampled policies.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  /// Size of the largest message compress() can write with the current parameters.
  [[nodiscard]] std::size_t max_message_bytes() const { return encoder_.max_bytes(n_, selector_.max_selected(n_)); }
  /// The bytes this compressor holds now: its state (the corrector's committed arrays, 4
  /// bytes per element and array in float32, bits/8 + 1/block with correct::compact) and
  /// the workspace its steps use (held_memory.hpp). Reads nothing of the backend's memory.
  [[nodiscard]] held_memory memory_bytes() const {
    held_memory use = engines_.held();
    use.workspace += wide_.held_bytes();
    return use;
  }

  /// Gives back the workspace (memory_bytes().workspace: the selection's lists, the
  /// selector's scratch, the encoder's buffers, the second float32 copy of the state, a
  /// 16-bit gradient's float32 copy, a preview's buffer) until the next step allocates
  /// it again; the state, and what the selector carries from step to step, stay, so the
  /// steps that follow write what they would have written. For compressors that take
  /// turns, as FSDP's parameter groups do, so that together they hold their states and
  /// one workspace at a time; the price is an allocation per buffer at each step. On
  /// backend::cuda, waits for the last call's work first. Views the compressor returned
  /// into its workspace (preview(), corrector_state() of a device or compact state) are
  /// given back with it.
  /// \throws gradcomp::error (invalid_argument) while a step is staged (its commit reads
  ///         the workspace), or once compress_async() has run (a CUDA graph may hold the
  ///         workspace's addresses); nothing changes then.
  void release_workspace() {
    detail::require_current_device(backend_, "release_workspace");
    detail::require(!staged_, errc::invalid_argument,
                    "release_workspace: a step is staged; accept_staged() or drop_staged() it first");
    detail::require(!async_ran_, errc::invalid_argument,
                    "release_workspace: compress_async() has run on this compressor, and a CUDA graph may hold its "
                    "workspace's addresses");
    engines_.release_workspace();
    wide_.release();
  }
  /// Allocates now the step's workspace that release_workspace() gave back (the next
  /// step would allocate it first): for a collective whose ranks must meet an
  /// allocation's failure alike, before any of them has heard of the others
  /// (comm::cyclic_topk).
  /// \throws what the backend's allocation throws; nothing changes then.
  void hold_workspace() {
    detail::require_current_device(backend_, "hold_workspace");
    engines_.hold_workspace(selector_, encoder_);
  }

  /// The corrector's committed memory array `a` (< Corrector::state_arrays), e.g. the
  /// error-feedback residual, readable on the host (a copy, for device memory).
  [[nodiscard]] std::span<const float> corrector_state(std::size_t a) const {
    detail::require_current_device(backend_, "corrector_state");
    detail::require(std::cmp_less(a, Corrector::state_arrays), errc::invalid_argument, "corrector_state: array ", a,
                    " does not exist, ", corrector_.name(), " keeps ", Corrector::state_arrays);
    return engines_.correct().committed(a);
  }

  /// \name The policies in force
  /// @{
  [[nodiscard]] const Backend& backend() const noexcept { return backend_; }        ///< the backend
  [[nodiscard]] const Selector& selector() const noexcept { return selector_; }     ///< the selector
  [[nodiscard]] const Corrector& corrector() const noexcept { return corrector_; }  ///< the corrector
  [[nodiscard]] const Encoder& encoder() const noexcept { return encoder_; }        ///< the encoder
  /// @}

  /// \name Where the arguments live
  /// Gradients and what preview() returns are views of the backend's memory, messages
  /// views of the memory where it writes them (memory.hpp): std::span and
  /// gradcomp::message on backend::host and backend::kokkos of a host space;
  /// device_span and gradcomp::device_message on backend::cuda, so that a device
  /// message cannot be handed to the host's decode() by mistake.
  /// @{
  template <class T>
  using view = backend_span<Backend, T>;                                 ///< a view of the backend's memory
  using message_bytes = message_span<Backend, std::byte>;                ///< the buffer a message is written to
  using message_type = basic_message<typename Backend::message_memory>;  ///< what compress() returns
  /// @}

  /// Runs one step: updates the corrector's memory with `grad`, selects, encodes into
  /// `out` and commits what was sent.
  /// \param grad the gradient: n elements of float32, IEEE half or bfloat16 in the
  ///             backend's memory (gradient_view). Each 16-bit value is widened to
  ///             float32 exactly as it is read; state and arithmetic stay float32. The
  ///             corrector's pass reads a 16-bit gradient as it is, with no copy of it,
  ///             except where the corrector is correct::none (its acc is the gradient
  ///             itself), its engine lacks corrector_engine_reads (a user's), or the
  ///             selector reads the gradient too (chunk_local): there it is widened
  ///             first into n floats of workspace that the first such call (and the
  ///             first after release_workspace()) allocates.
  /// \param out  at least max_message_bytes() bytes: host memory on the host and Kokkos
  ///             backends, device memory on backend::cuda (where the step's work is
  ///             queued on the stream and one status record is read back)
  /// \returns a view of the message written at the front of `out`
  /// \throws gradcomp::error if grad.size() != n, `out` is too small, or grad (or the
  ///         accumulated value) holds a NaN or infinity; state and `out` are then unchanged.
  template <gradient_view<Backend> Grad>
  message_type compress(const Grad& grad, message_bytes out) {
    return compress(backend_, grad, out);
  }

  /// Runs one step like compress() but keeps its outcome aside: the message is written
  /// to `out` and the new state is computed, yet until accept_staged() (which commits
  /// what was sent, or a part of it) the compressor's committed state, step() and
  /// checkpoints stay those before the step. drop_staged() or a later
  /// compress(), stage(), set_density() or load_state() drops the staged step. For
  /// collectives in which every rank must hear that the others' steps were accepted
  /// before any commits (the PyTorch DDP hook): stage, agree, then accept or drop.
  /// (The in-place update of a clipping step is not used: it could not be dropped.)
  /// \throws gradcomp::error as compress() does; nothing is staged then.
  template <gradient_view<Backend> Grad>
  message_type stage(const Grad& grad, message_bytes out) {
    return stage(backend_, grad, out);
  }

  /// Makes the step of the last stage() current, as compress() would have.
  /// \throws gradcomp::error (invalid_argument) if no step is staged.
  void accept_staged() { accept_staged(backend_); }

  /// Makes the step of the last stage() current as if its selector had chosen only the
  /// selected entries whose index is in `kept` (host memory, ascending; indices the
  /// step did not select are ignored): those are committed as compress() commits what
  /// it sends, and every other entry keeps the corrector's update, so what the global
  /// selection of comm::sparse_allreduce drops stays in this rank's memory
  /// (docs/algorithms.md, "Global top-k").
  /// \throws gradcomp::error (invalid_argument) if no step is staged or `kept` does not
  ///         ascend strictly; nothing changes then.
  void accept_staged(std::span<const std::uint32_t> kept) { accept_staged(backend_, kept); }

  /// accept_staged() with the commit queued on `context`.
  void accept_staged(const Backend& context) { commit_staged(context, nullptr); }
  /// accept_staged(kept) with the commit queued on `context`.
  void accept_staged(const Backend& context, std::span<const std::uint32_t> kept) {
    for (std::size_t j = 1; j < kept.size(); ++j) {
      detail::require(kept[j - 1] < kept[j], errc::invalid_argument, "accept_staged: kept must ascend strictly, kept[",
                      j - 1, "] = ", kept[j - 1], " and kept[", j, "] = ", kept[j]);
    }
    commit_staged(context, &kept);
  }

  /// accept_staged(kept) with `kept` in the backend's memory where that is a device's
  /// (a collective's selection, which arrives there: comm::sparse_allreduce): nothing is
  /// copied or read back, and so its order is not checked; it must ascend strictly.
  void accept_staged(view<const std::uint32_t> kept)
    requires(!Backend::host_accessible)
  {
    const std::span<const std::uint32_t> there = detail::raw(kept);
    commit_staged(backend_, &there, true);
  }

  /// Drops a stage()d step (if any): the compressor goes on from its committed state,
  /// as after a collective that refused the step.
  void drop_staged() noexcept { staged_ = false; }

  /// Whether a stage()d step waits for accept_staged().
  [[nodiscard]] bool has_staged() const noexcept { return staged_; }

  /// What a staged step sends (staged_selection()), as views of the backend's memory.
  struct staged_entries {
    view<const std::uint32_t> index;    ///< the selection's indices, ascending
    view<const float> values;           ///< the values sent for them, as a receiver decodes them
    const detail::step_status* status;  ///< the step's status, in the backend's memory: `count` entries
  };
  /// What the staged step sends: its selected indices (ascending) and, for each, the
  /// value a receiver decodes from the message, of which the first `status->count` are
  /// the step's (the count stays in the backend's memory too). For exchanges that move
  /// the entries rather than the message (comm::sparse_allreduce::reduce_scatter).
  /// Valid until the next step or release_workspace().
  /// \throws gradcomp::error (invalid_argument) if no step is staged.
  [[nodiscard]] staged_entries staged_selection() const {
    detail::require(staged_, errc::invalid_argument, "staged_selection: no step is staged");
    const auto [index, values] = engines_.sent_entries();
    return {as_view(index), as_view(values), engines_.status_record()};
  }

  /// What compress(grad) would rank now: the corrector's update of the committed state
  /// with `grad` (clipping included; grad itself without a corrector), in the backend's
  /// memory. Changes no state. ScaleCom's leader selects from it, and comm::cyclic_topk's
  /// ranks tell each other with it whether their steps will be accepted
  /// (preview_queued). The first call allocates n floats; the view is valid until the
  /// next call or release_workspace().
  /// \throws gradcomp::error if grad.size() != n, or the value holds a NaN or infinity
  ///         (the error compress would raise).
  template <gradient_view<Backend> Grad>
  view<const float> preview(const Grad& grad) {
    return preview(backend_, grad);
  }

  /// \name An execution context per call
  /// compress(), stage(), preview() and compress_async() run on the backend the
  /// compressor was made with, or on `context`, given first: a value of the same backend
  /// type that shares its memory and says where this call's work is queued (as Kokkos
  /// Kernels takes an execution-space instance first). backend::host: the call's threads,
  /// at most the constructor's, which sized the per-thread workspace; results are
  /// identical for any thread count. backend::kokkos: an execution-space instance.
  /// backend::cuda: a stream (PyTorch's current stream, which changes from call to
  /// call) on the compressor's device (`device` -1 takes it). They throw as the calls
  /// without a context do, and gradcomp::error (invalid_argument) naming the context's
  /// threads or device where it does not fit the compressor; nothing changes then.
  /// The compressor does not order calls made on different streams: its state is device
  /// memory that one call writes and the next reads, so a caller that changes streams
  /// between calls makes the new one wait for the old (an event), as for any memory used
  /// on two streams, as backend::stream_order (backend/stream_order.cuh) does.
  /// @{

  /// compress() on `context`.
  template <gradient_view<Backend> Grad>
  message_type compress(const Backend& context, const Grad& grad, message_bytes out) {
    return step_on(context, grad, out, /*commit=*/true);
  }
  /// stage() on `context`.
  template <gradient_view<Backend> Grad>
  message_type stage(const Backend& context, const Grad& grad, message_bytes out) {
    return step_on(context, grad, out, /*commit=*/false);
  }
  /// preview() on `context`.
  template <gradient_view<Backend> Grad>
  view<const float> preview(const Backend& context, const Grad& grad) {
    return as_view(preview_on(context, grad, /*read=*/true).first);
  }
  /// A preview() queued, with nothing read back.
  struct queued_preview {
    view<const float> acc;              ///< the value, valid as preview()'s
    const detail::step_status* status;  ///< its status, in the backend's memory: `non_finite` set where it is not
  };
  /// preview() on `context` with nothing read back: the value is queued and its status
  /// stays in the backend's memory (comm::cyclic_topk, whose ranks tell each other their
  /// verdicts where the memory is); preview() reads it and raises the error.
  /// \throws gradcomp::error if grad.size() != n.
  template <gradient_view<Backend> Grad>
  queued_preview preview_queued(const Backend& context, const Grad& grad) {
    const auto [acc, status] = preview_on(context, grad, /*read=*/false);
    return {as_view(acc), status};
  }
  /// stage() on `context` with nothing read back: the step is queued and staged, and
  /// its status (whether it met a NaN or infinity, its count, its message's size) stays
  /// in the backend's memory at the pointer returned, valid until the next step. For a
  /// caller that reads many steps' outcomes at once (the DDP hook's device exchange:
  /// the message framed and sent on the device, one host read per training step).
  /// staged_message() reads it later, as stage() would have returned it or thrown.
  /// \throws gradcomp::error if grad.size() != n or `out` is too small; nothing is
  ///         staged then.
  template <gradient_view<Backend> Grad>
  const detail::step_status* stage_queued(const Backend& context, const Grad& grad_at, message_bytes out_at) {
    const Backend on = detail::context_for(backend_, "stage", context);
    const std::span<std::byte> out = detail::raw(out_at);
    staged_ = false;
    with_gradient(on, "stage", grad_at, [&](auto grad) {
      check_step("stage", grad, out);
      const in_place_off guard{*this};
      engines_.queue(on, selector_, corrector_, encoder_, grad, out, step_, /*commit=*/false);
    });
    staged_ = true;
    return engines_.status_record();
  }
  /// The message of the step stage_queued() staged from `grad` into `out`, read from its
  /// status (on a device, this waits for the step).
  /// \throws gradcomp::error (non_finite) as stage() would have, naming the first value
  ///         that is not finite; the step is dropped then. (invalid_argument) if no step
  ///         is staged.
  template <gradient_view<Backend> Grad>
  message_type staged_message(const Backend& context, const Grad& grad_at, message_bytes out_at) {
    detail::require(staged_, errc::invalid_argument, "staged_message: no step is staged");
    const Backend on = detail::context_for(backend_, "staged_message", context);
    const detail::step_status status = engines_.status(on);
    if (status.non_finite != 0) {
      staged_ = false;
      with_gradient(on, "compress", grad_at,
                    [&](auto grad) { detail::report_non_finite(on, "compress", grad, engines_.acc(grad)); });
    }
    return written(detail::raw(out_at), static_cast<std::size_t>(status.bytes), status.count);
  }
  /// compress_async() on `context`: the step is queued on its stream (capture that
  /// stream into a CUDA graph); last_step_finite() reads the status on it.
  message_type compress_async(const Backend& context, view<const float> grad_at, message_bytes out_at)
    requires(on_device && Corrector::state_arrays == 0 && detail::engine_has_fixed_count<select_engine, Selector>)
  {
    const Backend on = detail::context_for(backend_, "compress_async", context);
    const std::span<const float> grad = detail::raw(grad_at);
    const std::span<std::byte> out = detail::raw(out_at);
    check_step("compress_async", grad, out);
    detail::require(engines_.holds_workspace(), errc::invalid_argument,
                    "compress_async: the workspace was given back (release_workspace); a compress() allocates it "
                    "again, outside any graph capture");
    const std::size_t count = engines_.select(selector_).fixed_count(selector_);
    const auto bytes = engines::encode_engine::fixed_bytes(encoder_, n_, count);
    detail::require(bytes.has_value(), errc::invalid_argument, "compress_async: the size of ", encoder_.name(),
                    " messages depends on the data; use compress (raw32 or bitmap indices give a fixed size)");
    // A graph replays the captured kernels with their arguments, the step number among
    // them: a coding that rounds at random would draw the same numbers at every replay.
    if constexpr (requires { encoder_.depends_on_step(); }) {
      detail::require(!encoder_.depends_on_step(), errc::invalid_argument, "compress_async: ", encoder_.name(),
                      " rounds at random with the step number, which a replayed graph would repeat; use compress");
    }
    engines_.queue(on, selector_, corrector_, encoder_, grad, out, step_);
    finish_step();
    last_async_ = on;
    async_ran_ = true;
    return written(out, *bytes, count);
  }
  /// @}

  /// Queues one step on backend::cuda's stream and returns at once, reading nothing
  /// back, so that the step can be captured in a CUDA graph and replayed (its workspace
  /// is then kept: release_workspace() refuses from the first call on). For
  /// configurations whose message size is known in advance: a selector with a fixed
  /// count (exact_topk), an index coding of fixed size (raw32 or bitmap; any value
  /// coding that does not round at random) and a corrector without state. Whether the step met a
  /// NaN or infinity (and so wrote nothing to `out`) is last_step_finite()'s answer.
  /// \throws gradcomp::error if grad.size() != n, `out` is too small, the encoder's
  ///         message size depends on the data, or its values round at random (qsgd).
  message_type compress_async(view<const float> grad, message_bytes out)
    requires(on_device && Corrector::state_arrays == 0 && detail::engine_has_fixed_count<select_engine, Selector>)
  {
    return compress_async(backend_, grad, out);
  }

  /// Whether the last step queued by compress_async met no NaN or infinity (a read
  /// from the device that waits for that step's stream).
  [[nodiscard]] bool last_step_finite() const
    requires on_device
  {
    return last_async_.read(engines_.status_record()).non_finite == 0;
  }

  /// Changes the selector's density from the next step on (warm-up schedules).
  /// \throws gradcomp::error if d is outside (0, 1].
  void set_density(double d)
    requires requires(Selector s) { s.density = d; }
  {
    detail::require_current_device(backend_, "set_density");
    const Selector next = detail::with_density(selector_, d);
    next.validate(n_);
    engines_.reserve(next, encoder_);
    selector_ = next;
    staged_ = false;
  }

  /// Sets the indices that a given_indices selector sends from the next step on.
  /// \throws gradcomp::error unless they ascend strictly, are below n and number at
  ///         most the selector's capacity (max_selected(n)); the previous set stays then.
  void set_indices(std::span<const std::uint32_t> indices)
    requires requires(detail::engine_for<Selector, Backend>& e, const Selector& s) { e.set_indices(s, indices); }
  {
    detail::require_current_device(backend_, "set_indices");
    engines_.select(selector_).set_indices(selector_, indices);
  }
  /// set_indices() of indices in the backend's memory, checked there with nothing read
  /// back, the work queued on `context` (ScaleCom's ranks, which receive the leader's
  /// indices where the memory is). Where one is not below n or does not exceed the one
  /// before, bit 0 of fault[0] (the backend's memory) is set, and the steps that follow
  /// send the first indices.size() indices instead, so that a step stays inside the
  /// arrays and its message well formed: the caller refuses it.
  /// \throws gradcomp::error (invalid_argument) if indices.size() exceeds the selector's
  ///         capacity (max_selected(n)) or fault.size() != 1; nothing changes then.
  void set_indices_queued(const Backend& context, view<const std::uint32_t> indices, view<std::uint32_t> fault)
    requires requires(detail::engine_for<Selector, Backend>& e, const Backend& b, const Selector& s,
                      std::span<const std::uint32_t> i, std::uint32_t* f) { e.set_indices_queued(b, s, i, f); }
  {
    const Backend on = detail::context_for(backend_, "set_indices_queued", context);
    detail::require(fault.size() == 1, errc::invalid_argument, "set_indices_queued: fault.size() = ", fault.size(),
                    ", not 1");
    engines_.select(selector_).set_indices_queued(on, selector_, detail::raw(indices), detail::raw(fault).data());
  }

  /// Writes the step counter, the selector's density and the corrector's memory
  /// (detail/step/state_io.hpp).
  /// \throws gradcomp::error (io) if the stream fails.
  void save_state(std::ostream& out) const {
    detail::require_current_device(backend_, "save_state");
    if constexpr (detail::engine_saves_state<select_engine>) {
      detail::write_state<Corrector::state_arrays>(out, signature(), n_, step_, density(), engines_.correct(),
                                                   engines_.saved_selector_state());
    } else {
      detail::write_state<Corrector::state_arrays>(out, signature(), n_, step_, density(), engines_.correct(), nullptr);
    }
  }

  /// Restores what save_state wrote, for a compressor of the same policies and n. The
  /// whole record is read and checked before anything changes; the stream may go on
  /// after it (several records in one file).
  /// \throws gradcomp::error if the stream fails or the record does not match.
  void load_state(std::istream& in) { load_record(detail::state_reader(in, signature(), n_, Corrector::state_arrays)); }

  /// load_state() of `record`, which must hold one record and nothing after it.
  /// \throws gradcomp::error (corrupt_message) for bytes after the record, and as
  ///         load_state(std::istream&) does; nothing changes then.
  void load_state(std::span<const std::byte> record) {
    std::istringstream in(std::string(reinterpret_cast<const char*>(record.data()), record.size()));
    load_record(detail::state_reader(in, signature(), n_, Corrector::state_arrays, record.size()));
  }

 private:
  // A record read and checked whole (detail/step/state_io.hpp) made current.
  void load_record(const detail::state_reader& r) {
    detail::require_current_device(backend_, "load_state");
    [[maybe_unused]] const auto saved_selector = detail::restored_selector_state<select_engine>(r, selector_.name());
    const Selector next = detail::restored_selector(r, selector_, n_);
    if constexpr (detail::selector_has_density<Selector>) engines_.reserve(next, encoder_);
    auto& select = engines_.select(next);  // made again first if its workspace was given back
    for (std::size_t a = 0; a != Corrector::state_arrays; ++a) engines_.correct().load_committed(a, r.array(a));
    if constexpr (detail::engine_restores_state<select_engine>) select.restore_state(saved_selector);
    selector_ = next;
    step_ = r.step();
    staged_ = false;
  }

  // A staged step is not computed in place (it could not be dropped) while one lives.
  struct in_place_off {
    compressor& c;
    explicit in_place_off(compressor& c_) : c(c_) { c.engines_.allow_in_place(false); }
    ~in_place_off() { c.engines_.allow_in_place(true); }
    in_place_off(const in_place_off&) = delete;
    in_place_off& operator=(const in_place_off&) = delete;
  };

  // A gradient (and a message buffer) that `who` may use: n elements (at least
  // max_message_bytes()) in the backend's memory, on its device.
  template <detail::gradient_element G>
  void check_grad(const char* who, std::span<const G> grad) const {
    detail::require_current_device(backend_, who);
    detail::require(grad.size() == n_, errc::invalid_argument, who, ": grad.size() = ", grad.size(),
                    " does not match the compressor's n = ", n_);
    detail::require_device_pointer(backend_, who, "grad", grad.data());
  }
  template <detail::gradient_element G>
  void check_step(const char* who, std::span<const G> grad, std::span<std::byte> out) const {
    check_grad(who, grad);
    const std::size_t need = max_message_bytes();
    detail::require(out.size() >= need, errc::buffer_too_small, who, ": out.size() = ", out.size(),
                    " bytes is smaller than max_message_bytes() = ", need);
    detail::require_device_pointer(backend_, who, "out", out.data());
  }

  // A view of the caller's kind over the compressor's memory, and the message written
  // at the front of `out`.
  template <class T>
  static view<const T> as_view(std::span<const T> s) noexcept {
    return view<const T>(s.data(), s.size());
  }
  message_type written(std::span<std::byte> out, std::size_t bytes, std::size_t count) const noexcept {
    return message_type(typename message_type::bytes_type(out.data(), bytes), n_, count);
  }

  // compress() (commit) or stage() (not yet) of a gradient on `context`.
  template <class Grad>
  message_type step_on(const Backend& context, const Grad& grad_at, message_bytes out_at, bool commit) {
    const Backend on = detail::context_for(backend_, "compress", context);
    const std::span<std::byte> out = detail::raw(out_at);
    return with_gradient(on, "compress", grad_at, [&](auto grad) {
      if (commit) {
        const message_type m = run_step(on, grad, out, /*commit=*/true);
        finish_step();
        return m;
      }
      staged_ = false;
      const in_place_off guard{*this};
      const message_type m = run_step(on, grad, out, /*commit=*/false);  // committed by accept_staged
      staged_ = true;
      return m;
    });
  }

  // Calls use(grad) with the gradient as the step reads it: its own elements, float32 or
  // 16-bit where the step reads those as they are (step_engines::reads_as_stored: no copy
  // of the gradient), else widened into the float32 workspace (wide_).
  template <class Grad, class Use>
  decltype(auto) with_gradient(const Backend& on, const char* who, const Grad& grad_at, Use&& use) {
    using T = detail::gradient_element_of<Backend, Grad>;
    if constexpr (engines::template reads_as_stored<T>) {
      return use(detail::raw(backend_span<Backend, const T>(grad_at)));
    } else {
      return use(wide_.float_values(on, backend_, who, grad_at, n_));
    }
  }

  // preview() of a gradient on `context`: with `read`, its status read and a value that
  // is not finite raised.
  template <class Grad>
  std::pair<std::span<const float>, const detail::step_status*> preview_on(const Backend& context, const Grad& grad_at,
                                                                           bool read) {
    const Backend on = detail::context_for(backend_, "preview", context);
    return with_gradient(on, "preview", grad_at, [&](auto grad) {
      check_grad("preview", grad);
      const auto queued = engines_.queue_preview(on, corrector_, grad);
      if (read && on.read(queued.second).non_finite != 0) detail::report_non_finite(on, "preview", grad, queued.first);
      return queued;
    });
  }

  // One step up to (not including) making it current: check, then the step queued on
  // `on` (run, on the host) and its status read once. finish_step() makes it current.
  template <detail::gradient_element G>
  message_type run_step(const Backend& on, std::span<const G> grad, std::span<std::byte> out, bool commit) {
    staged_ = false;
    check_step("compress", grad, out);
    engines_.queue(on, selector_, corrector_, encoder_, grad, out, step_, commit);
    const detail::step_status status = engines_.status(on);
    if (status.non_finite != 0) detail::report_non_finite(on, "compress", grad, engines_.acc(grad));
    return written(out, static_cast<std::size_t>(status.bytes), status.count);
  }

  // The staged step's commit (of what `kept` holds, or all), then the step made current.
  void commit_staged(const Backend& context, const std::span<const std::uint32_t>* kept, bool kept_in_memory = false) {
    detail::require(staged_, errc::invalid_argument, "accept_staged: no step is staged");
    const Backend on = detail::context_for(backend_, "accept_staged", context);
    engines_.commit_staged(on, corrector_, kept, kept_in_memory);
    finish_step();
  }

  void finish_step() {
    engines_.accept();
    ++step_;
    staged_ = false;
  }

  [[nodiscard]] std::string signature() const { return detail::signature_of(selector_, corrector_, encoder_); }
  [[nodiscard]] double density() const { return detail::density_of(selector_); }

  Backend backend_;
  std::size_t n_;
  Selector selector_;
  Corrector corrector_;
  Encoder encoder_;
  engines engines_;
  detail::widening<Backend> wide_;  // a 16-bit gradient widened to float32 where the step cannot read it as it is
  Backend last_async_ = backend_;   // the context of the last compress_async (last_step_finite)
  bool async_ran_ = false;          // compress_async has run: a graph may hold the workspace
  std::uint64_t step_ = 0;
  bool staged_ = false;  // a stage()d step waits for accept_staged()
};

/// Deduces a compressor with correct::none and encode::index_value.
template <class Backend, class Selector>
compressor(Backend, std::size_t, Selector) -> compressor<Backend, Selector>;
/// Deduces a compressor with encode::index_value.
template <class Backend, class Selector, class Corrector>
compressor(Backend, std::size_t, Selector, Corrector) -> compressor<Backend, Selector, Corrector>;
/// Deduces a compressor of all four.
template <class Backend, class Selector, class Corrector, class Encoder>
compressor(Backend, std::size_t, Selector, Corrector, Encoder) -> compressor<Backend, Selector, Corrector, Encoder>;

GRADCOMP_NAMESPACE_END
