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
// runs a rank's collective whatever its host does next). Refused, as NCCL has it: a
// buffer in pageable host memory, a call that writes memory another call of its group
// (or itself, but in NCCL's in-place form) reads or writes, a receive of another size
// than its send; sends are synchronous, as NCCL's wait for their peer.
// Not modelled: the work queued before a collective has run when the call returns (a
// host read of it without a wait is not caught); the host waits for its peers in the
// call; ranks that make different calls (another root, count or order) hang or get
// wrong data rather than an error; a group's streams do not wait for each other.
#pragma once

#include <emulated_cuda.hpp>
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

enum ncclResult_t { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };
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

// A range of device memory a call reads or writes.
struct range {
  const void* at = nullptr;
  std::size_t bytes = 0;
  [[nodiscard]] bool overlaps(const range& o) const {
    const auto* a = static_cast<const unsigned char*>(at);
    const auto* b = static_cast<const unsigned char*>(o.at);
    return bytes != 0 && o.bytes != 0 && a < b + o.bytes && b < a + bytes;
  }
};
// One call of a group: posts its nonblocking MPI calls, the data it sends read then,
// and names what it received and where that lands once they are done.
struct operation {
  cudaStream_t stream;
  range reads, writes;
  const void* in_place;  // the one `reads.at` that may alias `writes` (NCCL's in-place form)
  std::function<void(operation&, std::vector<MPI_Request>&)> post;
  std::vector<unsigned char> sent, received;
  int receive = -1;  // the request of a point-to-point receive, whose size is checked
};
struct group_state {
  int depth = 0;
  std::vector<operation> pending;
};
inline group_state& group() {
  static group_state g;
  return g;
}

// Runs a group's calls: refused where one writes memory another (or itself, but in
// NCCL's in-place form) reads or writes; else their streams' earlier work first (not a
// host wait), then the MPI calls, then their writes queued on their streams.
inline ncclResult_t run(std::vector<operation> ops) {
  for (const operation& op : ops) {
    for (const operation& other : ops) {
      const bool in_place = &op == &other && op.reads.at == op.in_place;
      if ((op.writes.overlaps(other.reads) && !in_place) || (&op != &other && op.writes.overlaps(other.writes))) {
        return ncclInvalidArgument;
      }
    }
  }
  for (const operation& op : ops) {
    const std::uint64_t waits = emulated_cuda::queue().waits;
    emulated_cuda::wait_for(op.stream);  // an action: on the legacy stream, after the blocking ones
    emulated_cuda::queue().waits = waits;
  }
  std::vector<MPI_Request> requests;
  requests.reserve(ops.size());
  for (operation& op : ops) op.post(op, requests);
  std::vector<MPI_Status> statuses(requests.size());
  if (MPI_Waitall(static_cast<int>(requests.size()), requests.data(), statuses.data()) != MPI_SUCCESS) {
    return ncclSystemError;
  }
  for (operation& op : ops) {
    int got = 0;
    if (op.receive >= 0 &&
        (MPI_Get_count(&statuses[static_cast<std::size_t>(op.receive)], MPI_BYTE, &got) != MPI_SUCCESS ||
         static_cast<std::size_t>(got) != op.received.size())) {
      return ncclInvalidUsage;  // a send of another size than the receive
    }
  }
  for (operation& op : ops) {
    if (op.writes.bytes == 0 || op.received.empty()) continue;
    emulated_cuda::enqueue(op.stream, [to = const_cast<void*>(op.writes.at), received = std::move(op.received)] {
      std::memcpy(to, received.data(), received.size());
    });
  }
  return ncclSuccess;
}
// Queues a call that reads `reads` and writes `writes` (device memory, or pinned), or
// runs it outside a group.
inline ncclResult_t add(cudaStream_t stream, range reads, range writes, const void* in_place,
                        std::function<void(operation&, std::vector<MPI_Request>&)> post) {
  if (emulated_cuda::queue().capturing != nullptr) return ncclInvalidArgument;  // not emulated under capture
  for (const range& r : {reads, writes}) {
    if (r.bytes > static_cast<std::size_t>(INT_MAX)) return ncclInvalidArgument;  // one MPI call's most
    if (r.bytes != 0 && emulated_cuda::memory_type(r.at) == cudaMemoryTypeUnregistered) return ncclInvalidArgument;
  }
  operation op{stream, reads, writes, in_place, std::move(post), {}, {}};
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
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Finalize();
  });
}

}  // namespace emulated_nccl

