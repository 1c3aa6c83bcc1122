/// \file detail/step/step_engines.hpp
/// The engines of one compressor's selector, corrector and encoder, their workspace, and
/// the step they run: what compressor.hpp's calls check, stage and commit. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/sorted_search.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Marks index[j] not_kept for the first status->count entries whose index is not in
/// `kept` (ascending, kept_count of them), by a binary search.
struct mark_not_kept {
  std::uint32_t* index;
  const std::uint32_t* kept;
  std::size_t kept_count;
  const step_status* status;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return status->count; }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (j >= status->count) return;
    const std::uint32_t i = index[j];
    const std::size_t at = first_not_below(kept, kept_count, i);
    if (at == kept_count || kept[at] != i) index[j] = not_kept;
  }
};

/// `backend` settled for a compressor of n elements made now, once n and the policies
/// are checked: backend::host its threads (0: OpenMP's default now, which sizes the
/// per-thread workspace), backend::cuda its device (-1: the current one).
/// \throws gradcomp::error if n is 0 or above 2^32 - 1, or a policy's parameters are invalid.
template <class Backend, class Selector, class Corrector, class Encoder>
Backend checked_backend(const Backend& backend, std::size_t n, const Selector& s, const Corrector& c,
                        const Encoder& e) {
  require(n >= 1 && n <= message_header::max_n, errc::invalid_argument, "compressor: n must be in [1, ",
          message_header::max_n, "], got ", n);
  s.validate(n);
  c.validate();
  e.validate();
  return resolved(backend, "compressor");
}

/// What a selector engine carries from step to step as a checkpoint records it: its
/// saved_state()'s record, or nothing.
template <class E>
struct carried_state {
  struct type {};
};
template <class E>
  requires engine_saves_state<E>
struct carried_state<E> {
  using type = decltype(std::declval<const E&>().saved_state());
};

/// The engines of Selector, Corrector and Encoder on Backend, with workspace for the
/// selector's largest selection (grown by reserve) and the step's status. The workspace
/// can be given back between steps (release_workspace) and is then allocated again by
/// the next step: the selector's engine is made anew (with the state a checkpoint keeps
/// of it restored) unless it gives its workspace back itself, the encoder's (which
/// carries nothing) is made anew, and the corrector's gives back all but its committed
/// arrays.
template <class Backend, class Selector, class Corrector, class Encoder>
class step_engines {
 public:
  using select_engine = engine_for<Selector, Backend>;
  using correct_engine = engine_for<Corrector, Backend>;
  using encode_engine = engine_for<Encoder, Backend>;
  template <class T>
  using buffer = typename Backend::template buffer<T>;

 private:
  // The selector watches the corrector's pass tile by tile where both engines can
  // (backend::host's fast paths), so that acc is read while it is in cache.
  static constexpr bool fused_pass = selector_engine_observes<select_engine, Selector, Backend> &&
                                     corrector_engine_visits<correct_engine, Corrector, Backend>;
  // The selector's first pass over acc computes it, the corrector's update riding on it
  // (backend::cuda's exact_topk and chunk_local: their first pass writes acc as it reads
  // it, so acc is read once less), where the corrector's engine offers its pass element by element and
  // the selector's engine says it runs it (`runs_update_pass`: a select that merely
  // accepted the pass would leave the update undone).
  static constexpr bool selector_runs_update_pass = [] {
    if constexpr (requires { select_engine::runs_update_pass; }) {
      return select_engine::runs_update_pass;
    } else {
      return false;
    }
  }();
  template <class G>
  static constexpr bool update_rides_selection =
      selector_runs_update_pass &&
      requires(correct_engine& ce, select_engine& se, const Backend& b, const Selector& s, const Corrector& c,
               std::span<const G> g, const select_input& in, std::span<std::uint32_t> out,
               step_status* status) { se.select(b, s, in, out, status, ce.update_pass(b, c, g)); };
  static constexpr bool skips_update = [] {
    if constexpr (requires { select_engine::checks_finite; }) {
      return std::is_same_v<Corrector, correct::none> && select_engine::checks_finite;
    } else {
      return false;
    }
  }();

 public:
  /// Whether a step reads a gradient of element type G as it is: float32 always; 16 bits
  /// where the corrector's engine updates from it (corrector_engine_reads) and the
  /// selector ranks acc alone (selector_reads_gradient). Otherwise the compressor widens
  /// it into a float32 workspace first.
  template <class G>
  static constexpr bool reads_as_stored =
      std::is_same_v<G, float> || (narrow_float<G> && !skips_update && !selector_reads_gradient<Selector>() &&
                                   corrector_engine_reads<correct_engine, Corrector, Backend, G>);

