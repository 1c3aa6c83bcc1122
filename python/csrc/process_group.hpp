// A torch.distributed process group as the transport of gradcomp's collectives (the
// agreement, ScaleCom's exchange, the DDP hook's all-gather), called from C++ through
// c10d::ProcessGroup: the collectives run with the GIL released, on tensors made here
// that never get a Python object. (A tensor with one, released by gloo's worker thread
// when it drops a finished work, needs the GIL; at exit the main thread holds the GIL
// while it joins that thread, and the two wait for each other.)
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api.hpp"

namespace gradcomp_py {

/// A process group as C++ holds it. The last reference's release never holds the GIL
/// (as torch's own holders, IntrusivePtrNoGilDestructor): ~ProcessGroupGloo joins gloo's
/// threads, and one of them may be waiting for the GIL to release a tensor that has a
/// Python object (a work of DDP's or of the script's); a hook state collected at exit,
/// with the GIL held, holding the last reference, would wait for it for ever.
using group_ptr = std::shared_ptr<c10d::ProcessGroup>;

/// `group` as C++ holds it.
/// \throws gradcomp::error (invalid_argument) if `group` is not a ProcessGroup.
group_ptr group_of(const pybind11::object& group);

/// The collectives of `group` on the memory of a compressor on `device`, whose own CUDA
/// stream is `stream` (nullptr on the host). Device arrays are handed to the group once
/// `stream` has written them, and work queued on `stream` after a collective waits for
/// it and for its copies on torch's current stream (events; over NCCL the host does not
/// wait). Needs no GIL.
transport transport_of(const group_ptr& group, const torch::Device& device, void* stream);

/// A setting the ranks must share, as Python names and writes it.
using named_value = std::pair<std::string, std::string>;
/// An error a rank met before a collective, as Python reports it: the gradcomp.Error
/// code ("invalid_argument", ...; anything else is taken as invalid_argument) and text.
using reported_error = std::optional<std::pair<std::string, std::string>>;

/// Throws `error` as the gradcomp::error of its code (a no-op without one).
void rethrow(const reported_error& error);

}  // namespace gradcomp_py
