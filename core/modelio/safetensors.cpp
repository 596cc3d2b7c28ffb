// Safetensors reader: see safetensors.h. nlohmann-json is used here only; no third-party type
// reaches the header.
#include "modelio/safetensors.h"

#include "common/error.h"
#include "modelio/mapped_source.h"
#include "common/half.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <unordered_map>

#include <dirent.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the safetensors reader assumes a little-endian host");

namespace kvscope {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB of JSON is far beyond any real model
constexpr uint64_t kMaxIndexBytes = 64ull << 20;
constexpr int kMaxJsonDepth = 64;
const char* const kIndexName = "model.safetensors.index.json";
const char* const kSingleName = "model.safetensors";

json parseJson(const std::string& path, const std::string& place, const char* text, size_t n)
{
    if (jsonNestingDepth(text, n, kMaxJsonDepth) > kMaxJsonDepth)
        throw inputError(path, place, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    try {
        return json::parse(text, text + n);
    } catch (const json::exception& e) {
        throw inputError(path, place, std::string("invalid JSON: ") + e.what());
    }
}

bool endsWith(const std::string& s, const std::string& suffix)
{
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string joinPath(const std::string& folder, const std::string& name)
{
    if (folder.empty()) return name;
    return folder.back() == '/' ? folder + name : folder + "/" + name;
}

uint64_t jsonU64(const json& v, bool& ok)
{
    ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
    return ok ? v.get<uint64_t>() : 0;
}

}  // namespace

size_t safetensorsDtypeSize(const std::string& dtype)
{
    static const std::unordered_map<std::string, size_t> sizes = {
        {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
        {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2},  {"U8", 1},  {"BOOL", 1},
        {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
}

uint64_t SafetensorsTensor::elements() const
{
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);  // open() proved this does not overflow
    return n;
}

struct SafetensorsFile::Impl : MappedSource {
    uint64_t dataOffset = 0;
    std::vector<SafetensorsTensor> tensors;
    std::unordered_map<std::string, size_t> byName;
    std::map<std::string, std::string> metadata;


    void parse();
    // The tensor of this file that `t` describes; throws when `t` does not match one.
    const SafetensorsTensor& check(const SafetensorsTensor& t) const;
};

void SafetensorsFile::Impl::parse()
{
    if (size < 8) throw inputError(path, "header", "truncated: " + std::to_string(size) + " bytes, need 8 for the header length");
    uint64_t n;
    std::memcpy(&n, map, 8);
    if (n > kMaxHeaderBytes)
        throw inputError(path, "header", "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
    if (n > size - 8)
        throw inputError(path, "header", "truncated: header length " + std::to_string(n) + " but only " + std::to_string(size - 8) + " bytes follow");
    if (n < 2) throw inputError(path, "header", "header length " + std::to_string(n) + " is too small for a JSON object");
    dataOffset = 8 + n;
    const uint64_t dataSize = size - dataOffset;

    const json root = parseJson(path, "header", reinterpret_cast<const char*>(map + 8), size_t(n));
    if (!root.is_object()) throw inputError(path, "header", "JSON is not an object");

    for (auto it = root.begin(); it != root.end(); ++it) {
        const std::string& name = it.key();
        const json& v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) throw inputError(path, "__metadata__", "not an object");
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string())
                    throw inputError(path, "__metadata__ '" + m.key() + "'", "value is not a string");
                metadata[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        const std::string place = "tensor '" + name + "'";
        if (!v.is_object()) throw inputError(path, place, "entry is not an object");
        for (auto f = v.begin(); f != v.end(); ++f)
            if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
                throw inputError(path, place, "unexpected field '" + f.key() + "'");
        if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
            throw inputError(path, place, "needs the fields dtype, shape and data_offsets");

        SafetensorsTensor t;
        t.name = name;
        const json& dt = v["dtype"];
        if (!dt.is_string()) throw inputError(path, place, "dtype is not a string");
        t.dtype = dt.get<std::string>();
        const size_t esize = safetensorsDtypeSize(t.dtype);
        if (esize == 0) throw inputError(path, place, "unknown dtype '" + t.dtype + "'");

        const json& sh = v["shape"];
        if (!sh.is_array()) throw inputError(path, place, "shape is not an array");
        uint64_t elements = 1;
        bool overflow = false;
        for (const json& d : sh) {
            bool ok;
            const uint64_t dim = jsonU64(d, ok);
            if (!ok || dim > uint64_t(std::numeric_limits<int64_t>::max()))
                throw inputError(path, place, "shape holds something other than a non-negative integer");
            t.shape.push_back(int64_t(dim));
            if (dim != 0 && elements > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
            else elements *= dim;
        }
        // A zero dimension makes the product 0 whatever overflowed before it.
        if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) { elements = 0; overflow = false; }
        if (overflow || elements > std::numeric_limits<uint64_t>::max() / esize)
            throw inputError(path, place, "shape's element count overflows");
        const uint64_t bytes = elements * esize;

        const json& off = v["data_offsets"];
        if (!off.is_array() || off.size() != 2)
            throw inputError(path, place, "data_offsets is not an array of two integers");
        bool ok0, ok1;
        t.begin = jsonU64(off[0], ok0);
        t.end = jsonU64(off[1], ok1);
        if (!ok0 || !ok1) throw inputError(path, place, "data_offsets is not an array of two non-negative integers");
        if (t.begin > t.end)
            throw inputError(path, place, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
        if (t.end > dataSize)
            throw inputError(path, place, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] run past the data area (" + std::to_string(dataSize) + " bytes)");
        if (t.end - t.begin != bytes)
            throw inputError(path, place, std::to_string(t.end - t.begin) + " bytes stored but shape and dtype " + t.dtype + " need " + std::to_string(bytes));
        tensors.push_back(std::move(t));
    }

    std::sort(tensors.begin(), tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    // Empty tensors occupy no bytes and overlap nothing; compare each other one with the
    // furthest end so far.
    uint64_t furthest = 0;
    std::string furthestName;
    for (const SafetensorsTensor& t : tensors) {
        if (t.begin == t.end) continue;
        if (t.begin < furthest)
            throw inputError(path, "tensor '" + t.name + "'", "data overlaps tensor '" + furthestName + "'");
        furthest = t.end;
        furthestName = t.name;
    }
    for (size_t i = 0; i < tensors.size(); ++i) byName[tensors[i].name] = i;
}

const SafetensorsTensor& SafetensorsFile::Impl::check(const SafetensorsTensor& t) const
{
    auto it = byName.find(t.name);
    if (it == byName.end())
        throw inputError(path, "tensor '" + t.name + "'", "no such tensor in this file");
    const SafetensorsTensor& mine = tensors[it->second];
    if (mine.begin != t.begin || mine.end != t.end || mine.dtype != t.dtype || mine.shape != t.shape)
        throw inputError(path, "tensor '" + t.name + "'", "tensor info does not describe data in this file");
    return mine;
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : d_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::string& path)
{
    auto impl = std::make_unique<Impl>();
    impl->mapFile(path);
    impl->parse();
    return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const { return d_->path; }
uint64_t SafetensorsFile::dataOffset() const { return d_->dataOffset; }
const std::vector<SafetensorsTensor>& SafetensorsFile::tensors() const { return d_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return d_->metadata; }

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const
{
    auto it = d_->byName.find(name);
    return it == d_->byName.end() ? nullptr : &d_->tensors[it->second];
}

const void* SafetensorsFile::raw(const SafetensorsTensor& t) const
{
    const SafetensorsTensor& mine = d_->check(t);
    return d_->map + d_->dataOffset + mine.begin;
}

std::vector<float> SafetensorsFile::readF32(const SafetensorsTensor& t) const
{
    const SafetensorsTensor& mine = d_->check(t);
    const uint8_t* src = d_->map + d_->dataOffset + mine.begin;
    const size_t n = size_t(mine.elements());
    std::vector<float> out(n);
    if (mine.dtype == "F32") {
        if (n) std::memcpy(out.data(), src, n * 4);
    } else if (mine.dtype == "F16" || mine.dtype == "BF16") {
        // The mapping may leave the tensor unaligned for uint16_t: copy in chunks first.
        constexpr size_t kChunk = 1 << 16;
        std::vector<uint16_t> tmp(std::min(n, kChunk));
        const bool isHalf = mine.dtype == "F16";
        for (size_t i = 0; i < n; i += kChunk) {
            const size_t m = std::min(kChunk, n - i);
            std::memcpy(tmp.data(), src + i * 2, m * 2);
            if (isHalf) {
                halfToFloatN(tmp.data(), out.data() + i, m);
            } else {
                for (size_t j = 0; j < m; ++j) out[i + j] = bf16ToFloat(tmp[j]);
            }
        }
    } else {
        throw inputError(d_->path, "tensor '" + mine.name + "'",
                         "dtype " + mine.dtype + " cannot be read as float (only F32, F16, BF16)");
    }
    return out;
}

void refusePickleCheckpoint(const std::string& path)
{
    throw Error(path + ": PyTorch pickle checkpoints are never loaded (they can run code); convert to "
                "safetensors, e.g. with transformers' save_pretrained(safe_serialization=True)");
}

std::string findPickleCheckpoint(const std::string& folder)
{
    DIR* dir = ::opendir(folder.c_str());
    if (!dir) return "";
    std::vector<std::string> found;
    while (const dirent* e = ::readdir(dir)) {
        const std::string name = e->d_name;
        const bool isBin = name == "pytorch_model.bin" ||
                           (name.rfind("pytorch_model-", 0) == 0 && endsWith(name, ".bin"));
        if (isBin || endsWith(name, ".pt") || endsWith(name, ".pth")) found.push_back(name);
    }
    ::closedir(dir);
    if (found.empty()) return "";
    std::sort(found.begin(), found.end());
    return joinPath(folder, found.front());
}

std::vector<std::string> safetensorsShards(const std::string& folder)
{
    const std::string indexPath = joinPath(folder, kIndexName);
    if (!isRegularFile(indexPath)) {
        if (isRegularFile(joinPath(folder, kSingleName))) return {kSingleName};
        const std::string pickle = findPickleCheckpoint(folder);
        if (!pickle.empty()) refusePickleCheckpoint(pickle);
        throw inputError(folder, "", std::string("no ") + kSingleName + " or " + kIndexName + " in this folder");
    }
    const std::string text = readSmallFile(indexPath, kMaxIndexBytes);
    const json root = parseJson(indexPath, "index", text.data(), text.size());
    if (!root.is_object()) throw inputError(indexPath, "index", "JSON is not an object");
    auto wm = root.find("weight_map");
    if (wm == root.end()) throw inputError(indexPath, "weight_map", "missing");
    if (!wm->is_object()) throw inputError(indexPath, "weight_map", "not an object");
    if (wm->empty()) throw inputError(indexPath, "weight_map", "empty");
    std::set<std::string> files;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
        const std::string place = "weight_map '" + it.key() + "'";
        if (!it.value().is_string()) throw inputError(indexPath, place, "shard name is not a string");
        const std::string file = it.value().get<std::string>();
        if (file.empty() || file.find('/') != std::string::npos || file.find('\\') != std::string::npos ||
            file.find("..") != std::string::npos || file.find('\0') != std::string::npos)
            throw inputError(indexPath, place, "shard '" + file + "' is not a plain file name inside the folder");
        files.insert(file);
    }
    for (const std::string& f : files)
        if (!isRegularFile(joinPath(folder, f)))
            throw inputError(indexPath, "weight_map", "shard '" + f + "' is missing from " + folder);
    return std::vector<std::string>(files.begin(), files.end());
}

}  // namespace kvscope
