/// \file backend/cuda.cuh
/// Runs gradcomp on an NVIDIA GPU with CUB/Thrust from the CUDA toolkit (CCCL 3.0 or
/// later).
///
/// Needs nvcc (CMake: link gradcomp::gradcomp from a CUDA target, with
/// `--expt-relaxed-constexpr`). Every operation is queued on `stream`, in order; state
/// and workspace are device memory allocated once, by the compressor's constructor.
/// Gradients, messages and dense tensors are device memory, viewed as device_span
/// (memory.hpp): a thrust::device_vector's data or a PyTorch CUDA tensor's data_ptr work
/// without copies. compress() reads one status record back to the host per step, for
/// every preset. Messages in device memory are decoded and accumulated by
/// device_messages.cuh; calls on changing streams are ordered by stream_order.cuh.
///
/// Results equal backend::host's bit for bit when the policies' arithmetic is not
/// contracted into fused multiply-adds: compile with `--fmad=false` (nvcc) as the tests
/// do; gradcomp's own kernels round every product and sum explicitly.
///
/// Policies: every selector (exact_topk, sampled_threshold, threshold, chunk_local,
/// random_k, given_indices); correct::none and every element-wise corrector
/// (error_feedback, momentum, clip_norm, low_pass, chain); the index_value encoder, every
/// coding and the checksum written by the device (detail/codec/encode.hpp).
#pragma once

// backend::cuda itself, then its fast paths (detail/cuda/select_*.cuh: each a
// detail::fast_engine with its has_fast_path).
#include <gradcomp/detail/cuda/backend.cuh>
#include <gradcomp/detail/cuda/select_chunk_local.cuh>
#include <gradcomp/detail/cuda/select_exact_topk.cuh>