  step_engines(const Backend& be, const Selector& s, const Corrector& c, const Encoder& e, std::size_t n)
      : backend_(be),
        n_(n),
        capacity_(s.max_selected(n)),
        select_(std::in_place, be, s, n),
        correct_(be, c, n),
        encode_(std::in_place, be, e, n, capacity_),
        index_(be.template allocate<std::uint32_t>(capacity_)),
        sent_(be.template allocate<float>(capacity_)),
        status_(be.template allocate<step_status>(2)) {}  // a step's, a preview's

  /// Queues the whole step of `grad` on `on`, each stage with the step's status: every
  /// stage after the first NaN writes nothing (the engines read the status), so a
  /// rejected step changes neither `out` nor the committed state, and only accept() makes
  /// the new state current. Without a corrector (acc = g), a selector that reads every
  /// entry checks finiteness itself and g is read once. A staged step (`commit` false)
  /// leaves the commit to commit_staged(), once the caller knows what to keep. `grad` is
  /// float32, or 16-bit where reads_as_stored says the step reads it as it is.
  template <gradient_element G>
  void queue(const Backend& on, const Selector& s, const Corrector& c, const Encoder& e, std::span<const G> grad,
             std::span<std::byte> out, std::uint64_t step, bool commit = true) {
    static_assert(reads_as_stored<G>, "step_engines::queue: a gradient this step cannot read as it is");
    hold_workspace(s, e);
    last_ = on;
    step_status* status = status_.data();
    on.clear(status, 1);
    std::span<const float> acc;
    std::span<const float> read_grad;  // what the selector reads of the gradient: none of a 16-bit one
    if constexpr (std::is_same_v<G, float>) {
      read_grad = grad;
      acc = grad;
    }
    queued_selection chosen;
    if constexpr (!skips_update && update_rides_selection<G>) {
      const auto update = correct_.update_pass(on, c, grad);
      acc = correct_.acc(read_grad);
      chosen = select_->select(on, s, {acc, read_grad, step}, index_span(), status, update);
    } else {
      if constexpr (!skips_update) {
        queue_update(on, s, c, grad, step, status);
        acc = correct_.acc(read_grad);  // a corrector's own acc; correct::none's is the gradient
      }
      chosen = select_->select(on, s, {acc, read_grad, step}, index_span(), status);
    }
    const std::span<const std::uint32_t> index = selected(on, status);
    const std::span<float> sent = std::span<float>(sent_.data(), index.size());
    encode_->encode(on, e, {acc, index, step, chosen.value_scale}, out, sent, status);
    if (commit) correct_.commit(on, c, index, sent, status);
  }

  /// Queues on `on` the commit of the step queued without one: of every selected entry,
  /// or, given `kept` (ascending, host memory, or the backend's with `kept_in_memory`),
  /// of the selected entries whose index is in it, as if the selector had chosen only
  /// those (the others stay as the update left them). On the host the selection is
  /// filtered in place; where the backend's memory is a device's, `kept` is copied over
  /// (unless it is there) and the entries not in it are marked not_kept, which the
  /// commit leaves alone (nothing read back).
  void commit_staged(const Backend& on, const Corrector& c, const std::span<const std::uint32_t>* kept,
                     bool kept_in_memory = false) {
    last_ = on;
    step_status* status = status_.data();
    if (kept != nullptr) {
      if constexpr (!Backend::host_accessible) {
        // On a device: `kept` copied over once, and the entries not among it marked so
        // that the commit leaves them alone; nothing read back.
        const std::uint32_t* there = kept->data();
        if (!kept_in_memory) {
          if (static_cast<std::size_t>(kept_.size()) < kept->size()) {
            kept_ = allocate_scratch<std::uint32_t>(backend_, kept->size());
          }
          if (!kept->empty()) on.to_device(kept->data(), kept->size(), kept_.data());
          there = kept_.data();
        }
        on.for_each(static_cast<std::size_t>(index_.size()), mark_not_kept{index_.data(), there, kept->size(), status});
      } else {
        // The host reads the selection where it is (read() waits for the step first).
        const std::size_t selected = on.read(status).count;
        std::uint32_t* index = index_.data();
        float* sent = sent_.data();
        std::size_t count = 0;
        for (std::size_t j = 0; j < selected; ++j) {
          if (!std::binary_search(kept->begin(), kept->end(), index[j])) continue;
          index[count] = index[j];
          sent[count] = sent[j];
          ++count;
        }
        status->count = static_cast<std::uint32_t>(count);
      }
    }
    const std::span<const std::uint32_t> index = selected(on, status);
    correct_.commit(on, c, index, std::span<const float>(sent_.data(), index.size()), status);
  }

