// Writing KV files (kv_h5.h): the root attributes, /tokens, /context, one group per layer with
// its key and value datasets and the optional codec statistics, into a temporary that replaces
// the target only once it is complete and on disk.
#include "kvio/kv_h5.h"
#include "kvio/kv_h5_api.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace kvscope {

namespace {

using namespace h5;

void writeTensor(const Failer& f, hid_t group, const std::string& groupName, const KvSet& kv,
                 KvKind kind, int layer, const H5WriteOptions& opt)
{
    const std::string place = tensorPlace(groupName, kind);
    const KvShape& sh = kv.shape();
    const hsize_t dims[3] = {hsize_t(sh.numKvHeads), hsize_t(sh.numTokens), hsize_t(sh.headDim)};
    // One head's run of tokens per chunk: a token range reads contiguous chunks, and the chunk
    // stays small (256 x 128 fp16 = 64 KiB) whatever the head count.
    const hsize_t chunk[3] = {1, hsize_t(std::min(opt.chunkTokens, sh.numTokens)),
                              hsize_t(sh.headDim)};
    Hid space = f.check(H5Screate_simple(3, dims, nullptr), H5Sclose, place,
                        "cannot create dataspace");
    Hid dcpl = f.check(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, place, "cannot create properties");
    f.check(H5Pset_chunk(dcpl.get(), 3, chunk), place, "cannot set chunking");
    if (opt.gzipLevel > 0) {
        f.check(H5Pset_shuffle(dcpl.get()), place, "cannot enable shuffle");
        f.check(H5Pset_deflate(dcpl.get(), unsigned(opt.gzipLevel)), place, "cannot enable gzip");
    }
    Hid fileHalf, memHalf;
    hid_t fileType = H5T_IEEE_F32LE, memType = H5T_NATIVE_FLOAT;
    if (kv.dtype() == DType::F16) {
        fileHalf = makeHalfType(f, false);
        memHalf = makeHalfType(f, true);
        fileType = fileHalf.get();
        memType = memHalf.get();
    } else if (kv.dtype() == DType::BF16) {
        fileType = H5T_STD_U16LE;
        memType = H5T_NATIVE_UINT16;
    }
    Hid ds = f.check(H5Dcreate2(group, kindName(kind), fileType, space.get(), H5P_DEFAULT,
                                dcpl.get(), H5P_DEFAULT),
                     H5Dclose, place, "cannot create dataset");
    f.check(H5Dwrite(ds.get(), memType, H5S_ALL, H5S_ALL, H5P_DEFAULT, kv.data(kind, layer)), place,
            "cannot write");
    if (kv.dtype() == DType::BF16) writeStringAttr(f, ds.get(), "dtype", "bfloat16", place + ": ");
}

// A small float32 dataset of the given dims (the optional codec statistics and RoPE table).
void writeF32Dataset(const Failer& f, hid_t loc, const char* name, const std::vector<float>& v,
                     const std::vector<hsize_t>& dims, const std::string& place)
{
    Hid space = f.check(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose, place,
                        "cannot create dataspace");
    Hid ds = f.check(H5Dcreate2(loc, name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                H5P_DEFAULT),
                     H5Dclose, place, "cannot create dataset");
    f.check(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), place,
            "cannot write");
}

