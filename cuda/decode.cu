// GPU decoding of .kvc chunk payloads (kvscope_cuda.h): the kernels are thin shells around the
// per-thread functions of decode_core.h, which the CPU emulation test runs on the host; the host
// code validates every payload (decode_plan.h) before anything is launched, packs chunks into
// batches and pipelines them over two CUDA streams (batch i+1 copied while batch i decodes).
#include "decode_core.h"
#include "decode_plan.h"
#include "kvscope_cuda.h"
#include "transform_core.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <vector>

using namespace kvscope::gpu;

namespace kvscope_cuda_detail {
void setLastError(const std::string& what);  // dequantize.cu
}

namespace {

int fail(int code, const std::string& what)
{
    kvscope_cuda_detail::setLastError(what);
    return code;
}

#define KVS_CUDA_TRY(call, what)                                                                         \
    do {                                                                                                 \
        const cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return fail(KVSCOPE_CUDA_ERUNTIME, std::string(what) + ": " + cudaGetErrorString(e_)); \
    } while (0)

// One chunk of a batch, as the kernels see it. Offsets are relative to the batch buffer (bytes)
// or to the table store / offset scratch (elements).
struct ChunkDesc {
    ChunkGeom g;
    uint64_t payload;  // bytes: the chunk payload
    uint64_t plan;     // bytes: BlockPlan[2L] then StreamPlan[2L * H]
    uint64_t store;    // elements: this chunk's table store (in-band scratch or the shared level)
    uint64_t offsets;  // elements: this chunk's table offsets (in-band)
};

constexpr int kScanThreads = 64;
constexpr int kBuildThreads = 256;

__device__ __forceinline__ bool chunkFailed(const ErrorInfo* e) { return *(volatile const int32_t*)&e->code != 0; }

// One thread per block (kind, layer): where each in-band table starts.
__global__ void scanKernel(const uint8_t* batch, uint32_t* offsets, ErrorInfo* errs)
{
    const ChunkDesc cd = reinterpret_cast<const ChunkDesc*>(batch)[blockIdx.y];
    const int u = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (u >= 2 * cd.g.L) return;
    const BlockPlan bp = reinterpret_cast<const BlockPlan*>(batch + cd.plan)[u];
    const int C = tablesPerRole(cd.g);
    uint32_t end = 0;
    int32_t bad = 0;
    int32_t code = scanBlockTables(batch + cd.payload, bp.tableBegin, bp.tableEnd, C, cd.g.roles, bp.alphabet,
                                   offsets + cd.offsets + size_t(u) * cd.g.roles * C, &end, &bad);
    if (code == kOk && end != bp.tableEnd) code = kErrTableTrailing;
    if (code != kOk) setError(&errs[blockIdx.y], code, u, bad);
}

// One thread per (block, role, table): frequencies -> cumulative starts.
__global__ void buildKernel(const uint8_t* batch, const uint32_t* offsets, uint16_t* store, ErrorInfo* errs)
{
    const ChunkDesc cd = reinterpret_cast<const ChunkDesc*>(batch)[blockIdx.y];
    const int C = tablesPerRole(cd.g), perBlock = cd.g.roles * C;
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(2) * cd.g.L * perBlock || chunkFailed(&errs[blockIdx.y])) return;
    const int u = int(idx / perBlock), i = int(idx % perBlock), r = i / C, c = i % C;
    const BlockPlan bp = reinterpret_cast<const BlockPlan*>(batch + cd.plan)[u];
    const int A = bp.alphabet[r];
    const int32_t code = buildTable(batch + cd.payload, bp.tableBegin, offsets[cd.offsets + idx], bp.tableEnd, A,
                                    store + cd.store + bp.tableStore[r] + size_t(c) * (A + 1));
    if (code != kOk) setError(&errs[blockIdx.y], code, u, i);
}

// One thread per (block, head): rANS + dequantization + delta into the output layout. Anchor
// symbols live in shared memory, d-major so that neighbouring threads use neighbouring bytes.
__global__ void decodeKernel(const uint8_t* batch, const uint16_t* tables, ErrorInfo* errs, void* out)
{
    extern __shared__ uint8_t anchorShm[];
    const ChunkDesc cd = reinterpret_cast<const ChunkDesc*>(batch)[blockIdx.y];
    const int idx = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= 2 * cd.g.L * cd.g.H || chunkFailed(&errs[blockIdx.y])) return;
    const int u = idx / cd.g.H, h = idx % cd.g.H;
    const BlockPlan* bps = reinterpret_cast<const BlockPlan*>(batch + cd.plan);
    const StreamPlan* sps = reinterpret_cast<const StreamPlan*>(bps + 2 * cd.g.L);
    const BlockPlan bp = bps[u];
    const int32_t code = decodeStream(batch + cd.payload, cd.g, bp, sps[idx], u, h, tables + cd.store,
                                      anchorShm + threadIdx.x, int(blockDim.x), out);
    if (code != kOk) setError(&errs[blockIdx.y], code, u, h);
}

// Format 2.x streams: one warp per (block, head), lane j owning state j (decode_core.h w32Phase1/2).
// Every branch a warp takes before its ballots is uniform across the warp (same stream, same step).
// Dynamic shared memory: with per-head tables, kW32HeadTableElems starts per warp (the stream's
// tables, copied once), then every warp's anchor ring of ringBytes.
constexpr int kW32Warps = 4;

