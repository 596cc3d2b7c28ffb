// Torch-free reader for GGUF checkpoints (the llama.cpp / ggml file format), versions 2 and 3.
//
// READ ME FIRST
//  - Shapes are in ggml order: dims[0] is the FASTEST-varying axis. A PyTorch weight of shape
//    (out, in) is stored as dims {in, out}; element (row r, column c) sits at index r * dims[0] + c
//    of readTensorF32()'s result.
//  - open() validates the whole header (magic, version, every count and length against the bytes
//    left, tensor bounds, alignment, overlaps) before anything is trusted; a GgufFile that exists
//    is internally consistent. Tensor bytes are only touched by readTensorF32().
//  - The file is memory-mapped read-only for the lifetime of the GgufFile; nothing is copied
//    until a tensor is dequantized.
//  - Little-endian files only (big-endian GGUF is detected and refused), v1 is refused.
//
// Every input error throws kvscope::Error "path: place: reason".
#pragma once

#include "modelio/ggml_quants.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

// Tensor types readTensorF32() dequantizes: GgmlType in ggml_quants.h (F32, F16, BF16, Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q2_K..Q6_K). Other known ggml types (Q8_K, IQ types, ...) still open, so their
// metadata and shapes can be inspected; reading them is refused by name.

// True when `path` opens and starts with the GGUF magic ("GGUF"); false otherwise (no error), so
// callers can dispatch between checkpoint and tokenizer formats.
bool isGgufFile(const std::string& path);

// "Q4_K", "F16", ... or "unknown" for a type number ggml does not define.
const char* ggmlTypeName(uint32_t type);

struct GgufTensorInfo {
    std::string name;
    std::vector<uint64_t> dims;  // ggml order: dims[0] fastest; 1..4 entries, each >= 1
    uint32_t type = 0;           // GgmlType or another ggml type number
    uint64_t offset = 0;         // bytes from the start of the data section, aligned
    uint64_t nbytes = 0;         // size of the stored (possibly quantized) data
    uint64_t elements() const;   // product of dims
};

class GgufFile {
public:
    // Maps `path`, parses and validates header, metadata and tensor infos.
    // @return the open file; throws kvscope::Error for any malformed or unsupported file.
    static GgufFile open(const std::string& path);

    GgufFile(GgufFile&&) noexcept;
    GgufFile& operator=(GgufFile&&) noexcept;
    ~GgufFile();

    const std::string& path() const;
    uint32_t version() const;
    uint64_t alignment() const;     // general.alignment, default 32
    uint64_t dataOffset() const;    // absolute file offset of the tensor data section
    const std::vector<GgufTensorInfo>& tensors() const;  // in file order
    // @return the tensor named `name`, or nullptr.
    const GgufTensorInfo* find(const std::string& name) const;

    // Metadata. Accessors throw kvscope::Error "path: metadata 'key': reason" when the key is
    // missing or holds another type.
    std::vector<std::string> keys() const;  // in file order
    bool has(const std::string& key) const;
    // "uint32", "string", "array[string]", "array[array]", ...; throws if the key is missing.
    std::string typeName(const std::string& key) const;
    std::string getString(const std::string& key) const;
    // Any integer type (uint8..int64); throws for a uint64 above INT64_MAX.
    int64_t getInt(const std::string& key) const;
    // float32 / float64, or any integer type (converted).
    double getFloat(const std::string& key) const;
    bool getBool(const std::string& key) const;
    std::vector<std::string> getStringArray(const std::string& key) const;
    std::vector<int64_t> getIntArray(const std::string& key) const;  // array of any integer type
    std::vector<float> getFloatArray(const std::string& key) const;  // array of float32/float64
    // Element count of an array value (any element type, nested included).
    uint64_t arrayLength(const std::string& key) const;

    // Dequantizes `t` (any type canDequantize() accepts) to float in ggml element order.
    // @return t.elements() floats; throws naming the file, the tensor and the type for other types.
    std::vector<float> readTensorF32(const GgufTensorInfo& t) const;
    // The stored bytes of `t` (t.nbytes of them, inside the mapping; valid while this file lives).
    // Throws like readTensorF32 when `t` does not describe data in this file.
    const uint8_t* tensorBytes(const GgufTensorInfo& t) const;
    // Drops the mapped pages wholly inside `t`'s bytes from this process's resident memory (a
    // loader that copied them out calls it, so the file does not count twice); the bytes stay
    // readable (read again from the file).
    void releaseTensorPages(const GgufTensorInfo& t) const;

private:
    struct Impl;
    explicit GgufFile(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> d_;
};

}  // namespace kvscope
