// What the CUDA toolkit's <cub/device/device_radix_sort.cuh> gives gradcomp and its tests, emulated
// (emulated_cuda.hpp).
#pragma once
#include <emulated_cuda.hpp>