void writeFile(const KvSet& kv, const std::string& tmpPath, const H5WriteOptions& opt,
               const Failer& f)
{
    const KvShape& sh = kv.shape();
    Hid file = f.check(H5Fcreate(tmpPath.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                       H5Fclose, "", "cannot create HDF5 file");
    {
        const hid_t root = file.get();
        writeStringAttr(f, root, "format", kFormatName, "");
        writeIntAttr(f, root, "version", kKvFileVersion);
        writeStringAttr(f, root, "model_name", kv.modelName, "");
        writeStringAttr(f, root, "model_fingerprint", kv.modelFingerprint, "");
        writeIntAttr(f, root, "num_layers", sh.numLayers);
        writeIntAttr(f, root, "num_kv_heads", sh.numKvHeads);
        writeIntAttr(f, root, "head_dim", sh.headDim);
        writeIntAttr(f, root, "num_tokens", sh.numTokens);
        writeStringAttr(f, root, "dtype", dtypeName(kv.dtype()), "");

        {
            const hsize_t n = kv.tokens.size();
            Hid space = f.check(H5Screate_simple(1, &n, nullptr), H5Sclose, "/tokens",
                                "cannot create dataspace");
            Hid ds = f.check(H5Dcreate2(root, "tokens", H5T_STD_I32LE, space.get(), H5P_DEFAULT,
                                        H5P_DEFAULT, H5P_DEFAULT),
                             H5Dclose, "/tokens", "cannot create dataset");
            if (n > 0)
                f.check(H5Dwrite(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                 kv.tokens.data()),
                        "/tokens", "cannot write");
        }
        {
            Hid type = makeStringType(f, H5T_CSET_UTF8);
            Hid space = f.check(H5Screate(H5S_SCALAR), H5Sclose, "/context",
                                "cannot create dataspace");
            Hid ds = f.check(H5Dcreate2(root, "context", type.get(), space.get(), H5P_DEFAULT,
                                        H5P_DEFAULT, H5P_DEFAULT),
                             H5Dclose, "/context", "cannot create dataset");
            const char* p = kv.context.c_str();
            f.check(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p), "/context",
                    "cannot write");
        }

        Hid layers = f.check(H5Gcreate2(root, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                             H5Gclose, "/layers", "cannot create group");
        for (int l = 0; l < sh.numLayers; ++l) {
            const std::string name = layerGroupName(l, sh.numLayers);
            Hid g = f.check(H5Gcreate2(layers.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT,
                                       H5P_DEFAULT),
                            H5Gclose, "/layers/" + name, "cannot create group");
            writeTensor(f, g.get(), name, kv, KvKind::Key, l, opt);
            writeTensor(f, g.get(), name, kv, KvKind::Value, l, opt);
            const hsize_t H = hsize_t(sh.numKvHeads), D = hsize_t(sh.headDim);
            if (size_t(l) < kv.querySq.size() && !kv.querySq[size_t(l)].empty())
                writeF32Dataset(f, g.get(), "query_sq", kv.querySq[size_t(l)], {H, D},
                                "/layers/" + name + "/query_sq");
            if (size_t(l) < kv.attnMass.size() && !kv.attnMass[size_t(l)].empty())
                writeF32Dataset(f, g.get(), "attn_mass", kv.attnMass[size_t(l)], {H, hsize_t(sh.numTokens)},
                                "/layers/" + name + "/attn_mass");
            if (size_t(l) < kv.valueWeight.size() && !kv.valueWeight[size_t(l)].empty())
                writeF32Dataset(f, g.get(), "value_weight", kv.valueWeight[size_t(l)], {H, D, D},
                                "/layers/" + name + "/value_weight");
        }
        if (kv.hasRope()) {
            writeF32Dataset(f, root, "rope_inv_freq", kv.ropeInvFreq, {hsize_t(kv.ropeInvFreq.size())},
                            "/rope_inv_freq");
            writeIntAttr(f, root, "rope_position0", kv.ropePosition0);
        }
    }
    // Buffered metadata and chunks reach the disk here; a full disk shows up as a failed close.
    if (file.close() < 0) f.failH5("", "cannot finish writing");
}

// Creates an empty, uniquely named file next to `path` (mode 0666 less the umask, like any file
// the user saves) and returns its name.
std::string createTemporary(const std::string& path)
{
    std::random_device rd;
    std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid()));
    for (int attempt = 0; attempt < 100; ++attempt) {
        char suffix[16];
        std::snprintf(suffix, sizeof suffix, ".tmp-%08x", unsigned(gen() & 0xffffffffu));
        const std::string tmp = path + suffix;
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            ::close(fd);
            return tmp;
        }
        if (errno != EEXIST)
            throw inputError(path, "", std::string("cannot create temporary file: ") +
                                           std::strerror(errno));
    }
    throw inputError(path, "", "cannot create temporary file: too many name collisions");
}

// fsync before rename, so a crash cannot leave the new name pointing at unwritten blocks.
void syncFile(const std::string& tmp, const std::string& path)
{
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
        const int e = errno;
        if (fd >= 0) ::close(fd);
        throw inputError(path, "", std::string("cannot flush to disk: ") + std::strerror(e));
    }
    ::close(fd);
}

}  // namespace

void writeKvH5(const KvSet& kv, const std::string& path, const H5WriteOptions& opt)
{
    validateShape(kv.shape(), path);
    if (opt.chunkTokens < 1)
        throw inputError(path, "", "chunkTokens " + std::to_string(opt.chunkTokens) + " must be >= 1");
    if (opt.gzipLevel < 0 || opt.gzipLevel > 9)
        throw inputError(path, "", "gzipLevel " + std::to_string(opt.gzipLevel) + " is outside 0-9");
    if (!kv.tokens.empty() && kv.tokens.size() != size_t(kv.shape().numTokens))
        throw inputError(path, "", "the cache has " + std::to_string(kv.tokens.size()) +
                                       " token ids for " + std::to_string(kv.shape().numTokens) +
                                       " tokens");

    H5Session session;
    if (opt.gzipLevel > 0 && (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0 ||
                              H5Zfilter_avail(H5Z_FILTER_SHUFFLE) <= 0))
        throw inputError(path, "", "this HDF5 build has no gzip/shuffle filter");
    const std::string tmp = createTemporary(path);
    try {
        writeFile(kv, tmp, opt, Failer(path));
        syncFile(tmp, path);
        if (std::rename(tmp.c_str(), path.c_str()) != 0)
            throw inputError(path, "", std::string("cannot replace: ") + std::strerror(errno));
    } catch (...) {
        std::remove(tmp.c_str());
        throw;
    }
}

}  // namespace kvscope
