// First CUDA kernels of kvscope: per-token symmetric dequantization (CacheGen's quantizer).
// The entropy decoder arrives with the GPU decode work; this file keeps the C interface honest.
#include "kvscope_cuda.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

thread_local std::string g_lastError;

int fail(int code, const std::string& what)
{
    g_lastError = what;
    return code;
}

int check(cudaError_t e, const char* what)
{
    if (e == cudaSuccess) return KVSCOPE_CUDA_OK;
    return fail(KVSCOPE_CUDA_ERUNTIME, std::string(what) + ": " + cudaGetErrorString(e));
}

// One thread per value; the scale of token t is shared by every head and channel.
__global__ void dequantizePerToken(const uint8_t* sym, const uint16_t* scales, int heads, int tokens, int headDim,
                                   int maxLevel, uint16_t* out)
{
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t n = size_t(heads) * tokens * headDim;
    if (i >= n) return;
    const int t = int((i / size_t(headDim)) % size_t(tokens));
    const float s = __half2float(__ushort_as_half(scales[t]));
    // same float operations as the CPU: (q - max) converted to float, times the scale, rounded once
    const float v = __fmul_rn(float(int(sym[i]) - maxLevel), s);
    out[i] = __half_as_ushort(__float2half_rn(v));
}

template <typename T>
struct DeviceBuffer {
    T* p = nullptr;
    ~DeviceBuffer() { if (p) cudaFree(p); }
};

}  // namespace

// The last-error slot shared with decode.cu.
namespace kvscope_cuda_detail {
void setLastError(const std::string& what) { g_lastError = what; }
}  // namespace kvscope_cuda_detail

extern "C" int kvscope_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

extern "C" int kvscope_cuda_device_name(int index, char* name, size_t size, int* major, int* minor)
{
    if (!name || size == 0) return fail(KVSCOPE_CUDA_EINVAL, "name buffer is empty");
    if (index < 0 || index >= kvscope_cuda_device_count()) return fail(KVSCOPE_CUDA_ENODEVICE, "no such CUDA device");
    cudaDeviceProp prop;
    if (int r = check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties")) return r;
    std::snprintf(name, size, "%s", prop.name);
    if (major) *major = prop.major;
    if (minor) *minor = prop.minor;
    return KVSCOPE_CUDA_OK;
}

extern "C" const char* kvscope_cuda_last_error(void) { return g_lastError.c_str(); }

extern "C" int kvscope_cuda_dequantize_per_token(const uint8_t* sym, const uint16_t* scales, int heads, int tokens,
                                                 int headDim, int maxLevel, uint16_t* out)
{
    if (!sym || !scales || !out || heads <= 0 || tokens <= 0 || headDim <= 0 || maxLevel <= 0 || maxLevel > 127)
        return fail(KVSCOPE_CUDA_EINVAL, "invalid dequantize arguments");
    if (kvscope_cuda_device_count() == 0) return fail(KVSCOPE_CUDA_ENODEVICE, "no CUDA device");
    const size_t n = size_t(heads) * tokens * headDim;
    DeviceBuffer<uint8_t> dSym;
    DeviceBuffer<uint16_t> dScales, dOut;
    if (int r = check(cudaMalloc(&dSym.p, n), "cudaMalloc")) return r;
    if (int r = check(cudaMalloc(&dScales.p, size_t(tokens) * 2), "cudaMalloc")) return r;
    if (int r = check(cudaMalloc(&dOut.p, n * 2), "cudaMalloc")) return r;
    if (int r = check(cudaMemcpy(dSym.p, sym, n, cudaMemcpyHostToDevice), "cudaMemcpy")) return r;
    if (int r = check(cudaMemcpy(dScales.p, scales, size_t(tokens) * 2, cudaMemcpyHostToDevice), "cudaMemcpy")) return r;
    const int threads = 256;
    const unsigned blocks = unsigned((n + threads - 1) / threads);
    dequantizePerToken<<<blocks, threads>>>(dSym.p, dScales.p, heads, tokens, headDim, maxLevel, dOut.p);
    if (int r = check(cudaGetLastError(), "kernel launch")) return r;
    return check(cudaMemcpy(out, dOut.p, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
}
