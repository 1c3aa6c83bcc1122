/// \file registry.hpp
/// The library's policies, registered once: the engine of each (written once over the
/// backend primitives), the selectors by name, and the presets (presets.hpp) by name with
/// the selector each runs and what it is. compressor.hpp includes this, so a compressor of
/// any of the library's policies finds its engine wherever the policy's own header and a
/// backend's header are included (a backend's fast paths come with its header:
/// backend/host.hpp, backend/cuda.cuh). gradcomp.torch and the CLI offer every preset and
/// selector listed here; scripts/binding_units.py reads GRADCOMP_SELECTORS to give each
/// selector a translation unit of the binding. A new selector is its policy
/// (select/S.hpp), its engine (detail/select/S.hpp), an include and a line here, and its
/// case in the conformance grid (docs/design.md).
#pragma once

#include <gradcomp/detail/codec/encode.hpp>
#include <gradcomp/detail/correct/compact.hpp>
#include <gradcomp/detail/correct/elementwise.hpp>
#include <gradcomp/detail/correct/none.hpp>
#include <gradcomp/detail/select/chunk_local.hpp>
#include <gradcomp/detail/select/exact_topk.hpp>
#include <gradcomp/detail/select/given_indices.hpp>
#include <gradcomp/detail/select/random_k.hpp>
#include <gradcomp/detail/select/sampled_threshold.hpp>
#include <gradcomp/detail/select/threshold.hpp>

/// \def GRADCOMP_SELECTORS
/// X(name) for each selector, gradcomp::select::name.
// clang-format off
#define GRADCOMP_SELECTORS(X) \
  X(exact_topk)               \
  X(sampled_threshold)        \
  X(chunk_local)              \
  X(random_k)                 \
  X(threshold)                \
  X(given_indices)

/// \def GRADCOMP_PRESETS
/// X(name, selector, description) for each preset: gradcomp::presets::name, made from
/// gradcomp::presets::name_options, runs gradcomp::select::selector.
#define GRADCOMP_PRESETS(X)                                                                                 \
  X(topk_ef, exact_topk, "exact top-k with error feedback (GRACE-style)")                                   \
  X(dgc, sampled_threshold, "Deep Gradient Compression: sampled threshold, momentum correction, f16 values") \
  X(adacomp, chunk_local, "AdaComp: localized selection (bin 50), residual, ternary values")               \
  X(randomk_ef, random_k, "random-k with error feedback (shared seed)")                                    \
  X(threshold_ef, threshold, "fixed magnitude threshold with error feedback")                              \
  X(scalecom, given_indices, "ScaleCom: the leader's indices (cyclic exchange), low-pass filtered memory")
// clang-format on
