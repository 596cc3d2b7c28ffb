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

/* ------------------------------------------------------------------------------------------
 * Chunk decoding (core/codec/FORMAT.md): a decoder made from a container's parameters decodes
 * .kvc chunk payloads into one device buffer holding the whole cache, bit-identical to
 * kvscope::decodeChunk. Codecs: cachegen (any level, per-token or per-channel quantizer, delta
 * on or off, in-band or shared tables, one table per channel or per KV head), fp16, int8 and transform (every stage switch: RoPE
 * re-applied to keys, fixed or rANS symbols, token-importance classes, sink/recent fp16 tokens);
 * kivi2/kivi4/zstd are refused (EINVAL).
 *
 * Output layout (one buffer): element (kind, layer, head, token, d) at
 *   (((kind * num_layers + layer) * num_kv_heads + head) * num_tokens + token) * head_dim + d
 * with kind 0 = keys, 1 = values, in the container's dtype (float16, bfloat16 or float32), i.e.
 * every (kind, layer) tensor is (heads, tokens, head_dim) like kvscope::KvSet and Hugging Face.
 *
 * Pipeline: chunks are packed into batches in pinned staging buffers; while batch i is decoded on
 * one CUDA stream, batch i+1 is copied host-to-device on the other. Payloads that already live in
 * memory from kvscope_cuda_host_alloc are copied from there without a host-side copy. */

enum {
    KVSCOPE_CUDA_EDATA = -4 /* a chunk payload is corrupt (message names chunk, block, place) */
};

/* The transform codec's model (codec 6; core/codec/transform.h, FORMAT.md "Transform section"),
 * flattened. B = 2 * num_layers blocks, kind-major (keys first); C = num_kv_heads * head_dim. */
typedef struct kvscope_cuda_transform {
    int rope_undo;          /* keys were coded with RoPE undone: the decoder re-applies it */
    int entropy;            /* 0 fixed-width symbols, 1 rANS with per-component tables (4 states),
                               2 rans32 (the same tables, 32 states x 16-bit words) */
    int token_importance;   /* 2-bit token classes at the head of every block's stream */
    int sink_tokens, recent_tokens;  /* the cache's first / last tokens stored as fp16 */
    int rope_position0;
    const float* rope_inv_freq;      /* head_dim / 2, scaling applied (rope_undo) */
    const float* const* mean;    /* B pointers to C floats */
    const float* const* decode;  /* B pointers to C x C floats, row-major, fp16 values:
                                    x_c = mean_c + sum_j A[c][j] z_j */
    const float* step;      /* num_levels x B x C: Delta_j, 0 = not coded */
    const uint8_t* max_q;   /* num_levels x B x C: M_j, 0 when not coded */
    const uint16_t* freq;   /* rANS: per level, block and coded component (ascending j), 2 M_j + 1 frequencies */
    uint64_t freq_count;    /* entries of freq */
} kvscope_cuda_transform;

typedef struct kvscope_cuda_codec {
    int codec;            /* 0 cachegen, 1 fp16, 2 int8, 6 transform (3 kivi2, 4 kivi4, 5 zstd: refused) */
    int dtype;            /* of the output: 0 float16, 1 bfloat16, 2 float32 */
    int num_layers, num_kv_heads, head_dim, num_tokens;
    int chunk_tokens;     /* N: chunk c covers tokens [c*N, min((c+1)*N, T)) */
    int num_levels;       /* cachegen: 1..64; baselines: 1 */
    int key_quantizer;    /* 0 per token, 1 per channel */
    int value_quantizer;
    int delta_group;      /* 0 = no delta coding, else 2..N */
    int anchor_bins;      /* 0 = anchors use their layer's bins */
    int table_mode;       /* 0 in-band, 1 shared */
    int table_scope;      /* 0 one probability table per channel, 1 one per KV head (format 2.2; needs
                             entropy_layout 2) */
    int entropy_layout;   /* cachegen streams: 2 (or 0) = format 2.x, 32 states x 16-bit words,
                             decoded by one warp per stream; 1 = format 1.x, 4 states x bytes */
    const uint16_t* key_bins;   /* cachegen: num_levels * num_layers, level-major */
    const uint16_t* value_bins;
    const uint8_t* const* level_tables;  /* table_mode 1: one blob per level (FORMAT.md tables section) */
    const uint64_t* level_table_bytes;
    const kvscope_cuda_transform* transform;  /* codec 6; num_levels = the model's levels */
} kvscope_cuda_codec;

typedef struct kvscope_cuda_chunk {
    int chunk;            /* 0-based */
    int level;            /* 1-based */
    const uint8_t* data;  /* host memory (pinned or not) */
    uint64_t size;
} kvscope_cuda_chunk;

typedef struct kvscope_cuda_timing {
    double wall_ms;       /* kvscope_cuda_decode from call to return */
    double h2d_ms;        /* sum of the host-to-device copies (CUDA events) */
    double table_ms;      /* sum of the table kernels (in-band tables) */
    double kernel_ms;     /* sum of the stream decode kernels (transform: the GEMM and raw-token kernels) */
    double stage_ms;      /* host copies into pinned staging (pageable input only) */
    double entropy_ms;    /* transform: the symbol kernel (classes, rANS, escapes); not in kernel_ms */
    uint64_t h2d_bytes;
    uint64_t output_bytes; /* bytes written for the decoded chunks */
    int batches;
} kvscope_cuda_timing;

typedef struct kvscope_cuda_decoder kvscope_cuda_decoder;

/* Validates the parameters (and parses shared tables), allocates the device output and two
 * staging batches of about batch_bytes each (0 = 256 MiB). device: CUDA device index. */
int kvscope_cuda_decoder_create(const kvscope_cuda_codec* codec, int device, uint64_t batch_bytes,
                                kvscope_cuda_decoder** out);
void kvscope_cuda_decoder_destroy(kvscope_cuda_decoder* dec);

/* Decodes `count` chunks into the device output and waits for them. Every payload's layout is
 * validated on the host before launch; the kernels bound every read and report corrupt tables or
 * streams through device memory. Returns KVSCOPE_CUDA_EDATA (message: chunk, block, reason) for a
 * corrupt payload; the output then holds unspecified values for that chunk. */
int kvscope_cuda_decode(kvscope_cuda_decoder* dec, const kvscope_cuda_chunk* chunks, int count);

/* The device output (valid until destroy) and its size in bytes. */
int kvscope_cuda_decoder_output(kvscope_cuda_decoder* dec, void** device_ptr, uint64_t* bytes);
/* Copies `bytes` from offset `offset` of the device output to host memory. */
int kvscope_cuda_decoder_copy_output(kvscope_cuda_decoder* dec, uint64_t offset, void* host, uint64_t bytes);
/* Timing of the last kvscope_cuda_decode call. */
int kvscope_cuda_decoder_timing(const kvscope_cuda_decoder* dec, kvscope_cuda_timing* t);

/* Page-locked host memory: payloads placed here skip the staging copy. NULL on failure. */
void* kvscope_cuda_host_alloc(uint64_t bytes);
void kvscope_cuda_host_free(void* p);

#ifdef __cplusplus
}
#endif

#endif
