/// \file concepts.hpp
/// What a selector, a corrector, an encoder and a backend must provide.
///
/// Policies are small aggregates that hold parameters only. Each concept is the
/// conjunction of one-member concepts so that `compressor` can report exactly which
/// member a policy lacks (see `detail::check_policies`).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/memory.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {
/// The implementation of policy `Policy` on backend `Backend`: the algorithm written once
/// over the backend primitives (each policy's detail/ header specialises it for every
/// backend; a policy written outside gradcomp specialises it for the backends it runs on).
/// The primary template is never defined.
template <class Policy, class Backend>
class engine;

/// A backend's own implementation of a policy, where one pays (a fast path): defined in
/// detail/<backend>/, included by that backend's header alone, and proved equal to the
/// engine above by the tests.
template <class Policy, class Backend>
class fast_engine;

/// Whether `Backend` has a fast path for `Policy`: false unless the fast path's header
/// says so beside its fast_engine (as Kokkos Kernels' *_tpl_spec_avail does).
template <class Policy, class Backend>
struct has_fast_path : std::false_type {};

/// What a compressor runs for `Policy` on `Backend`: the fast path where there is one,
/// else the engine.
template <class Policy, class Backend>
using engine_for =
    std::conditional_t<has_fast_path<Policy, Backend>::value, fast_engine<Policy, Backend>, engine<Policy, Backend>>;

template <class Policy, class Backend>
concept has_engine = requires { sizeof(engine_for<Policy, Backend>); };
}  // namespace detail

// -- one requirement each, named so that a failed check names the member ------------

template <class P>
concept policy_has_name = requires(const P& p) {
  { p.name() } -> std::convertible_to<std::string>;
};

template <class S>
concept selector_has_validate = requires(const S& s, std::size_t n) { s.validate(n); };

template <class S>
concept selector_has_max_selected = requires(const S& s, std::size_t n) {
  { s.max_selected(n) } -> std::same_as<std::size_t>;
};

template <class C>
concept corrector_has_validate = requires(const C& c) { c.validate(); };

template <class C>
concept corrector_has_state_arrays = requires {
  { C::state_arrays } -> std::convertible_to<std::size_t>;
};

template <class E>
concept encoder_has_validate = requires(const E& e) { e.validate(); };

template <class E>
concept encoder_has_max_bytes = requires(const E& e, std::size_t n, std::size_t count) {
  { e.max_bytes(n, count) } -> std::same_as<std::size_t>;
};

template <class B>
concept backend_has_allocate = requires(const B& b, std::size_t n) {
  typename B::template buffer<float>;
  { b.template allocate<float>(n) } -> std::same_as<typename B::template buffer<float>>;
};

namespace detail {
/// A body for for_each in the concept below: does nothing, anywhere.
struct no_op_body {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const noexcept {}
};
}  // namespace detail

template <class B>
concept backend_has_for_each = requires(const B& b, std::size_t n) { b.for_each(n, detail::no_op_body{}); };

namespace detail {
/// A body for reduce_or: raises nothing.
struct no_flag_body {
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const noexcept { return 0; }
};
/// A predicate for compact: keeps nothing.
struct no_index_kept {
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t) const noexcept { return false; }
};
/// A body for expand: makes nothing.
struct nothing_made {
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t, std::uint32_t*) const noexcept { return 0; }
};
/// A bin for histogram: 0.
struct bin_zero {
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t) const noexcept { return 0; }
};
/// A term for sum: zero.
struct zero_term {
  GRADCOMP_HOST_DEVICE double operator()(std::size_t) const noexcept { return 0.0; }
};
}  // namespace detail

template <class B>
concept backend_has_reductions = requires(const B& b, std::size_t n, std::uint32_t* bits, double* d) {
  b.reduce_or(n, detail::no_flag_body{}, bits);
  b.reduce_max(n, detail::no_flag_body{}, bits);
  b.sum(n, detail::zero_term{}, d, d);
  b.histogram(n, detail::bin_zero{}, bits);
};

template <class B>
concept backend_has_compaction = requires(const B& b, std::size_t n, std::uint32_t* out, std::span<std::byte> w) {
  { b.template compact_workspace<detail::no_index_kept>(n) } -> std::same_as<std::size_t>;
  b.compact(n, detail::no_index_kept{}, out, w, out);
  { b.expand_workspace(n) } -> std::same_as<std::size_t>;
  b.expand(n, detail::nothing_made{}, out, w, out);
};

