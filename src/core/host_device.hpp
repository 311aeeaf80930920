// FP4MOE_HD: a function compiled for the host and, under nvcc, for the device too (small
// integer / IEEE helpers whose host and device results must agree bit for bit).
// FP4MOE_HOST_DEVICE: the same without the inline specifier, for functions that bring their own
// (constexpr, or inline in a header shared with plain C++ and the CPU emulator).
#pragma once

#if defined(__CUDACC__)
#define FP4MOE_HD __host__ __device__ __forceinline__
#define FP4MOE_HOST_DEVICE __host__ __device__
#else
#define FP4MOE_HD inline
#define FP4MOE_HOST_DEVICE
#endif