__global__ void decodeKernelW32(const uint8_t* batch, const uint16_t* tables, ErrorInfo* errs, void* out, int ringBytes)
{
    extern __shared__ __align__(16) uint8_t w32Shm[];
    const ChunkDesc cd = reinterpret_cast<const ChunkDesc*>(batch)[blockIdx.y];
    const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
    const int idx = int(blockIdx.x) * kW32Warps + warp;
    if (idx >= 2 * cd.g.L * cd.g.H) return;
    const int failed = __shfl_sync(0xffffffffu, lane == 0 ? int(chunkFailed(&errs[blockIdx.y])) : 0, 0);
    if (failed) return;
    const int u = idx / cd.g.H, h = idx % cd.g.H;
    const BlockPlan* bps = reinterpret_cast<const BlockPlan*>(batch + cd.plan);
    const StreamPlan sp = reinterpret_cast<const StreamPlan*>(bps + 2 * cd.g.L)[idx];
    const BlockPlan bp = bps[u];
    const uint8_t* payload = batch + cd.payload;
    const size_t tableShm = cd.g.perHead ? size_t(kW32Warps) * kW32HeadTableElems * sizeof(uint16_t) : 0;
    uint8_t* ring = w32Shm + tableShm + size_t(warp) * size_t(ringBytes);
    if (sp.size < 128) {
        if (lane == 0) setError(&errs[blockIdx.y], kErrStream, u, h);
        return;
    }
    const uint8_t* s = payload + sp.offset;
    uint32_t x = uint32_t(s[4 * lane]) | uint32_t(s[4 * lane + 1]) << 8 | uint32_t(s[4 * lane + 2]) << 16 |
                 uint32_t(s[4 * lane + 3]) << 24;
    const uint8_t* words = s + 128;
    const uint32_t nwords = (sp.size - 128) / 2, below = (1u << lane) - 1u;
    uint32_t pos = 0;
    bool overrun = false;
    W32Tables tab = w32StreamTables(cd.g, bp, h, tables + cd.store);
    if (cd.g.perHead) {  // the head's one or two tables, into this warp's shared memory
        uint16_t* local = reinterpret_cast<uint16_t*>(w32Shm) + size_t(warp) * kW32HeadTableElems;
        tab = w32CopyHeadTables(cd.g, bp, tab, lane, 32, local);
        __syncwarp();
    }
    for (int step = 0, steps = w32Steps(cd.g); step < steps; ++step) {
        W32Lane w;
        w32Phase1(cd.g, bp, step, lane, x, tab, ring, &w);
        const unsigned need = __ballot_sync(0xffffffffu, w.active && w.need);
        __syncwarp();  // anchor symbols of this step are in the ring before phase 2 reads them
        uint32_t word = 0;
        if (w.active && w.need) {
            const uint32_t at = pos + uint32_t(__popc(need & below));
            if (at < nwords) word = loadU16(words + 2 * size_t(at));
            else overrun = true;
        }
        pos += uint32_t(__popc(need));
        x = w32Phase2(payload, cd.g, bp, u, h, w, word, ring, out);
        __syncwarp();
    }
    const bool bad = __any_sync(0xffffffffu, overrun || x != kW32L) || pos != nwords || (sp.size & 1u);
    if (bad && lane == 0) setError(&errs[blockIdx.y], kErrStream, u, h);
}

// fp16 / int8: one thread per (block, head).
__global__ void baselineKernel(const uint8_t* batch, void* out)
{
    const ChunkDesc cd = reinterpret_cast<const ChunkDesc*>(batch)[blockIdx.y];
    const int idx = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= 2 * cd.g.L * cd.g.H) return;
    decodeBaselineHead(batch + cd.payload, cd.g, idx / cd.g.H, idx % cd.g.H, out);
}

// ---- transform codec (transform_core.h) ------------------------------------------------------

// One transform chunk of a batch: geometry, payload and plan offsets (bytes, batch-relative),
// scratch offset (elements) and where the chunk's level starts in the component and table stores.
struct TfChunkDesc {
    TfGeom g;
    uint64_t payload;  // bytes: the chunk payload
    uint64_t plan;     // bytes: TfBlockPlan[2L]
    uint64_t zq;       // elements of the slot's scratch
    uint64_t comps;    // elements of the component store: the level's first TfComp
    uint64_t tables;   // elements of the table store: the level's first start
    uint64_t tileK;    // elements of the tile-range store: the level's first entry
};

constexpr int kTfSymbolThreads = 32;

// One thread per (chunk, block): classes, symbols, escapes -> zq.
__global__ void tfSymbolsKernel(const uint8_t* batch, const TfComp* comps, const uint16_t* tables, float* zq, ErrorInfo* errs)
{
    const TfChunkDesc cd = reinterpret_cast<const TfChunkDesc*>(batch)[blockIdx.y];
    const int b = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (b >= 2 * cd.g.L) return;
    const TfBlockPlan bp = reinterpret_cast<const TfBlockPlan*>(batch + cd.plan)[b];
    const int32_t code = tfDecodeBlockSymbols(batch + cd.payload, cd.g, bp, comps + cd.comps + bp.comps, tables + cd.tables,
                                              zq + cd.zq + bp.zq);
    if (code != kOk) setError(&errs[blockIdx.y], code, b, 0);
}

// rans32 (entropy 2) matrices decoded by a warp in lock step: lane `lane` owns state `lane`, the
// 32 lanes step symbols 32 g .. 32 g + 31 together and the lanes that need a word take the next
// words in lane order (a ballot and a popcount): tfDecodeMatrixW32's decomposition, ballots in
// place of its lane loop. Every branch that returns is taken by all lanes alike.
struct TfW32Warp {
    int lane;
    __device__ int32_t operator()(const uint8_t* p, uint32_t size, int rows, int K, const TfComp* comps,
                                  const uint16_t* tables, int cls, const uint8_t* classes, int R, float* zq) const
    {
        const uint64_t n = uint64_t(rows) * uint64_t(K);
        if (n == 0) return size == 0 ? kOk : kErrStream;
        if (size < 128) return kErrStream;
        uint32_t x = tfU32(p + 4 * lane);
        uint32_t pos = 128;
        int curRow = 0, curScratch = tfFirstScratchRow(classes, cls, R);
        const unsigned below = (1u << lane) - 1u;
        for (uint64_t base = 0; base < n; base += 32) {
            TfW32Lane w;
            tfW32Phase1(base + uint64_t(lane), n, K, comps, tables, cls, classes, R, curRow, curScratch, x, &w);
            const unsigned need = __ballot_sync(0xffffffffu, w.need);
            const uint32_t words = uint32_t(__popc(need));
            if (size - pos < 2 * words) return kErrStream;
            if (w.active) {
                uint32_t v = w.x;
                if (w.need) {
                    const uint32_t at = pos + 2u * uint32_t(__popc(need & below));
                    v = (v << 16) | uint32_t(p[at]) | uint32_t(p[at + 1]) << 8;
                }
                x = v;
                zq[w.at] = float(w.sym);
            }
            pos += 2 * words;
            tfW32Advance(base, n, K, classes, cls, R, &curRow, &curScratch);
        }
        const bool statesOk = __all_sync(0xffffffffu, x == kTfW32L);
        return statesOk && pos == size ? kOk : kErrStream;
    }
};