inline const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
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
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank != rank) return ncclInvalidArgument;
  auto made = std::make_unique<ncclComm>();
  MPI_Comm_dup(MPI_COMM_WORLD, &made->comm);
  MPI_Comm_set_errhandler(made->comm, MPI_ERRORS_RETURN);  // a failure is the call's result
  made->rank = rank;
  made->size = size;
  *comm = made.release();
  return ncclSuccess;
}
// One process, one device: a communicator of this process alone.
inline ncclResult_t ncclCommInitAll(ncclComm_t* comms, int devices, const int*) {
  if (devices != 1) return ncclInvalidArgument;
  emulated_nccl::initialize_mpi();
  comms[0] = new ncclComm;
  MPI_Comm_dup(MPI_COMM_SELF, &comms[0]->comm);
  MPI_Comm_set_errhandler(comms[0]->comm, MPI_ERRORS_RETURN);
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
  const auto all = bytes * static_cast<std::size_t>(comm->size);
  return emulated_nccl::add(stream, {send, bytes}, {recv, all},
                            static_cast<const unsigned char*>(recv) + bytes * static_cast<std::size_t>(comm->rank),
                            [=](auto& op, auto& requests) {
                              op.sent = emulated_nccl::copy_of(send, bytes);
                              op.received.resize(all);
                              MPI_Iallgather(op.sent.data(), static_cast<int>(bytes), MPI_BYTE, op.received.data(),
                                             static_cast<int>(bytes), MPI_BYTE, comm->comm, &requests.emplace_back());
                            });
}
// `send` is read at the root only.
inline ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  const emulated_nccl::range reads{comm->rank == root ? send : nullptr, comm->rank == root ? bytes : 0};
  return emulated_nccl::add(stream, reads, {recv, bytes}, recv, [=](auto& op, auto& requests) {
    op.received = comm->rank == root ? emulated_nccl::copy_of(send, bytes) : std::vector<unsigned char>(bytes);
    MPI_Ibcast(op.received.data(), static_cast<int>(bytes), MPI_BYTE, root, comm->comm, &requests.emplace_back());
  });
}
inline ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t,
                                  ncclComm_t comm, cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, {send, bytes}, {recv, bytes}, recv, [=](auto& op, auto& requests) {
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
  const emulated_nccl::range writes{comm->rank == root ? recv : nullptr, comm->rank == root ? bytes : 0};
  return emulated_nccl::add(stream, {send, bytes}, writes, recv, [=](auto& op, auto& requests) {
    op.sent = emulated_nccl::copy_of(send, bytes);
    op.received.resize(comm->rank == root ? bytes : 0);
    MPI_Ireduce(op.sent.data(), op.received.data(), static_cast<int>(count), emulated_nccl::mpi_type(type), MPI_SUM,
                root, comm->comm, &requests.emplace_back());
  });
}
// A synchronous send (done once the peer receives), as NCCL's, which waits for its peer.
inline ncclResult_t ncclSend(const void* send, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, {send, bytes}, {}, nullptr, [=](auto& op, auto& requests) {
    op.sent = emulated_nccl::copy_of(send, bytes);
    MPI_Issend(op.sent.data(), static_cast<int>(bytes), MPI_BYTE, peer, static_cast<int>(type), comm->comm,
               &requests.emplace_back());
  });
}
inline ncclResult_t ncclRecv(void* recv, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  const std::size_t bytes = count * emulated_nccl::bytes_of(type);
  return emulated_nccl::add(stream, {}, {recv, bytes}, nullptr, [=](auto& op, auto& requests) {
    op.received.resize(bytes);
    op.receive = static_cast<int>(requests.size());
    MPI_Irecv(op.received.data(), static_cast<int>(bytes), MPI_BYTE, peer, static_cast<int>(type), comm->comm,
              &requests.emplace_back());
  });
}
