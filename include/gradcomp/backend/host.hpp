/// \file backend/host.hpp
/// The default backend: host memory, OpenMP threads when the program is built with
/// OpenMP, a plain loop otherwise.
#pragma once

// backend::host itself, then its fast paths (detail/host/: each a detail::fast_engine with its
// has_fast_path): a program that runs on the host has them all.
#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/detail/host/correct_elementwise.hpp>
#include <gradcomp/detail/host/correct_none.hpp>
#include <gradcomp/detail/host/select_chunk_local.hpp>
#include <gradcomp/detail/host/select_exact_topk.hpp>
#include <gradcomp/detail/host/select_sampled_threshold.hpp>
#include <gradcomp/detail/host/select_threshold.hpp>