  /// The status of the last step queued, read on `on` (waits for it on a device).
  [[nodiscard]] step_status status(const Backend& on) const { return on.read(status_.data()); }
  /// The corrector's value of the step queued with `grad` (grad itself without one).
  template <gradient_element G>
  [[nodiscard]] std::span<const float> acc(std::span<const G> grad) {
    if constexpr (std::is_same_v<G, float>) {
      return correct_.acc(grad);
    } else {
      return correct_.acc({});  // read as it is: the corrector has its own acc
    }
  }

  /// Queues the corrector's update of the committed state with `grad` (as queue() reads
  /// it) into a buffer of n floats (the first call's scratch: the update writes every
  /// element), and returns it with its status (whether it is finite), in the backend's
  /// memory: nothing is read back.
  template <gradient_element G>
  std::pair<std::span<const float>, const step_status*> queue_preview(const Backend& on, const Corrector& c,
                                                                      std::span<const G> grad) {
    static_assert(reads_as_stored<G>, "step_engines::preview: a gradient this step cannot read as it is");
    if (static_cast<std::size_t>(preview_.size()) != n_) preview_ = allocate_scratch<float>(on, n_);
    last_ = on;
    const std::span<float> acc(preview_.data(), n_);
    step_status* status = status_.data() + 1;  // [0] is the step's (last_step_finite)
    on.clear(status, 1);
    correct_.preview(on, c, grad, acc, status);
    return {acc, status};
  }

  /// Makes the queued step current.
  void accept() {
    correct_.accept();
    select_->accept();
  }

  /// Gives back the workspace (what held() counts as such, the step's status aside)
  /// until the next step allocates it again; the corrector's committed arrays and what
  /// the selector carries stay, so the steps that follow are those that would have
  /// followed. Not while a step is staged (its commit reads the selection). On a
  /// backend whose memory is a device's, waits for the last call's work first.
  void release_workspace() {
    if constexpr (!Backend::host_accessible) (void)last_.read(status_.data());
    if constexpr (engine_releases_workspace<select_engine>) {
      select_->release_workspace();
    } else if (select_) {
      if constexpr (engine_saves_state<select_engine>) carried_ = select_->saved_state();
      select_.reset();
    }
    correct_.release_workspace();
    encode_.reset();
    // A new buffer, not `= {}`: on a std::vector that assigns an empty list and keeps
    // the capacity.
    index_ = buffer<std::uint32_t>{};
    sent_ = buffer<float>{};
    preview_ = buffer<float>{};
    kept_ = buffer<std::uint32_t>{};
  }

  /// The workspace a step needs, allocated again after release_workspace(): before the
  /// step changes anything, so that an allocation that fails leaves the state as it was.
  void hold_workspace(const Selector& s, const Encoder& e) {
    (void)select(s);
    if (!holds_workspace()) {
      index_ = backend_.template allocate<std::uint32_t>(capacity_);
      sent_ = backend_.template allocate<float>(capacity_);
      encode_.emplace(backend_, e, n_, capacity_);
    }
  }

  /// Whether the workspace is held (not given back by release_workspace()).
  [[nodiscard]] bool holds_workspace() const noexcept { return encode_.has_value(); }

  /// Grows the index and value workspace and the selector's to what `next` may select
  /// (strong guarantee: allocated first, then swapped).
  void reserve(const Selector& next, const Encoder& e) {
    const std::size_t capacity = next.max_selected(n_);
    if (capacity > capacity_ && holds_workspace()) {
      auto encode = encode_engine(backend_, e, n_, capacity);
      auto index = backend_.template allocate<std::uint32_t>(capacity);
      auto sent = backend_.template allocate<float>(capacity);
      encode_.emplace(std::move(encode));
      index_ = std::move(index);
      sent_ = std::move(sent);
    }
    capacity_ = std::max(capacity_, capacity);  // a released workspace is allocated at this size
    if (select_) select_->reserve(next);        // a selector made anew is made for `next`
  }