// One warp per (chunk, block) of a rans32 model: classes and class stream sizes on every lane
// (the same reads), each matrix in lock step, then lane 0 resolves the escapes in row order.
__global__ void tfSymbolsWarpKernel(const uint8_t* batch, const TfComp* comps, const uint16_t* tables, float* zq,
                                    ErrorInfo* errs)
{
    const TfChunkDesc cd = reinterpret_cast<const TfChunkDesc*>(batch)[blockIdx.y];
    const int b = int(blockIdx.x), lane = int(threadIdx.x);
    if (b >= 2 * cd.g.L) return;  // the whole warp
    const TfBlockPlan bp = reinterpret_cast<const TfBlockPlan*>(batch + cd.plan)[b];
    const TfComp* cp = comps + cd.comps + bp.comps;
    float* z = zq + cd.zq + bp.zq;
    const uint8_t* classes = nullptr;
    int32_t code = tfBlockMatrices(batch + cd.payload, cd.g, bp, cp, tables + cd.tables, z, &classes, TfW32Warp{lane});
    __syncwarp();  // every lane's symbols are in z before lane 0 reads them
    if (lane != 0) return;
    if (code == kOk) code = tfResolveSymbols(batch + cd.payload, cd.g, bp, cp, classes, z);
    if (code != kOk) setError(&errs[blockIdx.y], code, b, 0);
}

// One 256-thread tile per (unit tile, row tile, chunk * 2L + block): the exact-order GEMM with the
// RoPE and store epilogue. A failed chunk's tiles return before any barrier (uniformly).
__global__ void __launch_bounds__(kTfThreads) tfGemmKernel(const uint8_t* batch, int blocksPerChunk, const uint16_t* At,
                                                           const float* mean, const TfComp* comps, const float* zq,
                                                           const uint32_t* tileK, const double* rope, const ErrorInfo* errs,
                                                           void* out)
{
    __shared__ TfTileShm shm;
    const int ci = int(blockIdx.z) / blocksPerChunk, b = int(blockIdx.z) % blocksPerChunk;
    const TfChunkDesc cd = reinterpret_cast<const TfChunkDesc*>(batch)[ci];
    const int row0 = int(blockIdx.y) * kTfTileRows, unit0 = int(blockIdx.x) * kTfTileUnits;
    if (row0 >= cd.g.R || errs[ci].code != kOk) return;
    const TfBlockPlan bp = reinterpret_cast<const TfBlockPlan*>(batch + cd.plan)[b];
    const int C = cd.g.H * cd.g.D, tid = int(threadIdx.x);
    const TfComp* cp = comps + cd.comps + bp.comps;
    const uint16_t* A = At + size_t(b) * C * C;
    TfAcc acc;
    tfInitAcc(tid, cd.g, mean + size_t(b) * C, unit0, &acc);
    const uint32_t* kr = tileK + cd.tileK + bp.tileK + 2 * size_t(blockIdx.x);
    const int kEnd = int(kr[1]);
    for (int k0 = int(kr[0]); k0 < kEnd; k0 += kTfTileK) {
        tfLoadTile(tid, cd.g, bp, cp, zq + cd.zq + bp.zq, A, row0, unit0, k0, kEnd, &shm);
        __syncthreads();
        tfComputeTile(tid, min(kTfTileK, kEnd - k0), &shm, &acc);
        __syncthreads();
    }
    tfStoreTile(tid, cd.g, b, rope, row0, unit0, &acc, out);
}

// One thread per raw (sink / recent) value of (chunk * 2L + block).
__global__ void tfRawKernel(const uint8_t* batch, int blocksPerChunk, const ErrorInfo* errs, void* out)
{
    const int ci = int(blockIdx.y) / blocksPerChunk, b = int(blockIdx.y) % blocksPerChunk;
    const TfChunkDesc cd = reinterpret_cast<const TfChunkDesc*>(batch)[ci];
    const uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= uint32_t(cd.g.n - cd.g.R) * uint32_t(cd.g.H * cd.g.D) || errs[ci].code != kOk) return;
    const TfBlockPlan bp = reinterpret_cast<const TfBlockPlan*>(batch + cd.plan)[b];
    tfRawValue(batch + cd.payload, cd.g, bp, b, e, out);
}

template <typename T>
int grow(T** p, size_t* cap, size_t need, const char* what)
{
    if (need <= *cap && *p) return KVSCOPE_CUDA_OK;
    if (*p) cudaFree(*p);
    *p = nullptr;
    *cap = 0;
    const size_t n = std::max<size_t>(need, 1);
    KVS_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(p), n * sizeof(T)),
                 std::string("cudaMalloc of ") + std::to_string(n * sizeof(T)) + " bytes for " + what);
    *cap = n;
    return KVSCOPE_CUDA_OK;
}

int growPinned(uint8_t** p, size_t* cap, size_t need)
{
    if (need <= *cap && *p) return KVSCOPE_CUDA_OK;
    if (*p) cudaFreeHost(*p);
    *p = nullptr;
    *cap = 0;
    KVS_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(p), std::max<size_t>(need, 1)),
                 "cudaMallocHost of " + std::to_string(need) + " bytes of staging");
    *cap = std::max<size_t>(need, 1);
    return KVSCOPE_CUDA_OK;
}

