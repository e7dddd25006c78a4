// Row sums of a row-major float32 matrix, written the way one first writes it:
// one thread per row, each thread walking its row from left to right.
//
// Correct, but adjacent threads of a warp read addresses `cols` floats apart, so every load
// instruction touches 32 different cache lines (uncoalesced), and a matrix of R rows launches
// only R threads (R / 256 blocks), which leaves most of the SMs idle for tall-but-not-huge R.

#include <cuda_runtime.h>

__global__ void row_sum_kernel(const float* in, float* out, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        const float* row = in + (size_t)r * cols;
        float s = 0.0f;
        for (int c = 0; c < cols; ++c) {
            s += row[c];
        }
        out[r] = s;
    }
}

extern "C" int launch(const float* in, float* out, int rows, int cols, cudaStream_t stream) {
    if (rows < 0 || cols < 0) {
        return (int)cudaErrorInvalidValue;
    }
    if (rows == 0) {
        return (int)cudaSuccess;
    }
    const int threads = 256;
    const int blocks = (rows + threads - 1) / threads;
    row_sum_kernel<<<blocks, threads, 0, stream>>>(in, out, rows, cols);
    return (int)cudaGetLastError();
}
