// KV files: a KvSet (kv/kv_set.h) in HDF5 that plain h5py reads:
//   /            attrs format="kvscope-kv", version, model_name, model_fingerprint, num_layers,
//                      num_kv_heads, head_dim, num_tokens, dtype ("float16"|"bfloat16"|"float32")
//   /tokens      int32 (num_tokens)
//   /context     variable-length UTF-8 string (scalar)
//   /layers/NN/key, /layers/NN/value   (kv_heads, tokens, head_dim), chunked along tokens;
//                fp16 as h5py's half type (reads as <f2), bf16 as uint16 with attr dtype="bfloat16"
//   /rope_inv_freq  float32 (head_dim/2), optional, with root attr rope_position0: the RoPE the keys carry
//   /layers/NN/query_sq      float32 (kv_heads, head_dim), optional (KvSet::querySq)
//   /layers/NN/attn_mass     float32 (kv_heads, tokens), optional (KvSet::attnMass)
//   /layers/NN/value_weight  float32 (kv_heads, head_dim, head_dim), optional (KvSet::valueWeight)
// Layer groups are named with two digits ("00".."99"), three when num_layers > 100, four when
// num_layers > 1000. /tokens may be empty (token ids unknown, e.g. synthetic caches); otherwise its
// length is num_tokens. model_name, model_fingerprint and /context are optional for readers.
// Integer attributes are written as int64; readers accept any integer type.
#pragma once

#include "kv/kv_set.h"

#include <string>

namespace kvscope {

struct H5WriteOptions {
    int chunkTokens = 256;  // HDF5 chunk extent along tokens
    int gzipLevel = 0;      // 0 = no compression; 1-9 adds shuffle + gzip
};

// Writes to a temporary next to `path` (path + ".tmp-XXXXXXXX"), fsyncs it, then renames, so a
// failed write never replaces a good file and leaves no temporary behind.
// Throws kvscope::Error "path: [place: ]reason" for an invalid shape or options, kv.tokens that is
// neither empty nor num_tokens long, and any I/O or HDF5 failure.
void writeKvH5(const KvSet& kv, const std::string& path, const H5WriteOptions& opt = {});

// Validates format, version, attributes, shapes and dtypes before reading any tensor.
// Throws kvscope::Error "path: place: reason" for a missing, non-HDF5, truncated or corrupt file
// (metadata whose lengths or addresses run past the end of file is refused before libhdf5 reads
// it: kv_h5_bounds.h),
// files that are not ours (no format attribute), newer versions, inconsistent shapes or dtypes,
// unavailable HDF5 filters, or when the cache does not fit in memory.
KvSet readKvH5(const std::string& path);

// Only the root attributes (cheap): shape, dtype, model name.
struct KvFileInfo {
    KvShape shape;
    DType dtype = DType::F16;
    std::string modelName;
    std::string modelFingerprint;
    int version = 0;
};
// Throws like readKvH5 for everything the root attributes can show (no dataset is checked).
KvFileInfo readKvH5Info(const std::string& path);

constexpr int kKvFileVersion = 1;

// The version of the HDF5 library linked, "1.10.8" (H5get_libversion); "" when it cannot tell.
std::string hdf5LibraryVersion();

}  // namespace kvscope