size_t align16(size_t x) { return (x + 15) & ~size_t(15); }

double nowMs() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

// A batch in flight: its staging, device buffers, stream and events.
struct Slot {
    cudaStream_t stream = nullptr;
    cudaEvent_t ev[4] = {nullptr, nullptr, nullptr, nullptr};  // start, copied, tables built, decoded
    uint8_t* pinned = nullptr;
    size_t pinnedCap = 0;
    uint8_t* batch = nullptr;
    size_t batchCap = 0;
    uint16_t* store = nullptr;
    size_t storeCap = 0;
    uint32_t* offsets = nullptr;
    size_t offsetsCap = 0;
    ErrorInfo* errs = nullptr;
    size_t errsCap = 0;
    float* zq = nullptr;            // transform: dequantized components of the batch
    size_t zqCap = 0;
    ErrorInfo* hostErrs = nullptr;  // pinned
    size_t hostErrsCap = 0;
    bool busy = false;
    std::vector<kvscope_cuda_chunk> chunks;  // of the batch in flight
};

struct kvscope_cuda_decoder {
    Codec codec;
    int device = 0;
    uint64_t batchBytes = 0;
    void* out = nullptr;
    uint64_t outBytes = 0;
    uint16_t* shared = nullptr;           // table stores of every level (table_mode 1)
    std::vector<uint64_t> sharedOffset;   // per level, elements
    Slot slots[2];
    // transform codec: the model on the device
    uint16_t* tfAt = nullptr;               // 2L x C x C fp16 (transposed decode matrices)
    float* tfMean = nullptr;                // 2L x C
    TfComp* tfComps = nullptr;              // every level's components
    uint16_t* tfTables = nullptr;           // every level's start tables
    double* tfRope = nullptr;               // T x D/2 x {cos, sin}
    uint32_t* tfTileK = nullptr;            // every level's k range per (block, unit tile)
    std::vector<uint64_t> tfCompBase, tfTableBase, tfTileBase;  // per level
    kvscope_cuda_timing timing{};
    std::string firstError;
    int firstErrorCode = KVSCOPE_CUDA_OK;
};

namespace {

void releaseSlot(Slot& s)
{
    if (s.stream) cudaStreamSynchronize(s.stream);
    for (cudaEvent_t& e : s.ev)
        if (e) cudaEventDestroy(e), e = nullptr;
    if (s.pinned) cudaFreeHost(s.pinned);
    if (s.hostErrs) cudaFreeHost(s.hostErrs);
    if (s.batch) cudaFree(s.batch);
    if (s.store) cudaFree(s.store);
    if (s.offsets) cudaFree(s.offsets);
    if (s.errs) cudaFree(s.errs);
    if (s.zq) cudaFree(s.zq);
    if (s.stream) cudaStreamDestroy(s.stream);
    s = Slot{};
}

// Waits for the slot's batch, adds its timings and records its first corrupt chunk.
int finishSlot(kvscope_cuda_decoder* d, Slot& s)
{
    if (!s.busy) return KVSCOPE_CUDA_OK;
    s.busy = false;
    KVS_CUDA_TRY(cudaStreamSynchronize(s.stream), "decode kernels");
    float ms = 0;
    const bool cachegen = d->codec.codec == 0, transform = d->codec.codec == 6;
    if (cudaEventElapsedTime(&ms, s.ev[0], s.ev[1]) == cudaSuccess) d->timing.h2d_ms += ms;
    if (cachegen && d->codec.tableMode == 0 && cudaEventElapsedTime(&ms, s.ev[1], s.ev[2]) == cudaSuccess)
        d->timing.table_ms += ms;
    if (transform && cudaEventElapsedTime(&ms, s.ev[1], s.ev[2]) == cudaSuccess) d->timing.entropy_ms += ms;
    if (cudaEventElapsedTime(&ms, s.ev[2], s.ev[3]) == cudaSuccess) d->timing.kernel_ms += ms;
    if (!cachegen && !transform) return KVSCOPE_CUDA_OK;
    for (size_t i = 0; i < s.chunks.size(); ++i)
        if (s.hostErrs[i].code != kOk && d->firstErrorCode == KVSCOPE_CUDA_OK) {
            d->firstErrorCode = KVSCOPE_CUDA_EDATA;
            d->firstError = "chunk " + std::to_string(s.chunks[i].chunk) + " (level " + std::to_string(s.chunks[i].level) +
                            "): " + errorMessage(d->codec, s.hostErrs[i]);
        }
    return KVSCOPE_CUDA_OK;
}

bool isPinned(const void* p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

// The staging every batch shares, once its device buffers have grown: pinned error records for
// the results; then, timed as staging, per chunk its descriptor, its plans (stagePlans(i) writes
// them at descs[i].plan) and its pageable payload into pinned staging; then, on the slot's
// stream, the head and every payload to the device (a pinned payload straight from the caller's
// memory) and the cleared error records. chunks, plans: the batch's first chunk and its plan.
template <typename Desc, typename Plan, typename StagePlans>
int stageBatch(kvscope_cuda_decoder* d, Slot& s, const kvscope_cuda_chunk* chunks, const Plan* plans,
               const std::vector<Desc>& descs, const std::vector<bool>& pinned, size_t headBytes, StagePlans stagePlans)
{
    const Codec& c = d->codec;
    const int count = int(descs.size());
    if (s.hostErrsCap < size_t(count)) {
        if (s.hostErrs) cudaFreeHost(s.hostErrs);
        s.hostErrs = nullptr;
        s.hostErrsCap = 0;
        KVS_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&s.hostErrs), size_t(count) * sizeof(ErrorInfo)), "cudaMallocHost");
        s.hostErrsCap = size_t(count);
    }
    const double t0 = nowMs();
    std::memcpy(s.pinned, descs.data(), count * sizeof(Desc));
    for (int i = 0; i < count; ++i) {
        stagePlans(i);
        if (!pinned[size_t(i)] && chunks[i].size) std::memcpy(s.pinned + descs[size_t(i)].payload, chunks[i].data, chunks[i].size);
    }
    d->timing.stage_ms += nowMs() - t0;
    // Device side, in stream order: copies, then the caller's kernels; the other slot's stream runs meanwhile.
    KVS_CUDA_TRY(cudaEventRecord(s.ev[0], s.stream), "cudaEventRecord");
    KVS_CUDA_TRY(cudaMemcpyAsync(s.batch, s.pinned, headBytes, cudaMemcpyHostToDevice, s.stream), "cudaMemcpyAsync");
    uint64_t h2d = headBytes;
    for (int i = 0; i < count; ++i) {
        const kvscope_cuda_chunk& ch = chunks[i];
        d->timing.output_bytes += uint64_t(2) * c.L * c.H * uint64_t(plans[i].geom.n) * c.D * c.dtypeBytes();
        if (!ch.size) continue;
        const size_t at = descs[size_t(i)].payload;
        const uint8_t* src = pinned[size_t(i)] ? ch.data : s.pinned + at;
        KVS_CUDA_TRY(cudaMemcpyAsync(s.batch + at, src, ch.size, cudaMemcpyHostToDevice, s.stream), "cudaMemcpyAsync");
        h2d += ch.size;
    }
    d->timing.h2d_bytes += h2d;
    KVS_CUDA_TRY(cudaMemsetAsync(s.errs, 0, size_t(count) * sizeof(ErrorInfo), s.stream), "cudaMemsetAsync");
    KVS_CUDA_TRY(cudaEventRecord(s.ev[1], s.stream), "cudaEventRecord");
    return KVSCOPE_CUDA_OK;
}

