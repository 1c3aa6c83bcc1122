/// \file comm/transport.hpp
/// What gradcomp's collectives need of a transport, as concepts: comm::mpi, comm::nccl
/// and the PyTorch binding's adapter of a torch.distributed process group each implement
/// it once, and the ranks' agreement (comm/agreement.hpp), the all-gather of framed
/// messages (comm/frames.hpp), ScaleCom's exchange (comm/cyclic_topk.hpp) and the global
/// top-k (comm/sparse_allreduce.hpp) are each written once over it.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/memory.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

/// What the ranks' agreement needs: this rank, the number of ranks, and an all-gather of
/// equal parts in host memory (`mine` from every rank into `all`, in rank order).
template <class T>
concept collectives = requires(T& t, const T& ct, std::span<const std::byte> mine, std::span<std::byte> all) {
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  t.all_gather(mine, all);
};

/// Whether `M` names a memory space (memory.hpp).
template <class M>
concept memory_space = std::is_same_v<M, host_memory> || std::is_same_v<M, device_memory>;

/// A transport of every exchange: the collectives above, and
/// - `memory`: the memory space of the compressors it serves, where broadcast() and
///   reduce_broadcast() read and write in place (host_memory: comm::mpi; device_memory:
///   comm::nccl; the compressor's, for the binding's adapter);
/// - on small arrays in host memory: all_gather_v (rank r's sizes[r] bytes, every rank
///   knowing the sizes), all_to_all_v (send_sizes[j] bytes to rank j, recv_sizes[r]
///   bytes from rank r), all_reduce_sum (u32 counts, none above max_sum < 2^32, so
///   that a transport may sum in a narrower type);
/// - on the compressor's memory: all_gather (equal parts: cyclic_topk's verdicts and
///   sparse_allreduce's records and parts of its selection, which the host reads once,
///   after the exchange), all_to_all_v (as above: the entries of sparse_allreduce, which
///   then never leave that memory) and all_reduce_sum (as above: sparse_allreduce's
///   digit histograms), each the one above on a transport of host memory; broadcast
///   (u32 indices from `root`) and
///   reduce_broadcast (float sums reduced at `root`, then broadcast: the same bits on
///   every rank).
/// Each call is a collective: every rank makes the same calls in the same order.
template <class T>
concept transport =
    collectives<T> && memory_space<typename T::memory> &&
    requires(T& t, std::span<const std::byte> bytes, std::span<std::byte> out, std::span<const std::uint64_t> sizes,
             std::span<std::uint32_t> sums, span_in<typename T::memory, const std::byte> entries,
             span_in<typename T::memory, std::byte> received, span_in<typename T::memory, std::uint32_t> index,
             span_in<typename T::memory, float> values, int root) {
      t.all_gather(entries, received);
      t.all_gather_v(bytes, sizes, out);
      t.all_to_all_v(bytes, sizes, out, sizes);
      t.all_to_all_v(entries, sizes, received, sizes);
      t.all_reduce_sum(sums, std::uint64_t{0});
      t.all_reduce_sum(index, std::uint64_t{0});
      t.broadcast(index, root);
      t.reduce_broadcast(values, root);
    };

/// What one rank moved in one collective step: payload bytes it handed to the
/// transport (`sent`), bytes the transport delivered to it from the other ranks
/// (`received`; an all-reduce's result counts whole), and the collectives it took part in.
struct traffic {
  std::uint64_t sent = 0;         ///< bytes this rank handed to the transport
  std::uint64_t received = 0;     ///< bytes delivered to this rank from the others
  std::uint32_t collectives = 0;  ///< collectives this rank took part in
  /// entries of this rank's own message (its compressor's selection; of a sparse_allreduce
  /// whose blocks carried what fits, what they carried)
  std::uint64_t entries = 0;
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
