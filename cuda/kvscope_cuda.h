/* kvscope's CUDA backend: a plain C interface with opaque handles and no CUDA types, so core and
 * the app compile and link the same way whether or not this library exists (ggml-cuda.h style).
 *
 * Every function returns 0 on success or a negative KVSCOPE_CUDA_E* code; kvscope_cuda_last_error()
 * gives the message of the last failure on the calling thread. */
#ifndef KVSCOPE_CUDA_H
#define KVSCOPE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    KVSCOPE_CUDA_OK = 0,
    KVSCOPE_CUDA_ENODEVICE = -1, /* no CUDA device (or no driver) */
    KVSCOPE_CUDA_EINVAL = -2,    /* bad argument */
    KVSCOPE_CUDA_ERUNTIME = -3   /* a CUDA runtime call failed */
};

/* Number of CUDA devices visible (0 when there is no driver or device). */
int kvscope_cuda_device_count(void);
/* Name and compute capability of device `index` into name (NUL-terminated, at most size bytes). */
int kvscope_cuda_device_name(int index, char* name, size_t size, int* major, int* minor);
const char* kvscope_cuda_last_error(void);

/* Dequantizes a block quantized per token with CacheGen's symmetric quantizer (no delta):
 *   out[h][t][d] = half((sym[h][t][d] - max_level) * scale[t])
 * sym: (heads, tokens, head_dim) bytes; scales: (tokens) fp16 bits; out: (heads, tokens, head_dim)
 * fp16 bits. All pointers are host memory; the call copies to the device, runs one kernel and
 * copies back. Bit-identical to kvscope::quant::dequantizeBlock rounded to fp16. */
int kvscope_cuda_dequantize_per_token(const uint8_t* sym, const uint16_t* scales, int heads, int tokens,
                                      int head_dim, int max_level, uint16_t* out);

#ifdef __cplusplus
}
#endif

#endif
