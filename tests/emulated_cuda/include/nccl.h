// What NCCL gives gradcomp and its tests, emulated over MPI (emulated_cuda.hpp): each
// rank a process of its own, a communicator an MPI communicator of its own. Test code,
// not API.
//
// A collective (or a group of them, ncclGroupStart .. ncclGroupEnd) runs when it is
// called, after the work queued before it on its stream (read then, as a GPU would when
// it reaches the call), with MPI's nonblocking calls; what it received is written to
// its buffers by an item queued on the stream, so that a host that reads them without
// waiting sees what a GPU may show it. Running at the call, rather than when the host
// waits, keeps the ranks from waiting on each other through their hosts' calls (a GPU
// runs a rank's collective whatever its host does next). Every rank must make the
// same calls in the same order, as NCCL has it.
#pragma once

#include <emulated_cuda.hpp>
#include <mpi.h>

#include <cstring>
#include <functional>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

enum ncclResult_t { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInvalidArgument = 4 };
enum ncclDataType_t { ncclUint8 = 1, ncclUint32 = 3, ncclFloat = 7 };
enum ncclRedOp_t { ncclSum = 0 };
struct ncclUniqueId {
  char internal[128];
};
struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
};
using ncclComm_t = ncclComm*;

namespace emulated_nccl {

inline std::size_t bytes_of(ncclDataType_t type) { return type == ncclUint8 ? 1 : 4; }
inline MPI_Datatype mpi_type(ncclDataType_t type) {
  return type == ncclUint8 ? MPI_BYTE : type == ncclUint32 ? MPI_UINT32_T : MPI_FLOAT;
}

// One call of a group: posts its nonblocking MPI calls, the data it sends read then,
// and names what it received and where that lands once they are done.
struct operation {
  cudaStream_t stream;
  std::function<void(operation&, std::vector<MPI_Request>&)> post;
  std::vector<unsigned char> sent, received;
  void* to = nullptr;  // where `received` lands (null: nowhere)
};
struct group_state {
  int depth = 0;
  std::vector<operation> pending;
};
inline group_state& group() {
  static group_state g;
  return g;
}

// Runs a group's calls: their streams' earlier work first (not a host wait), then the
// MPI calls, then their writes queued on their streams.
inline ncclResult_t run(std::vector<operation> ops) {
  for (const operation& op : ops) {
    const std::uint64_t waits = emulated_cuda::queue().waits;
    emulated_cuda::wait_for(op.stream, /*action=*/false);
    emulated_cuda::queue().waits = waits;
  }
  std::vector<MPI_Request> requests;
  requests.reserve(ops.size());
  for (operation& op : ops) op.post(op, requests);
  if (MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    return ncclSystemError;
  }
  for (operation& op : ops) {
    if (op.to == nullptr || op.received.empty()) continue;
    emulated_cuda::enqueue(op.stream, [to = op.to, received = std::move(op.received)] {
      std::memcpy(to, received.data(), received.size());
    });
  }
  return ncclSuccess;
}
inline ncclResult_t add(cudaStream_t stream, void* to,
                        std::function<void(operation&, std::vector<MPI_Request>&)> post) {
  if (emulated_cuda::queue().capturing != nullptr) return ncclInvalidArgument;  // not emulated under capture
  operation op{stream, std::move(post), {}, {}, to};
  if (group().depth > 0) {
    group().pending.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<operation> one;
  one.push_back(std::move(op));
  return run(std::move(one));
}
// `bytes` bytes at `p` (device memory).
inline std::vector<unsigned char> copy_of(const void* p, std::size_t bytes) {
  const auto* at = static_cast<const unsigned char*>(p);
  return {at, at + bytes};
}
inline void initialize_mpi() {
  int done = 0;
  MPI_Initialized(&done);
  if (done != 0) return;
  MPI_Init(nullptr, nullptr);  // a process of one (the one-rank test): finalized at exit
  std::atexit([] { MPI_Finalize(); });
}

}  // namespace emulated_nccl

inline const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInvalidArgument:
      return "invalid argument";
  }
  return "unknown result";
}
inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 7, sizeof id->internal);
  return ncclSuccess;
}
// A communicator of every rank of MPI_COMM_WORLD (`ranks` must be its size), made by all.
inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int ranks, ncclUniqueId, int rank) {
  emulated_nccl::initialize_mpi();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != ranks) return ncclInvalidArgument;
  auto made = std::make_unique<ncclComm>();
  MPI_Comm_dup(MPI_COMM_WORLD, &made->comm);
  MPI_Comm_rank(made->comm, &made->rank);
  made->size = size;
  if (made->rank != rank) return ncclInvalidArgument;
  *comm = made.release();
  return ncclSuccess;
}
// One process, one device: a communicator of this process alone.
inline ncclResult_t ncclCommInitAll(ncclComm_t* comms, int devices, const int*) {
  if (devices != 1) return ncclInvalidArgument;
  emulated_nccl::initialize_mpi();
  comms[0] = new ncclComm;
  MPI_Comm_dup(MPI_COMM_SELF, &comms[0]->comm);
  return ncclSuccess;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  MPI_Comm_free(&comm->comm);
  delete comm;
  return ncclSuccess;
}
inline ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}
inline ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  *count = comm->size;
  return ncclSuccess;
}
inline ncclResult_t ncclGroupStart() {
  ++emulated_nccl::group().depth;
  return ncclSuccess;
}
inline ncclResult_t ncclGroupEnd() {
  auto& g = emulated_nccl::group();
  if (g.depth == 0) return ncclInvalidArgument;
  if (--g.depth > 0) return ncclSuccess;
  return emulated_nccl::run(std::exchange(g.pending, {}));
}

