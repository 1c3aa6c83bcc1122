/// \file detail/engines.hpp
/// The library's engines written once over the backend primitives, one include each:
/// compressor.hpp includes this, so a compressor of any of the library's policies finds
/// its engine wherever the policy's own header and a backend's header are included.
/// Each engine includes its policy; a backend's fast paths come with its header
/// (backend/host.hpp, backend/cuda.cuh). Not API.
#pragma once

#include <gradcomp/detail/codec/encode.hpp>
#include <gradcomp/detail/correct/elementwise.hpp>
#include <gradcomp/detail/correct/none.hpp>
#include <gradcomp/detail/select/chunk_local.hpp>
#include <gradcomp/detail/select/exact_topk.hpp>
#include <gradcomp/detail/select/given_indices.hpp>
#include <gradcomp/detail/select/random_k.hpp>
#include <gradcomp/detail/select/sampled_threshold.hpp>
#include <gradcomp/detail/select/threshold.hpp>
