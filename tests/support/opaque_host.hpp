// opaque_host: backend::host declaring its memory unreadable by the host, as a device's
// is. The generic algorithms then take the path they take on backend::cuda (every phase
// queued, guarded by what the backend's memory says; passes over the capacity; copies
// through to_host), which the CPU tests thus run before a GPU does.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/memory.hpp>

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
};

struct opaque_host : opaque_backend<opaque_host> {};
