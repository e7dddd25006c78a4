// Row sums of a row-major float32 matrix: one warp per row, coalesced 16-byte loads,
// warp-shuffle reduction.
//
// The 32 lanes of a warp read 32 consecutive float4 of the same row (512 contiguous bytes per
// load instruction, fully coalesced), with four independent loads in flight per lane to hide
// HBM latency; each lane keeps its own partial sums, and the warp combines them with
// __shfl_xor_sync (no shared memory, no atomics, no __syncthreads). A matrix of R rows
// launches R warps, enough to fill an H200 for R >= a few thousand.
//
// The float4 path needs 16-byte aligned rows (base pointer aligned and cols % 4 == 0);
// otherwise the same warp-per-row kernel runs with coalesced scalar loads.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__global__ void __launch_bounds__(kWarp * kWarpsPerBlock)
row_sum_vec4(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    const int lane = threadIdx.x % kWarp;
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
    if (row >= rows) {
        return;  // whole warps leave together: `row` is uniform across a warp
    }
    const float4* p = reinterpret_cast<const float4*>(in + (size_t)row * cols);
    const int n4 = cols / 4;
    float acc[kUnroll] = {0.0f, 0.0f, 0.0f, 0.0f};
    int i = lane;
    for (; i + (kUnroll - 1) * kWarp < n4; i += kUnroll * kWarp) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            v[u] = __ldg(p + i + u * kWarp);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            acc[u] += (v[u].x + v[u].y) + (v[u].z + v[u].w);
        }
    }
    for (; i < n4; i += kWarp) {
        float4 v = __ldg(p + i);
        acc[0] += (v.x + v.y) + (v.z + v.w);
    }
    float s = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    if (lane == 0) {
        out[row] = s;
    }
}

__global__ void __launch_bounds__(kWarp * kWarpsPerBlock)
row_sum_scalar(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    const int lane = threadIdx.x % kWarp;
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
    if (row >= rows) {
        return;
    }
    const float* p = in + (size_t)row * cols;
    float acc[kUnroll] = {0.0f, 0.0f, 0.0f, 0.0f};
    int c = lane;
    for (; c + (kUnroll - 1) * kWarp < cols; c += kUnroll * kWarp) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            acc[u] += __ldg(p + c + u * kWarp);
        }
    }
    for (; c < cols; c += kWarp) {
        acc[0] += __ldg(p + c);
    }
    float s = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    if (lane == 0) {
        out[row] = s;
    }
}

}  // namespace

extern "C" int launch(const float* in, float* out, int rows, int cols, cudaStream_t stream) {
    if (rows < 0 || cols < 0) {
        return (int)cudaErrorInvalidValue;
    }
    if (rows == 0) {
        return (int)cudaSuccess;
    }
    const int blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const int threads = kWarp * kWarpsPerBlock;
    const bool aligned = (reinterpret_cast<uintptr_t>(in) % 16 == 0) && (cols % 4 == 0);
    if (aligned) {
        row_sum_vec4<<<blocks, threads, 0, stream>>>(in, out, rows, cols);
    } else {
        row_sum_scalar<<<blocks, threads, 0, stream>>>(in, out, rows, cols);
    }
    return (int)cudaGetLastError();
}
