/// \file backend/kokkos.hpp
/// Runs gradcomp on any Kokkos execution space (Kokkos 3.4 and later).
///
/// Needs Kokkos headers (CMake: link gradcomp::kokkos). Every policy runs with Kokkos
/// parallel patterns and gives results identical to backend::host. Gradients, dense
/// outputs and compressor state live in the execution space's memory; messages are
/// written to and read from host memory, where the communication layer wants them.
#pragma once

#include <gradcomp/detail/kokkos/space.hpp>

#include <gradcomp/detail/kokkos/correctors.hpp>
#include <gradcomp/detail/kokkos/index_value.hpp>
#include <gradcomp/detail/kokkos/selectors.hpp>