template <class B>
concept backend_has_transfers = requires(const B& b, float* p, const float* cp, std::size_t n) {
  { B::host_accessible } -> std::convertible_to<bool>;
  b.clear(p, n);
  { b.read(cp) } -> std::same_as<float>;
  b.to_host(cp, n, p);
  b.to_device(cp, n, p);
};

/// The backend names where its memory lives (memory.hpp): `memory`, that of gradients,
/// state and dense tensors, and `message_memory`, that of messages, each host_memory or
/// device_memory; host_accessible is whether `memory` is host memory.
template <class B>
concept backend_names_memory =
    requires {
      typename B::memory;
      typename B::message_memory;
    } &&
    (std::same_as<typename B::memory, host_memory> || std::same_as<typename B::memory, device_memory>)&&(
        std::same_as<typename B::message_memory, host_memory> ||
        std::same_as<typename B::message_memory, device_memory>)&&(B::host_accessible ==
                                                                   std::same_as<typename B::memory, host_memory>);

// -- the concepts -------------------------------------------------------------------

/// Decides which entries are sent: `validate(n)` throws gradcomp::error for parameters
/// that are invalid for a tensor of `n` elements; `max_selected(n)` bounds the count.
template <class S>
concept selector = std::copyable<S> && policy_has_name<S> && selector_has_validate<S> && selector_has_max_selected<S>;

/// Owns what is remembered between steps: `state_arrays` is the number of n-element
/// float arrays it keeps; `validate()` throws for bad parameters.
template <class C>
concept corrector =
    std::copyable<C> && policy_has_name<C> && corrector_has_validate<C> && corrector_has_state_arrays<C>;

/// Writes the selected entries as message bytes: `max_bytes(n, count)` bounds the size
/// of a message of `count` entries; `validate()` throws for bad parameters.
template <class E>
concept encoder = std::copyable<E> && policy_has_name<E> && encoder_has_validate<E> && encoder_has_max_bytes<E>;

/// Knows where memory lives and runs the data-parallel work, the primitives that every
/// policy's algorithm is written against (bodies and terms are GRADCOMP_HOST_DEVICE):
/// - allocate<T>(n): n zeroed elements of the backend's memory;
/// - for_each(n, body): body(i) for every i < n;
/// - reduce_or(n, body, bits): ORs body(i) -> std::uint32_t over every i < n into *bits;
/// - reduce_max(n, body, word): raises *word to the largest body(i) -> std::uint32_t;
/// - histogram(n, bin_of, counts): adds 1 to counts[bin_of(i)] for every i < n whose bin
///   is not detail::no_bin (a bin_of may say how many bins it has, bins(), host-callable:
///   backend::cuda then counts each block's in shared memory); optionally also
///   histogram(n, bin_of, counts, then), then(0) run once on the finished counts in the
///   same pass, which leaves the bin_of.bins() counts zero (detail::histogram_then);
/// - sum(n, term, tile, total): *total = the sum of term(i) -> double in the order of
///   detail/core/fixed_order_sum.hpp (identical on every backend and for any thread count);
/// - compact(n, keep, out, workspace, count): the i < n with keep(i) -> bool, ascending,
///   to out and their number to *count; compact_workspace<Keep>(n) bytes of workspace;
/// - expand(m, body, out, workspace, count): item b < m writes body(b, at) outputs, all
///   concatenated in item order; expand_workspace(m) bytes of workspace;
/// - host_accessible, clear(p, n), read(p), to_host(from, n, to), to_device(from, n, to):
///   whether the host may touch the backend's memory, and the small transfers;
/// - memory and message_memory: host_memory or device_memory (memory.hpp), which say in
///   which views (std::span, device_span) the compressor takes gradients and messages.
/// Results written to pointers stay in the backend's memory (nothing waits for them on
/// a device) until read() or to_host() brings them back. A body of for_each or a bin_of
/// may have live_items(): how many of its first items can do any work (the others do
/// nothing), read from the backend's memory; a backend may skip the rest (backend::cuda
/// does: a pass over a capacity then costs what the step's count costs).
template <class B>
concept backend_type =
    std::copyable<B> && backend_has_allocate<B> && backend_has_for_each<B> && backend_has_reductions<B> &&
    backend_has_compaction<B> && backend_has_transfers<B> && backend_names_memory<B>;