// After a batch's kernels: its error records back to the host, and the slot busy with chunks
// [first, last).
int finishLaunch(kvscope_cuda_decoder* d, Slot& s, const kvscope_cuda_chunk* chunks, int first, int last)
{
    KVS_CUDA_TRY(cudaEventRecord(s.ev[3], s.stream), "cudaEventRecord");
    KVS_CUDA_TRY(cudaMemcpyAsync(s.hostErrs, s.errs, size_t(last - first) * sizeof(ErrorInfo), cudaMemcpyDeviceToHost, s.stream),
                 "cudaMemcpyAsync");
    s.chunks.assign(chunks + first, chunks + last);
    s.busy = true;
    ++d->timing.batches;
    return KVSCOPE_CUDA_OK;
}

// The batch's byte layout, the same for both codecs: [Desc x count][count plans of planBytes each]
// [payloads, each 16-byte aligned]. Fills every descriptor's geometry, plan and payload offsets and
// pinned[i] (the chunk already sits in pinned host memory and is copied from there; the others are
// staged through s.pinned, which grows to hold them); grows the device batch to the last payload's
// end. *headBytes: the descriptors and plans, copied in one piece.
template <typename Desc, typename Plan>
int layOutBatch(Slot& s, const kvscope_cuda_chunk* chunks, const Plan* plans, size_t planBytes, std::vector<Desc>& descs,
                std::vector<bool>& pinned, size_t* headBytes)
{
    const int count = int(descs.size());
    *headBytes = align16(count * sizeof(Desc)) + size_t(count) * planBytes;
    size_t pos = *headBytes, stagedEnd = *headBytes;
    for (int i = 0; i < count; ++i) {
        Desc& cd = descs[size_t(i)];
        cd.g = plans[i].geom;
        cd.plan = align16(count * sizeof(Desc)) + size_t(i) * planBytes;
        cd.payload = pos;
        pinned[size_t(i)] = isPinned(chunks[i].data);
        pos = align16(pos + chunks[i].size);
        if (!pinned[size_t(i)]) stagedEnd = pos;
    }
    if (int r = growPinned(&s.pinned, &s.pinnedCap, stagedEnd)) return r;
    return grow(&s.batch, &s.batchCap, pos, "a chunk batch");
}