  /// What the engines and the step's buffers hold.
  [[nodiscard]] held_memory held() const {
    held_memory use;
    correct_.add_held(use);
    if (select_) select_->add_held(use);
    if (encode_) encode_->add_held(use);
    use.workspace += bytes_held(index_, sent_, status_, preview_, kept_);
    return use;
  }

  /// Whether the corrector may update its state in place (not while a step is staged).
  void allow_in_place(bool allowed) noexcept {
    if constexpr (requires { correct_.allow_in_place(allowed); }) correct_.allow_in_place(allowed);
  }

  /// \name The engines (checkpoints, set_indices, compress_async)
  /// @{
  /// The selector's engine, made for `s` if release_workspace() gave it back.
  select_engine& select(const Selector& s) {
    if (!select_) {
      select_.emplace(backend_, s, n_);
      if constexpr (engine_saves_state<select_engine>) {
        try {
          select_->restore_state(carried_);
        } catch (...) {
          select_.reset();  // made again, with what it carried, by the next call
          throw;
        }
      }
    }
    return *select_;
  }
  /// The checkpoint record of the selector's state (its engine's, or what it carried when
  /// release_workspace() gave it back).
  [[nodiscard]] auto saved_selector_state() const
    requires engine_saves_state<select_engine>
  {
    return select_ ? select_->saved_state() : carried_;
  }
  correct_engine& correct() noexcept { return correct_; }
  const correct_engine& correct() const noexcept { return correct_; }
  /// @}
  /// The step's status record in the backend's memory (compress_async's last_step_finite).
  [[nodiscard]] const step_status* status_record() const noexcept { return status_.data(); }
  /// The last step's selection: its indices (ascending) and the values sent for them (what
  /// a receiver decodes), the first status_record()->count of each, in the backend's memory.
  [[nodiscard]] std::pair<std::span<const std::uint32_t>, std::span<const float>> sent_entries() const noexcept {
    return {{index_.data(), static_cast<std::size_t>(index_.size())},
            {sent_.data(), static_cast<std::size_t>(sent_.size())}};
  }

 private:
  // The corrector's pass. In a fused pass the selector's first pass rides on it: each
  // tile of acc is handed over while it is still in cache, and the selector may look
  // ahead at acc before the pass (sampled_threshold samples it, then collects in it).
  template <class G>
  void queue_update(const Backend& on, const Selector& s, const Corrector& c, std::span<const G> grad,
                    std::uint64_t step, step_status* status) {
    if constexpr (fused_pass) {
      select_->begin_observe(on, s, step);
      const auto observe = [&](int thread, std::size_t begin, auto acc_tile) {
        if constexpr (std::is_same_v<G, float>) {
          select_->observe(thread, begin, acc_tile, grad.subspan(begin, acc_tile.size()));
        } else {
          select_->observe(thread, begin, acc_tile, std::span<const float>{});  // it ranks acc alone
        }
      };
      const auto before_pass = [&](auto&& acc_at) { look_ahead(*select_, s, acc_at); };
      correct_.update(on, c, grad, status, observe, before_pass);
    } else {
      correct_.update(on, c, grad, status);
    }
  }

  // The selected indices as far as the host knows them: their count where the host can
  // read the status (so that the later stages run over the count, not the capacity,
  // which is n for threshold), else the whole workspace, the count staying on the device.
  std::span<const std::uint32_t> selected(const Backend& on, const step_status* status) {
    const std::span<const std::uint32_t> all = index_span();
    if constexpr (Backend::host_accessible) {
      return all.first(std::min<std::size_t>(all.size(), on.read(status).count));
    } else {
      return all;
    }
  }

  std::span<std::uint32_t> index_span() noexcept { return {index_.data(), static_cast<std::size_t>(index_.size())}; }

  Backend backend_;
  Backend last_ = backend_;  // where the last call's work was queued
  std::size_t n_;
  std::size_t capacity_;
  std::optional<select_engine> select_;                    // empty once given back by release_workspace
  typename carried_state<select_engine>::type carried_{};  // what it carried then
  correct_engine correct_;
  std::optional<encode_engine> encode_;  // likewise
  buffer<std::uint32_t> index_;
  buffer<float> sent_;
  buffer<step_status> status_;  // [0] a step's, [1] a preview's
  buffer<float> preview_;
  buffer<std::uint32_t> kept_;  // accept_staged(kept)'s on a device
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
