// opaque_host: backend::host declaring its memory unreadable by the host, as a device's
// is. The generic algorithms then take the path they take on backend::cuda (every phase
// queued, guarded by what the backend's memory says; passes over the capacity; copies
// through to_host), which the CPU tests thus run before a GPU does.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/memory.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

/// backend::host declaring its memory unreadable, as the backend type `Self` (which
/// derives from it): resolved() and context_for() keep that type.
template <class Self>
struct opaque_backend : gradcomp::backend::host {
  static constexpr bool host_accessible = false;
  using memory = gradcomp::device_memory;

  /// backend::host's resolved(), keeping this type.
  [[nodiscard]] Self resolved(const char* who) const {
    Self settled = static_cast<const Self&>(*this);
    settled.threads = host::resolved(who).threads;
    return settled;
  }
  /// backend::host's context_for(), keeping this type.
  [[nodiscard]] Self context_for(const char* who, const Self& context) const {
    Self checked = static_cast<const Self&>(*this);
    checked.threads = host::context_for(who, context).threads;
    return checked;
  }

  using host::histogram;
  /// The histogram with a one-item pass on its finished counts, as backend::cuda runs it
  /// (its last block: detail::histogram_then), which then clears the counts: the counts
  /// and the word where blocks count themselves done must be zero before, and are left
  /// zero.
  template <class BinOf, class Then>
  void histogram(std::size_t n, const BinOf& bin_of, std::uint32_t* counts, const Then& then) const {
    std::uint32_t* finished = then.finished_blocks();
    if (*finished != 0) throw std::logic_error("histogram_then: the blocks' word was not zero before the pass");
    if (std::any_of(counts, counts + bin_of.bins(), [](std::uint32_t c) { return c != 0; })) {
      throw std::logic_error("histogram_then: the counts were not zero before the pass");
    }
    host::histogram(n, bin_of, counts);
    ++*finished;  // the one block of this pass
    then(0);
    *finished = 0;
    std::fill(counts, counts + bin_of.bins(), 0u);
  }
};

struct opaque_host : opaque_backend<opaque_host> {};