// Packs chunks [first, last) into slot s and launches their copies and kernels on its stream.
int launchBatch(kvscope_cuda_decoder* d, Slot& s, const kvscope_cuda_chunk* chunks, const std::vector<ChunkPlan>& plans,
                int first, int last)
{
    const Codec& c = d->codec;
    const int count = last - first;
    const int units = 2 * c.L, C = c.tablesPerRole(), roles = c.roles();  // C: tables per role
    const bool cachegen = c.codec == 0, inBand = cachegen && c.tableMode == 0;
    const size_t planBytes = cachegen ? align16(units * sizeof(BlockPlan) + size_t(units) * c.H * sizeof(StreamPlan)) : 0;
    std::vector<ChunkDesc> descs(static_cast<size_t>(count));
    std::vector<bool> pinned(static_cast<size_t>(count));
    size_t headBytes = 0;
    if (int r = layOutBatch(s, chunks + first, plans.data() + first, planBytes, descs, pinned, &headBytes)) return r;
    uint64_t store = 0, offs = 0;
    for (int i = 0; i < count; ++i) {
        const kvscope_cuda_chunk& ch = chunks[first + i];
        const ChunkPlan& pl = plans[size_t(first + i)];
        ChunkDesc& cd = descs[size_t(i)];
        if (inBand) {
            cd.store = store;
            cd.offsets = offs;
            store += pl.storeElems;
            offs += uint64_t(units) * roles * C;
        } else if (cachegen) {
            cd.store = d->sharedOffset[size_t(ch.level - 1)];
        }
    }
    if (inBand) {
        if (int r = grow(&s.store, &s.storeCap, store, "probability tables")) return r;
        if (int r = grow(&s.offsets, &s.offsetsCap, offs, "table offsets")) return r;
    }
    if (int r = grow(&s.errs, &s.errsCap, size_t(count), "error records")) return r;
    const auto stagePlans = [&](int i) {  // block and stream plans (cachegen)
        if (!cachegen) return;
        const ChunkPlan& pl = plans[size_t(first + i)];
        uint8_t* at = s.pinned + descs[size_t(i)].plan;
        std::memcpy(at, pl.blocks.data(), pl.blocks.size() * sizeof(BlockPlan));
        std::memcpy(at + pl.blocks.size() * sizeof(BlockPlan), pl.streams.data(), pl.streams.size() * sizeof(StreamPlan));
    };
    if (int r = stageBatch(d, s, chunks + first, plans.data() + first, descs, pinned, headBytes, stagePlans)) return r;
    if (inBand) {
        scanKernel<<<dim3((units + kScanThreads - 1) / kScanThreads, count), kScanThreads, 0, s.stream>>>(s.batch, s.offsets, s.errs);
        const size_t tables = size_t(units) * roles * C;
        buildKernel<<<dim3(unsigned((tables + kBuildThreads - 1) / kBuildThreads), count), kBuildThreads, 0, s.stream>>>(
            s.batch, s.offsets, s.store, s.errs);
        KVS_CUDA_TRY(cudaGetLastError(), "table kernels");
    }
    KVS_CUDA_TRY(cudaEventRecord(s.ev[2], s.stream), "cudaEventRecord");
    const int threads = c.D > 512 ? 32 : 64;
    const unsigned blocks = unsigned((units * c.H + threads - 1) / threads);
    if (cachegen && c.layout == 2) {
        const int ringBytes = w32AnchorRing(c.D, c.deltaGroup) * c.D;
        const size_t tableShm = c.tableScope == 1 ? size_t(kW32Warps) * kW32HeadTableElems * sizeof(uint16_t) : 0;
        const unsigned warpBlocks = unsigned((units * c.H + kW32Warps - 1) / kW32Warps);
        decodeKernelW32<<<dim3(warpBlocks, count), 32 * kW32Warps, tableShm + size_t(kW32Warps) * ringBytes, s.stream>>>(
            s.batch, inBand ? s.store : d->shared, s.errs, d->out, ringBytes);
    } else if (cachegen) {
        const size_t shm = c.deltaGroup >= 2 ? size_t(threads) * c.D : 0;
        decodeKernel<<<dim3(blocks, count), threads, shm, s.stream>>>(s.batch, inBand ? s.store : d->shared, s.errs, d->out);
    } else {
        baselineKernel<<<dim3(blocks, count), threads, 0, s.stream>>>(s.batch, d->out);
    }
    KVS_CUDA_TRY(cudaGetLastError(), "decode kernel");
    return finishLaunch(d, s, chunks, first, last);
}

// The transform codec's batch: [TfChunkDesc x count][TfBlockPlan x 2L per chunk][payloads]; the
// symbol kernel, then the GEMM and raw-token kernels, on the slot's stream.
int launchTransformBatch(kvscope_cuda_decoder* d, Slot& s, const kvscope_cuda_chunk* chunks,
                         const std::vector<TfChunkPlan>& plans, int first, int last)
{
    const Codec& c = d->codec;
    const int count = last - first, B = 2 * c.L, C = c.C();
    const size_t planBytes = align16(size_t(B) * sizeof(TfBlockPlan));
    std::vector<TfChunkDesc> descs(static_cast<size_t>(count));
    std::vector<bool> pinned(static_cast<size_t>(count));
    size_t headBytes = 0;
    if (int r = layOutBatch(s, chunks + first, plans.data() + first, planBytes, descs, pinned, &headBytes)) return r;
    uint64_t zq = 0;
    int maxR = 0, maxRaw = 0;
    for (int i = 0; i < count; ++i) {
        const kvscope_cuda_chunk& ch = chunks[first + i];
        const TfChunkPlan& pl = plans[size_t(first + i)];
        TfChunkDesc& cd = descs[size_t(i)];
        cd.zq = zq;
        cd.comps = d->tfCompBase[size_t(ch.level - 1)];
        cd.tables = d->tfTableBase[size_t(ch.level - 1)];
        cd.tileK = d->tfTileBase[size_t(ch.level - 1)];
        zq += pl.zqElems;
        maxR = std::max(maxR, pl.geom.R);
        maxRaw = std::max(maxRaw, (pl.geom.n - pl.geom.R) * C);
    }
    if (int r = grow(&s.zq, &s.zqCap, size_t(zq), "dequantized components")) return r;
    if (int r = grow(&s.errs, &s.errsCap, size_t(count), "error records")) return r;
    const auto stagePlans = [&](int i) {  // block plans
        const TfChunkPlan& pl = plans[size_t(first + i)];
        std::memcpy(s.pinned + descs[size_t(i)].plan, pl.blocks.data(), pl.blocks.size() * sizeof(TfBlockPlan));
    };
    if (int r = stageBatch(d, s, chunks + first, plans.data() + first, descs, pinned, headBytes, stagePlans)) return r;
    if (d->codec.tf.entropy == 2)  // rans32: a warp per block
        tfSymbolsWarpKernel<<<dim3(unsigned(B), count), 32, 0, s.stream>>>(s.batch, d->tfComps, d->tfTables, s.zq, s.errs);
    else
        tfSymbolsKernel<<<dim3((B + kTfSymbolThreads - 1) / kTfSymbolThreads, count), kTfSymbolThreads, 0, s.stream>>>(
            s.batch, d->tfComps, d->tfTables, s.zq, s.errs);
    KVS_CUDA_TRY(cudaGetLastError(), "transform symbol kernel");
    KVS_CUDA_TRY(cudaEventRecord(s.ev[2], s.stream), "cudaEventRecord");
    const int units = c.H * ((c.D + 1) / 2);
    if (maxR > 0) {
        const dim3 grid(unsigned((units + kTfTileUnits - 1) / kTfTileUnits), unsigned((maxR + kTfTileRows - 1) / kTfTileRows),
                        unsigned(count * B));
        tfGemmKernel<<<grid, kTfThreads, 0, s.stream>>>(s.batch, B, d->tfAt, d->tfMean, d->tfComps, s.zq, d->tfTileK, d->tfRope, s.errs,
                                                        d->out);
    }
    if (maxRaw > 0)
        tfRawKernel<<<dim3(unsigned((maxRaw + 255) / 256), unsigned(count * B)), 256, 0, s.stream>>>(s.batch, B, s.errs, d->out);
    KVS_CUDA_TRY(cudaGetLastError(), "transform GEMM kernels");
    return finishLaunch(d, s, chunks, first, last);
}