// A backend's optional members, called where it has them (a no-op, or the backend
// itself, where it has not): `who` names the call in their errors.
namespace detail {
/// `be` settled for a compressor made now (backend::host: its threads; backend::cuda:
/// its device).
template <class B>
B resolved(const B& be, const char* who) {
  if constexpr (requires { be.resolved(who); }) {
    return be.resolved(who);
  } else {
    return be;
  }
}
/// `context` checked as one call's execution context on a compressor made with `be`.
template <class B>
B context_for(const B& be, const char* who, const B& context) {
  if constexpr (requires { be.context_for(who, context); }) {
    return be.context_for(who, context);
  } else {
    return context;
  }
}
/// `count` elements of `be`'s memory that their user writes before it reads them (a
/// step's scratch arrays): not zeroed, so that a device backend neither queues a
/// zeroing nor waits for one (backend::cuda, backend::kokkos); allocate() where the
/// backend has no allocate_scratch().
template <class T, class B>
typename B::template buffer<T> allocate_scratch(const B& be, std::size_t count) {
  if constexpr (requires { be.template allocate_scratch<T>(count); }) {
    return be.template allocate_scratch<T>(count);
  } else {
    return be.template allocate<T>(count);
  }
}
/// `count` elements of `be`'s memory for one step's work queued on `be`, written before
/// they are read and given back with release_after_stream(): stream-ordered where the
/// backend can (backend::cuda: neither waits), else allocate_scratch().
template <class T, class B>
typename B::template buffer<T> allocate_for_stream(const B& be, std::size_t count) {
  if constexpr (requires { be.template allocate_for_stream<T>(count); }) {
    return be.template allocate_for_stream<T>(count);
  } else {
    return allocate_scratch<T>(be, count);
  }
}
/// Gives `buffers` back once the work queued on `be` so far is done: in stream order
/// where the backend can (backend::cuda), else at once on the host and, on a device,
/// once read() has waited for that work. False, the rest kept (their work may still read
/// them), where waiting fails.
template <class B, class Buffer>
bool release_after_stream(const B& be, std::span<Buffer> buffers) noexcept {
  if constexpr (requires {
                  { be.release_after_stream(buffers) } -> std::same_as<bool>;
                }) {
    return be.release_after_stream(buffers);
  } else {
    if constexpr (!B::host_accessible) {
      const auto held = std::find_if(buffers.begin(), buffers.end(), [](const Buffer& b) { return b.size() != 0; });
      if (held == buffers.end()) return true;
      try {
        (void)be.read(held->data());
      } catch (...) {
        return false;
      }
    }
    for (Buffer& b : buffers) b = Buffer{};
    return true;
  }
}
/// counts[bin_of(i)] += 1 for every i < n (histogram()), then `then(0)` once, on the
/// finished counts, which are then zero again: in the histogram's pass where the backend
/// can (backend::cuda: its last block to finish runs it and clears the counts, two
/// launches fewer), else as a one-item pass and a clear after it. The counts
/// (bin_of.bins() of them, host-callable) must be zero before: a caller that keeps them
/// for its histograms clears them once, and allocation does. `then` says which word of
/// the backend's memory the pass's blocks count themselves done in (finished_blocks(),
/// host-callable: zero before, and left zero).
template <class B, class BinOf, class Then>
void histogram_then(const B& be, std::size_t n, const BinOf& bin_of, std::uint32_t* counts, const Then& then) {
  if constexpr (requires { be.histogram(n, bin_of, counts, then); }) {
    be.histogram(n, bin_of, counts, then);
  } else {
    be.histogram(n, bin_of, counts);
    be.for_each(1, then);
    be.clear(counts, bin_of.bins());
  }
}
/// Host memory that the host fills for a copy to `B`'s memory (upload()): `B`'s own
/// staging where it has one (backend::cuda: pinned memory, copied in stream order), else
/// a std::vector, copied with to_device().
template <class B, class T>
struct staging_type {
  using type = std::vector<T>;
};
template <class B, class T>
  requires requires { typename B::template staging<T>; }
struct staging_type<B, T> {
  using type = typename B::template staging<T>;
};
template <class B, class T>
using staging_of = typename staging_type<B, T>::type;
/// Where the host writes `from` (waiting first, where the backend stages, for the
/// copy still reading it).
template <class Staging>
auto* writable(Staging& from) {
  if constexpr (requires { from.writable(); }) {
    return from.writable();
  } else {
    return from.data();
  }
}
/// The first `count` elements of `from` copied to `to` in `be`'s memory: queued where
/// the backend stages, nothing waited for; else with to_device(), which returns when
/// `from` may be written again.
template <class B, class T>
void upload(const B& be, staging_of<B, T>& from, std::size_t count, T* to) {
  if constexpr (requires { be.upload(from, count, to); }) {
    be.upload(from, count, to);
  } else {
    be.to_device(from.data(), count, to);
  }
}
/// Throws unless `be`'s device is current (a device backend's memory is its device's).
template <class B>
void require_current_device(const B& be, const char* who) {
  if constexpr (requires { be.require_current_device(who); }) be.require_current_device(who);
}
/// Throws if `p`, the start of the view `what` a caller passed as the backend's memory,
/// is host memory wrapped as a device's (backend::cuda asks the driver).
template <class B>
void require_device_pointer(const B& be, const char* who, const char* what, const void* p) {
  if constexpr (requires { be.require_device_pointer(who, what, p); }) be.require_device_pointer(who, what, p);
}
}  // namespace detail

