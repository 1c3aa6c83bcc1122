/// \file comm/path.hpp
/// How an aggregation collective moved the data (comm::mpi and comm::nccl).
#pragma once

#include <gradcomp/config.hpp>

GRADCOMP_NAMESPACE_BEGIN
namespace comm {

/// How a collective moved the data.
enum class path {
  sparse,  ///< every message to every rank (all-gather), decoded and accumulated locally
  dense,   ///< each rank's message decoded, dense tensors summed (reduce + broadcast)
};

}  // namespace comm
GRADCOMP_NAMESPACE_END