template <typename T>
int upload(T** dst, const std::vector<T>& src, const char* what)
{
    if (cudaMalloc(reinterpret_cast<void**>(dst), std::max<size_t>(src.size(), 1) * sizeof(T)) != cudaSuccess) {
        cudaGetLastError();
        *dst = nullptr;
        return fail(KVSCOPE_CUDA_ERUNTIME, std::string("cudaMalloc for ") + what + " failed");
    }
    if (!src.empty() && cudaMemcpy(*dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
        return fail(KVSCOPE_CUDA_ERUNTIME, std::string("cudaMemcpy of ") + what + " failed");
    return KVSCOPE_CUDA_OK;
}

}  // namespace

extern "C" int kvscope_cuda_decoder_create(const kvscope_cuda_codec* codec, int device, uint64_t batchBytes,
                                           kvscope_cuda_decoder** out)
{
    if (!codec || !out) return fail(KVSCOPE_CUDA_EINVAL, "kvscope_cuda_decoder_create: null argument");
    *out = nullptr;
    std::string why;
    Codec c;
    if (!makeCodec(*codec, &c, &why)) return fail(KVSCOPE_CUDA_EINVAL, why);
    if (kvscope_cuda_device_count() == 0) return fail(KVSCOPE_CUDA_ENODEVICE, "no CUDA device (or no driver)");
    if (device < 0 || device >= kvscope_cuda_device_count())
        return fail(KVSCOPE_CUDA_ENODEVICE, "CUDA device " + std::to_string(device) + " does not exist");
    // Shared tables are parsed and checked on the host before any device memory is taken.
    std::vector<std::vector<uint16_t>> stores;
    if (c.codec == 0 && c.tableMode == 1)
        for (int l = 1; l <= c.levels; ++l) {
            stores.emplace_back();
            const auto& blob = c.sharedBlobs[size_t(l - 1)];
            if (!buildSharedStore(c, l, blob.data(), blob.size(), &stores.back(), &why)) return fail(KVSCOPE_CUDA_EDATA, why);
        }
    KVS_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    auto* d = new kvscope_cuda_decoder;
    d->codec = std::move(c);
    d->device = device;
    d->batchBytes = batchBytes ? batchBytes : (uint64_t(256) << 20);
    d->outBytes = d->codec.outputElems() * d->codec.dtypeBytes();
    auto bail = [d](int r) {
        kvscope_cuda_decoder_destroy(d);
        return r;
    };
    if (cudaMalloc(&d->out, d->outBytes) != cudaSuccess) {
        cudaGetLastError();
        d->out = nullptr;
        return bail(fail(KVSCOPE_CUDA_ERUNTIME, "cudaMalloc of " + std::to_string(d->outBytes) + " bytes for the decoded cache failed"));
    }
    if (cudaMemset(d->out, 0, d->outBytes) != cudaSuccess) return bail(fail(KVSCOPE_CUDA_ERUNTIME, "cudaMemset of the output"));
    if (!stores.empty()) {
        size_t total = 0;
        for (const auto& s : stores) d->sharedOffset.push_back(total), total += s.size();
        if (cudaMalloc(&d->shared, std::max<size_t>(total, 1) * 2) != cudaSuccess)
            return bail(fail(KVSCOPE_CUDA_ERUNTIME, "cudaMalloc for shared probability tables failed"));
        for (size_t l = 0; l < stores.size(); ++l)
            if (cudaMemcpy(d->shared + d->sharedOffset[l], stores[l].data(), stores[l].size() * 2, cudaMemcpyHostToDevice) != cudaSuccess)
                return bail(fail(KVSCOPE_CUDA_ERUNTIME, "cudaMemcpy of shared probability tables failed"));
    }
    if (d->codec.codec == 6) {  // the model, once per decoder
        const TfModel& m = d->codec.tf;
        std::vector<TfComp> comps;
        std::vector<uint16_t> tables;
        std::vector<uint32_t> tileK;
        for (const TfLevel& lv : m.levels) {
            d->tfCompBase.push_back(comps.size());
            d->tfTableBase.push_back(tables.size());
            d->tfTileBase.push_back(tileK.size());
            comps.insert(comps.end(), lv.comps.begin(), lv.comps.end());
            tables.insert(tables.end(), lv.tables.begin(), lv.tables.end());
            tileK.insert(tileK.end(), lv.tileK.begin(), lv.tileK.end());
        }
        if (int r = upload(&d->tfAt, m.At, "the decode matrices")) return bail(r);
        if (int r = upload(&d->tfMean, m.mean, "the transform means")) return bail(r);
        if (int r = upload(&d->tfComps, comps, "the transform components")) return bail(r);
        if (int r = upload(&d->tfTables, tables, "the transform tables")) return bail(r);
        if (int r = upload(&d->tfRope, d->codec.rope, "the RoPE table")) return bail(r);
        if (int r = upload(&d->tfTileK, tileK, "the GEMM tile ranges")) return bail(r);
    }
    for (Slot& s : d->slots) {
        if (cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking) != cudaSuccess)
            return bail(fail(KVSCOPE_CUDA_ERUNTIME, "cudaStreamCreate failed"));
        for (cudaEvent_t& e : s.ev)
            if (cudaEventCreate(&e) != cudaSuccess) return bail(fail(KVSCOPE_CUDA_ERUNTIME, "cudaEventCreate failed"));
    }
    *out = d;
    return KVSCOPE_CUDA_OK;
}