inline ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclComm_t comm,
                                  cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, recv, [=](auto& op, auto& requests) {
    op.sent = emulated_nccl::copy_of(send, bytes);
    op.received.resize(bytes * static_cast<std::size_t>(comm->size));
    MPI_Iallgather(op.sent.data(), static_cast<int>(bytes), MPI_BYTE, op.received.data(), static_cast<int>(bytes),
                   MPI_BYTE, comm->comm, &requests.emplace_back());
  });
}
inline ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, recv, [=](auto& op, auto& requests) {
    op.received = comm->rank == root ? emulated_nccl::copy_of(send, bytes) : std::vector<unsigned char>(bytes);
    MPI_Ibcast(op.received.data(), static_cast<int>(bytes), MPI_BYTE, root, comm->comm, &requests.emplace_back());
  });
}
inline ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t,
                                  ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, recv, [=](auto& op, auto& requests) {
    op.sent = emulated_nccl::copy_of(send, bytes);
    op.received.resize(bytes);
    MPI_Iallreduce(op.sent.data(), op.received.data(), static_cast<int>(count), emulated_nccl::mpi_type(type), MPI_SUM,
                   comm->comm, &requests.emplace_back());
  });
}
// The sum lands in `recv` at the root only.
inline ncclResult_t ncclReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t,
                               int root, ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, comm->rank == root ? recv : nullptr, [=](auto& op, auto& requests) {
    op.sent = emulated_nccl::copy_of(send, bytes);
    op.received.resize(comm->rank == root ? bytes : 0);
    MPI_Ireduce(op.sent.data(), op.received.data(), static_cast<int>(count), emulated_nccl::mpi_type(type), MPI_SUM,
                root, comm->comm, &requests.emplace_back());
  });
}
inline ncclResult_t ncclSend(const void* send, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, nullptr, [=](auto& op, auto& requests) {
    op.sent = emulated_nccl::copy_of(send, bytes);
    MPI_Isend(op.sent.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, comm->comm, &requests.emplace_back());
  });
}
inline ncclResult_t ncclRecv(void* recv, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, recv, [=](auto& op, auto& requests) {
    op.received.resize(bytes);
    MPI_Irecv(op.received.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, comm->comm, &requests.emplace_back());
  });
}
