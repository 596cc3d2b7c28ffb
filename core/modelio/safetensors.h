// Torch-free reader for .safetensors checkpoints (the Hugging Face tensor format).
//
// READ ME FIRST
//  - File layout: u64 little-endian header length N, then N bytes of JSON, then the data area.
//    The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets are
//    relative to the start of the data area) plus an optional "__metadata__" string->string map.
//  - Shapes are in PyTorch order: shape[0] is the SLOWEST axis (row-major), unlike GGUF.
//  - open() validates the whole header before anything is trusted: header length, JSON shape,
//    every field's type, dtype, byte count against shape x dtype size (overflow-checked), bounds
//    inside the data area, and no two tensors overlapping. Gaps in the data area are allowed.
//  - The file is memory-mapped read-only for the lifetime of the SafetensorsFile.
//  - PyTorch pickles (pytorch_model.bin, *.pt, *.pth) are never loaded: refusePickleCheckpoint().
//
// Every input error throws kvscope::Error "path: place: reason".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct SafetensorsTensor {
    std::string name;
    std::string dtype;           // "F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "U8", "BOOL"
    std::vector<int64_t> shape;  // row-major, may be empty (a scalar)
    uint64_t begin = 0, end = 0; // bytes from the start of the data area; end - begin = size
    uint64_t elements() const;   // product of shape (1 for a scalar)
};

// Bytes per element of a safetensors dtype name, or 0 when the name is not one we know.
size_t safetensorsDtypeSize(const std::string& dtype);

class SafetensorsFile {
public:
    // Maps `path`, parses and validates the header.
    // @return the open file; throws kvscope::Error for any malformed file.
    static SafetensorsFile open(const std::string& path);

    SafetensorsFile(SafetensorsFile&&) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
    ~SafetensorsFile();

    const std::string& path() const;
    uint64_t dataOffset() const;  // absolute file offset of the data area (8 + N)
    const std::vector<SafetensorsTensor>& tensors() const;  // sorted by begin offset
    // @return the tensor named `name`, or nullptr.
    const SafetensorsTensor* find(const std::string& name) const;
    const std::map<std::string, std::string>& metadata() const;  // "__metadata__", may be empty

    // Converts an F32 / F16 / BF16 tensor to float (row-major). Throws kvscope::Error
    // "path: tensor 'name': ..." for another dtype or a tensor that is not from this file.
    std::vector<float> readF32(const SafetensorsTensor& t) const;
    // Pointer to the tensor's bytes inside the mapping (little-endian, possibly unaligned);
    // valid while this SafetensorsFile lives. Throws for a tensor not from this file.
    const void* raw(const SafetensorsTensor& t) const;

private:
    struct Impl;
    explicit SafetensorsFile(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> d_;
};

// Shard files of the checkpoint in `folder`, as plain file names relative to it: the unique files
// named in model.safetensors.index.json's "weight_map" (sorted), or {"model.safetensors"} without
// an index. Shard names must be plain file names (no '/', '\\', ".."); every shard must exist as
// a regular file. A folder with neither but with a pickle checkpoint gets refusePickleCheckpoint()'s
// error; otherwise throws kvscope::Error.
std::vector<std::string> safetensorsShards(const std::string& folder);

// Always throws kvscope::Error "<path>: PyTorch pickle checkpoints are never loaded (they can run
// code); convert to safetensors, e.g. with transformers' save_pretrained(safe_serialization=True)".
[[noreturn]] void refusePickleCheckpoint(const std::string& path);

// @return the first pickle checkpoint in `folder` (pytorch_model.bin, pytorch_model-*.bin, *.pt,
// *.pth), or "" when there is none. Callers refuse it when the folder holds no safetensors.
std::string findPickleCheckpoint(const std::string& folder);

}  // namespace kvscope