extern "C" void kvscope_cuda_decoder_destroy(kvscope_cuda_decoder* d)
{
    if (!d) return;
    cudaSetDevice(d->device);
    for (Slot& s : d->slots) releaseSlot(s);
    if (d->out) cudaFree(d->out);
    if (d->shared) cudaFree(d->shared);
    for (void* p : {(void*)d->tfAt, (void*)d->tfMean, (void*)d->tfComps, (void*)d->tfTables, (void*)d->tfRope, (void*)d->tfTileK})
        if (p) cudaFree(p);
    delete d;
}

extern "C" int kvscope_cuda_decode(kvscope_cuda_decoder* d, const kvscope_cuda_chunk* chunks, int count)
{
    if (!d || (count > 0 && !chunks) || count < 0) return fail(KVSCOPE_CUDA_EINVAL, "kvscope_cuda_decode: bad arguments");
    const double t0 = nowMs();
    d->timing = kvscope_cuda_timing{};
    d->firstError.clear();
    d->firstErrorCode = KVSCOPE_CUDA_OK;
    KVS_CUDA_TRY(cudaSetDevice(d->device), "cudaSetDevice");
    // Every payload's layout is checked before anything is launched.
    const bool transform = d->codec.codec == 6;
    std::vector<ChunkPlan> plans(transform ? 0 : size_t(count));
    std::vector<TfChunkPlan> tfPlans(transform ? size_t(count) : 0);
    std::set<int> seen;
    for (int i = 0; i < count; ++i) {
        const kvscope_cuda_chunk& ch = chunks[i];
        std::string why;
        const bool ok = transform ? planTransform(d->codec, ch.chunk, ch.level, ch.data, ch.size, &tfPlans[size_t(i)], &why)
                                  : planChunk(d->codec, ch.chunk, ch.level, ch.data, ch.size, &plans[size_t(i)], &why);
        if (!ok)
            return fail(KVSCOPE_CUDA_EDATA, "chunk " + std::to_string(ch.chunk) + " (level " + std::to_string(ch.level) + "): " + why);
        if (!seen.insert(ch.chunk).second)
            return fail(KVSCOPE_CUDA_EINVAL, "chunk " + std::to_string(ch.chunk) + " listed twice in one call");
    }
    int batch = 0;
    for (int first = 0; first < count; ++batch) {
        int last = first + 1;
        uint64_t bytes = chunks[first].size;
        if (transform) {  // also bounded by the scratch (1 GiB of floats) and the grid's z extent
            const int maxChunks = std::max(1, 65535 / (2 * d->codec.L));
            uint64_t zq = tfPlans[size_t(first)].zqElems;
            while (last < count && last - first < maxChunks && bytes + chunks[last].size <= d->batchBytes &&
                   zq + tfPlans[size_t(last)].zqElems <= (uint64_t(1) << 28))
                bytes += chunks[last].size, zq += tfPlans[size_t(last++)].zqElems;
        } else {
            while (last < count && last - first < 1024 && bytes + chunks[last].size <= d->batchBytes) bytes += chunks[last++].size;
        }
        Slot& s = d->slots[batch % 2];
        if (int r = finishSlot(d, s)) return r;
        if (int r = transform ? launchTransformBatch(d, s, chunks, tfPlans, first, last) : launchBatch(d, s, chunks, plans, first, last)) {
            const std::string why = kvscope_cuda_last_error();
            for (Slot& o : d->slots) {  // nothing may still read the staging buffers
                cudaStreamSynchronize(o.stream);
                finishSlot(d, o);
            }
            return fail(r, why);
        }
        first = last;
    }
    for (Slot& s : d->slots)
        if (int r = finishSlot(d, s)) return r;
    d->timing.wall_ms = nowMs() - t0;
    if (d->firstErrorCode != KVSCOPE_CUDA_OK) return fail(d->firstErrorCode, d->firstError);
    return KVSCOPE_CUDA_OK;
}

extern "C" int kvscope_cuda_decoder_output(kvscope_cuda_decoder* d, void** ptr, uint64_t* bytes)
{
    if (!d) return fail(KVSCOPE_CUDA_EINVAL, "kvscope_cuda_decoder_output: null decoder");
    if (ptr) *ptr = d->out;
    if (bytes) *bytes = d->outBytes;
    return KVSCOPE_CUDA_OK;
}

extern "C" int kvscope_cuda_decoder_copy_output(kvscope_cuda_decoder* d, uint64_t offset, void* host, uint64_t bytes)
{
    if (!d || (!host && bytes) || offset > d->outBytes || bytes > d->outBytes - offset)
        return fail(KVSCOPE_CUDA_EINVAL, "kvscope_cuda_decoder_copy_output: range outside the output");
    KVS_CUDA_TRY(cudaSetDevice(d->device), "cudaSetDevice");
    KVS_CUDA_TRY(cudaMemcpy(host, static_cast<uint8_t*>(d->out) + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy of the output");
    return KVSCOPE_CUDA_OK;
}

extern "C" int kvscope_cuda_decoder_timing(const kvscope_cuda_decoder* d, kvscope_cuda_timing* t)
{
    if (!d || !t) return fail(KVSCOPE_CUDA_EINVAL, "kvscope_cuda_decoder_timing: null argument");
    *t = d->timing;
    return KVSCOPE_CUDA_OK;
}

extern "C" void* kvscope_cuda_host_alloc(uint64_t bytes)
{
    void* p = nullptr;
    if (cudaMallocHost(&p, std::max<uint64_t>(bytes, 1)) != cudaSuccess) {
        cudaGetLastError();
        kvscope_cuda_detail::setLastError("cudaMallocHost of " + std::to_string(bytes) + " bytes failed");
        return nullptr;
    }
    return p;
}

extern "C" void kvscope_cuda_host_free(void* p)
{
    if (p) cudaFreeHost(p);
}