// -- the engine contract ---------------------------------------------------------------
//
// What compressor calls on detail::engine<Policy, Backend>, the code that runs a policy on
// a backend. One step protocol on every backend: each stage of a step takes the execution
// context of the call first (a Backend value: host threads, a Kokkos instance, a CUDA
// stream), is queued on it with the step's step_status (in the backend's memory), reads
// the status, and writes nothing once it holds a NaN verdict; the compressor reads the
// status once, at the end. On the host, queueing a stage runs it. An engine allocates
// with the backend it was made with; a context shares that backend's memory. The protocol and each optional capability
// are checked by detail::check_engines with a message that names them.

namespace detail {

/// A corrector's pass hands each tile of acc to a visitor; the contract is checked with
/// one that does nothing.
struct ignore_tile {
  template <class Tile>
  void operator()(int /*thread*/, std::size_t /*begin*/, Tile&& /*acc_tile*/) const noexcept {}
};

/// Selector engine: queues the ascending indices into `out` and their count into the
/// status; returns the factor on the values sent.
template <class E, class S, class B>
concept selector_engine =
    requires(E& e, const B& b, const S& s, const select_input& in, std::span<std::uint32_t> out, step_status* status) {
      { e.select(b, s, in, out, status) } -> std::same_as<queued_selection>;
      e.accept();
    };

/// Corrector engine: the update, preview and commit stages, each queued with the status
/// (commit's index and sent span the entries the host knows of: the count where the
/// host can read the status, the workspace where it cannot; the status has the count),
/// the committed arrays readable and loadable (corrector_state and checkpoints), and
/// accept() making the step's state current.
template <class E, class C, class B>
concept corrector_engine =
    requires(E& e, const E& ce, const B& b, const C& c, std::span<const float> g, std::span<float> out,
             std::span<const std::uint32_t> index, step_status* status, std::size_t a) {
      e.update(b, c, g, status);
      { e.acc(g) } -> std::convertible_to<std::span<const float>>;
      e.preview(b, c, g, out, status);
      e.commit(b, c, index, g, status);
      { ce.committed(a) } -> std::convertible_to<std::span<const float>>;
      e.load_committed(a, g);
      e.accept();
    };

/// Encoder engine: queues the message of the selected entries into `out` and what the
/// receiver decodes into `sent`, and the message's size into the status.
template <class E, class P, class B>
concept encoder_engine =
    requires(E& e, const B& b, const P& p, const encode_input& in, std::span<std::byte> out, std::span<float> sent,
             step_status* status) { e.encode(b, p, in, out, sent, status); };

/// Capability, a fused first pass (backend::host): the selector engine watches the
/// corrector's pass tile by tile (begin_observe, then observe for every tile of acc
/// while it is in cache) and may look at acc before it (before_pass, through
/// look_ahead); the corrector engine's update hands it each tile. Used where both
/// engines have it; a selector engine that was not shown the pass makes its own.
template <class E, class S, class B>
concept selector_engine_begins_observing =
    requires(E& e, const B& b, const S& s, std::uint64_t step) { e.begin_observe(b, s, step); };
template <class E, class S, class B>
concept selector_engine_observes = selector_engine_begins_observing<E, S, B> &&
                                   requires(E& e, int thread, std::size_t begin, std::span<const float> tile) {
                                     e.observe(thread, begin, tile, tile);
                                   };
template <class E, class C, class B>
concept corrector_engine_visits =
    requires(E& e, const B& b, const C& c, std::span<const float> g, step_status* status) {
      e.update(b, c, g, status, ignore_tile{}, ignore_before_pass{});
    };

/// Capability, a 16-bit gradient read as it is: the corrector engine's update and preview
/// take a gradient of element type T (half, bfloat16), reading each value as its float,
/// so that no float32 copy of the gradient is made. Without it the compressor widens the
/// gradient into a float32 workspace first.
template <class E, class C, class B, class T>
concept corrector_engine_reads =
    requires(E& e, const B& b, const C& c, std::span<const T> g, std::span<float> out, step_status* status) {
      e.update(b, c, g, status);
      e.preview(b, c, g, out, status);
    };

/// Whether a selector reads the step's gradient (select_input::grad) besides acc, as its
/// `static constexpr bool reads_gradient` says (chunk_local does: AdaComp's bins); a
/// selector that does not say is taken to read it.
template <class S>
constexpr bool selector_reads_gradient() {
  if constexpr (requires { S::reads_gradient; }) {
    return S::reads_gradient;
  } else {
    return true;
  }
}

/// A selector whose density set_density() and checkpoints change.
template <class S>
concept selector_has_density = requires(S& s) { s.density = 1.0; };

/// Capability: resizing the engine's workspace for a new density, before the policy
/// changes (strong guarantee).
template <class E, class S>
concept engine_has_reserve = requires(E& e, const S& s) { e.reserve(s); };

/// Capability: a count known before the step (exact_topk), which compress_async needs.
template <class E, class S>
concept engine_has_fixed_count = requires(const E& e, const S& s) {
  { e.fixed_count(s) } -> std::same_as<std::size_t>;
};

/// A selector engine's state carried between steps, as a checkpoint writes it: a record
/// of unsigned integer fields, which `fields(f)` lists as f(field) in a fixed order, and
/// `valid()` says whether compress could have left it.
struct ignore_field {
  template <class T>
  void operator()(T&) const noexcept {}
};
template <class R>
concept state_record = std::default_initializable<R> && std::copyable<R> && requires(R& r, const R& cr) {
  r.fields(ignore_field{});
  { cr.valid() } -> std::same_as<bool>;
};

/// Capability: state carried from step to step beyond the corrector's arrays (the
/// sampled threshold's last estimate), saved into checkpoints as a typed record and
/// restored from one.
template <class E>
concept engine_saves_state = requires(const E& e) {
  { e.saved_state() } -> state_record;
};
template <class E>
concept engine_restores_state =
    engine_saves_state<E> && requires(E& e, const E& ce) { e.restore_state(ce.saved_state()); };

/// Capability: gives its workspace back between steps and keeps what it carries from
/// step to step (compressor::release_workspace); its next step allocates the workspace
/// again. A selector engine without it is made anew instead, with the state it saves
/// into checkpoints (saved_state) restored, so one that carries anything else (given
/// indices, a hint that saves work) has it; every corrector engine has it (its
/// committed arrays stay).
template <class E>
concept engine_releases_workspace = requires(E& e) { e.release_workspace(); };

/// Static assertions that name the first missing member of each policy. Called from
/// compressor's class body so a misuse fails with these words, not a wall of templates.
template <class Backend, class Selector, class Corrector, class Encoder>
consteval bool check_policies() {
  static_assert(backend_has_allocate<Backend>,
                "gradcomp: the backend has no member template allocate<T>(n) returning buffer<T>");
  static_assert(backend_has_for_each<Backend>,
                "gradcomp: the backend has no member template for_each(n, body) calling body(i) for every i < n");
  static_assert(backend_has_reductions<Backend>,
                "gradcomp: the backend lacks the reductions reduce_or(n, body, bits), reduce_max(n, body, word), "
                "sum(n, term, tile, total) or "
                "histogram(n, bin_of, counts)");
  static_assert(backend_has_compaction<Backend>,
                "gradcomp: the backend lacks the ordered compaction compact(n, keep, out, workspace, count) and "
                "compact_workspace<Keep>(n), or the ordered expansion expand(m, body, out, workspace, count) and "
                "expand_workspace(m)");
  static_assert(backend_has_transfers<Backend>,
                "gradcomp: the backend lacks host_accessible, clear(p, n), read(p), to_host(from, n, to) or "
                "to_device(from, n, to)");
  static_assert(backend_names_memory<Backend>,
                "gradcomp: the backend must name where its memory lives: member types memory and message_memory, "
                "each gradcomp::host_memory or gradcomp::device_memory (host_accessible true exactly when memory is "
                "host_memory)");
  static_assert(policy_has_name<Selector>, "gradcomp: the selector has no member name()");
  static_assert(selector_has_validate<Selector>, "gradcomp: the selector has no member validate(n)");
  static_assert(selector_has_max_selected<Selector>,
                "gradcomp: the selector has no member max_selected(n) returning std::size_t");
  static_assert(policy_has_name<Corrector>, "gradcomp: the corrector has no member name()");
  static_assert(corrector_has_validate<Corrector>, "gradcomp: the corrector has no member validate()");
  static_assert(corrector_has_state_arrays<Corrector>, "gradcomp: the corrector has no static member state_arrays");
  static_assert(policy_has_name<Encoder>, "gradcomp: the encoder has no member name()");
  static_assert(encoder_has_validate<Encoder>, "gradcomp: the encoder has no member validate()");
  static_assert(encoder_has_max_bytes<Encoder>,
                "gradcomp: the encoder has no member max_bytes(n, count) returning std::size_t");
  static_assert(has_engine<Selector, Backend>, "gradcomp: this selector has no implementation for this backend");
  static_assert(has_engine<Corrector, Backend>, "gradcomp: this corrector has no implementation for this backend");
  static_assert(has_engine<Encoder, Backend>, "gradcomp: this encoder has no implementation for this backend");
  return true;
}

/// Static assertions that name what an engine lacks of the contract above: the step
/// protocol, and each capability its policy needs. (Only once every engine exists:
/// check_policies has said so otherwise.)
template <class Backend, class Selector, class Corrector, class Encoder>
consteval bool check_engines() {
  if constexpr (has_engine<Selector, Backend> && has_engine<Corrector, Backend> && has_engine<Encoder, Backend>) {
    using select_engine = engine_for<Selector, Backend>;
    using correct_engine = engine_for<Corrector, Backend>;
    using encode_engine = engine_for<Encoder, Backend>;
    static_assert(selector_engine<select_engine, Selector, Backend>,
                  "gradcomp: the selector's engine lacks the step protocol: "
                  "select(context, policy, select_input, out, step_status*) -> queued_selection, and accept()");
    static_assert(corrector_engine<correct_engine, Corrector, Backend>,
                  "gradcomp: the corrector's engine lacks the step protocol: update(context, policy, g, step_status*), "
                  "acc(g), preview(context, policy, g, out, step_status*), commit(context, policy, index, sent, "
                  "step_status*), committed(a), load_committed(a, values) and accept()");
    static_assert(encoder_engine<encode_engine, Encoder, Backend>,
                  "gradcomp: the encoder's engine lacks the step protocol: "
                  "encode(context, policy, encode_input, out, sent, step_status*)");
    static_assert(!selector_engine_begins_observing<select_engine, Selector, Backend> ||
                      selector_engine_observes<select_engine, Selector, Backend>,
                  "gradcomp: the selector's engine has begin_observe(context, policy, step) but not "
                  "observe(thread, begin, acc_tile, grad_tile): the fused pass needs both");
    static_assert(!selector_has_density<Selector> || engine_has_reserve<select_engine, Selector>,
                  "gradcomp: the selector has a density, so set_density() and load_state() need its engine's "
                  "reserve(policy) (a no-op where the engine's workspace does not depend on the count)");
    static_assert(engine_saves_state<select_engine> == engine_restores_state<select_engine>,
                  "gradcomp: the selector's engine must have both saved_state() -> a state_record and "
                  "restore_state(record), or neither: checkpoints would lose or refuse its state");
    static_assert(engine_releases_workspace<correct_engine>,
                  "gradcomp: the corrector's engine has no release_workspace() (giving back what only a step "
                  "uses, keeping its committed arrays)");
  }
  return true;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
