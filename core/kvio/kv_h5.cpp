// Reading KV files (kv_h5.h) through the HDF5 C API (kv_h5_api.h): the metadata walk bounds the
// file first (kv_h5_bounds.h), then every dataset is checked against the root attributes before
// anything is allocated. Every HDF5 failure becomes kvscope::Error("file: place: reason") with the
// innermost message of HDF5's error stack; every handle lives in an RAII wrapper so an exception
// never leaks one (a leaked file handle would also keep the file open).
#include "kvio/kv_h5.h"
#include "kvio/kv_h5_api.h"
#include "kvio/kv_h5_bounds.h"

#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include <sys/stat.h>

namespace kvscope {

namespace {

using namespace h5;

// Reads an optional float32 dataset that must hold exactly `count` finite values; returns an empty
// vector when it is absent.
std::vector<float> readOptionalF32(const Failer& f, hid_t loc, const char* name, size_t count,
                                   const std::string& place)
{
    std::vector<float> v;
    if (!linkExists(f, loc, name, place)) return v;
    Hid ds = f.check(H5Dopen2(loc, name, H5P_DEFAULT), H5Dclose, place, "cannot open as a dataset");
    Hid type = f.check(H5Dget_type(ds.get()), H5Tclose, place, "cannot read type");
    if (H5Tget_class(type.get()) != H5T_FLOAT) f.fail(place, "element type is not floating point");
    Hid space = f.check(H5Dget_space(ds.get()), H5Sclose, place, "cannot read dataspace");
    const hssize_t n = H5Sget_simple_extent_npoints(space.get());
    if (n < 0 || size_t(n) != count)
        f.fail(place, "holds " + std::to_string(n) + " values, expected " + std::to_string(count));
    v.resize(count);
    f.check(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), place,
            "cannot read");
    for (float x : v)
        if (!std::isfinite(x)) f.fail(place, "holds a value that is not finite");
    return v;
}

// ---- reading --------------------------------------------------------------------------------

Hid openForRead(const Failer& f)
{
    const std::string& path = f.file();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) f.fail("", std::string("cannot open: ") + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) f.fail("", "is a directory, not a KV file");
    if (st.st_size == 0) f.fail("", "empty file, not an HDF5 KV file");
    checkH5Bounds(path, uint64_t(st.st_size));
    const htri_t isH5 = H5Fis_hdf5(path.c_str());
    if (isH5 == 0) f.fail("", "not an HDF5 file (no HDF5 signature)");
    if (isH5 < 0) f.failH5("", "cannot open as HDF5");
    const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0) f.failH5("", "cannot open as HDF5 (truncated or corrupt)");
    return Hid(id, H5Fclose);
}

KvFileInfo readInfo(const Failer& f, hid_t root)
{
    if (!hasAttr(f, root, "format", "attribute format"))
        f.fail("", "not a kvscope KV file (no 'format' attribute on the root group)");
    const std::string format = readStringAttr(f, root, "format");
    if (format != kFormatName)
        f.fail("attribute format", "is " + quoted(format) + ", expected \"" + kFormatName + "\"");

    KvFileInfo info;
    const int64_t version = readIntAttr(f, root, "version");
    if (version < 1) f.fail("attribute version", std::to_string(version) + " is not a valid version");
    if (version > kKvFileVersion)
        f.fail("attribute version", "file version " + std::to_string(version) +
                                        " is newer than this build reads (" +
                                        std::to_string(kKvFileVersion) + ")");
    info.version = int(version);

    info.shape.numLayers = readDimAttr(f, root, "num_layers");
    info.shape.numKvHeads = readDimAttr(f, root, "num_kv_heads");
    info.shape.headDim = readDimAttr(f, root, "head_dim");
    info.shape.numTokens = readDimAttr(f, root, "num_tokens");
    validateShape(info.shape, f.file() + ": root attributes");

    if (!hasAttr(f, root, "dtype", "attribute dtype")) f.fail("attribute dtype", "missing");
    const std::string dt = readStringAttr(f, root, "dtype");
    if (!parseDType(dt, &info.dtype) || dt != dtypeName(info.dtype))
        f.fail("attribute dtype", quoted(dt) + " is not one of float16, bfloat16, float32");

    if (hasAttr(f, root, "model_name", "attribute model_name"))
        info.modelName = readStringAttr(f, root, "model_name");
    if (hasAttr(f, root, "model_fingerprint", "attribute model_fingerprint"))
        info.modelFingerprint = readStringAttr(f, root, "model_fingerprint");
    return info;
}

// Refuses datasets whose filters this HDF5 cannot run, before reading fails halfway.
// Returns the largest expansion (logical / stored bytes) the filters can produce, 0 if unknown.
double checkFilters(const Failer& f, hid_t ds, const std::string& place)
{
    double maxExpansion = 1.0;
    Hid dcpl = f.check(H5Dget_create_plist(ds), H5Pclose, place, "cannot read properties");
    const int n = H5Pget_nfilters(dcpl.get());
    if (n < 0) f.failH5(place, "cannot read filters");
    for (int i = 0; i < n; ++i) {
        unsigned flags = 0, config = 0;
        size_t nvals = 0;
        char name[64] = {0};
        const H5Z_filter_t id =
            H5Pget_filter2(dcpl.get(), unsigned(i), &flags, &nvals, nullptr, sizeof name, name, &config);
        if (id < 0) f.failH5(place, "cannot read filters");
        if (H5Zfilter_avail(id) <= 0)
            f.fail(place, "compressed with HDF5 filter " + std::to_string(id) + " (" +
                              quoted(name) +
                              "), which this build cannot decode; rewrite it with gzip or none");
        if (id == H5Z_FILTER_DEFLATE)
            maxExpansion = 1032.0;  // deflate's limit: 258-byte matches in 2-bit codes
        else if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_FLETCHER32)
            maxExpansion = 0.0;  // szip, nbit, scaleoffset: no simple bound
    }
    return maxExpansion;
}

// A dataset that declares far more values than its stored bytes can hold (never written, or a
// hand-made sparse file) would make us allocate the declared size for nothing: refuse it.
void checkStorage(const Failer& f, hid_t ds, hid_t type, const KvShape& sh, double maxExpansion,
                  const std::string& place)
{
    const double logical = double(sh.layerValues()) * double(H5Tget_size(type));
    const double stored = double(H5Dget_storage_size(ds));
    if (stored == 0) f.fail(place, "no data stored (the dataset was never written)");
    if (maxExpansion > 0 && stored * maxExpansion < logical)
        f.fail(place, "only " + std::to_string(uint64_t(stored)) + " bytes stored for " +
                          std::to_string(uint64_t(logical)) +
                          " bytes of values; the dataset is incomplete");
}

struct OpenTensor {
    Hid ds;
    Hid memHalf;  // owns the in-memory half type when the tensor is fp16
    hid_t memType = -1;
};

OpenTensor openTensor(const Failer& f, hid_t root, const KvFileInfo& info, int layer, KvKind kind)
{
    const std::string group = layerGroupName(layer, info.shape.numLayers);
    const std::string place = tensorPlace(group, kind);
    if (!linkExists(f, root, "layers", "/layers")) f.fail("/layers", "missing");
    if (!linkExists(f, root, "layers/" + group, "/layers/" + group))
        f.fail("/layers/" + group, "missing (num_layers is " + std::to_string(info.shape.numLayers) +
                                       ")");
    const std::string rel = "layers/" + group + "/" + kindName(kind);
    if (!linkExists(f, root, rel, place)) f.fail(place, "missing");

    OpenTensor t;
    t.ds = f.check(H5Dopen2(root, rel.c_str(), H5P_DEFAULT), H5Dclose, place,
                   "cannot open as a dataset");
    Hid space = f.check(H5Dget_space(t.ds.get()), H5Sclose, place, "cannot read dataspace");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0) f.failH5(place, "cannot read dataspace");
    if (rank != 3) f.fail(place, "rank " + std::to_string(rank) + ", expected 3 (kv_heads, tokens, head_dim)");
    hsize_t dims[3] = {0, 0, 0};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    const KvShape& sh = info.shape;
    if (dims[0] != hsize_t(sh.numKvHeads) || dims[1] != hsize_t(sh.numTokens) ||
        dims[2] != hsize_t(sh.headDim))
        f.fail(place, "shape (" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + ", " +
                          std::to_string(dims[2]) + ") does not match the attributes (" +
                          std::to_string(sh.numKvHeads) + ", " + std::to_string(sh.numTokens) +
                          ", " + std::to_string(sh.headDim) + ")");

    Hid type = f.check(H5Dget_type(t.ds.get()), H5Tclose, place, "cannot read type");
    const hid_t ty = type.get();
    DType found;
    bool known = true;
    if (isHalfType(ty)) {
        found = DType::F16;
    } else if (isFloat32Type(ty)) {
        found = DType::F32;
    } else if (H5Tget_class(ty) == H5T_INTEGER && H5Tget_size(ty) == 2 &&
               H5Tget_sign(ty) == H5T_SGN_NONE) {
        // bfloat16 travels as uint16; only the attribute says the bits are not integers
        const std::string attrPlace = place + ": attribute dtype";
        if (!hasAttr(f, t.ds.get(), "dtype", attrPlace))
            f.fail(place, "uint16 dataset without the attribute dtype=\"bfloat16\"");
        const std::string tag = readStringAttr(f, t.ds.get(), "dtype");
        if (tag != "bfloat16")
            f.fail(attrPlace, quoted(tag) + " on a uint16 dataset, expected \"bfloat16\"");
        found = DType::BF16;
    } else {
        known = false;
        found = DType::F32;
    }
    if (!known)
        f.fail(place, "element type " + describeType(ty) +
                          " is not float16, bfloat16 (uint16) or float32");
    if (found != info.dtype)
        f.fail(place, std::string("element type ") + dtypeName(found) +
                          " does not match the file's dtype " + dtypeName(info.dtype));
    checkStorage(f, t.ds.get(), ty, info.shape, checkFilters(f, t.ds.get(), place), place);

    if (found == DType::F16) {
        t.memHalf = makeHalfType(f, true);
        t.memType = t.memHalf.get();
    } else {
        t.memType = found == DType::BF16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;
    }
    return t;
}

struct OpenTokens {
    Hid ds;
    size_t count = 0;
};

OpenTokens openTokens(const Failer& f, hid_t root, const KvFileInfo& info)
{
    if (!linkExists(f, root, "tokens", "/tokens")) f.fail("/tokens", "missing");
    Hid ds = f.check(H5Dopen2(root, "tokens", H5P_DEFAULT), H5Dclose, "/tokens",
                     "cannot open as a dataset");
    Hid type = f.check(H5Dget_type(ds.get()), H5Tclose, "/tokens", "cannot read type");
    if (H5Tget_class(type.get()) != H5T_INTEGER)
        f.fail("/tokens", "element type " + describeType(type.get()) + ", expected int32");
    Hid space = f.check(H5Dget_space(ds.get()), H5Sclose, "/tokens", "cannot read dataspace");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank != 1) f.fail("/tokens", "rank " + std::to_string(rank) + ", expected 1");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    // Empty means "token ids unknown" (synthetic caches); otherwise one id per cached token.
    if (n != 0 && n != hsize_t(info.shape.numTokens))
        f.fail("/tokens", "length " + std::to_string(n) + " does not match num_tokens " +
                              std::to_string(info.shape.numTokens));
    return {std::move(ds), size_t(n)};
}

}  // namespace

KvFileInfo readKvH5Info(const std::string& path)
{
    H5Session session;
    const Failer f(path);
    Hid file = openForRead(f);
    return readInfo(f, file.get());
}

KvSet readKvH5(const std::string& path)
{
    H5Session session;
    const Failer f(path);
    Hid file = openForRead(f);
    const hid_t root = file.get();
    const KvFileInfo info = readInfo(f, root);

    // Check every dataset against the attributes before allocating anything.
    OpenTokens tokens = openTokens(f, root, info);
    std::string context;
    if (linkExists(f, root, "context", "/context")) {
        Hid ds = f.check(H5Dopen2(root, "context", H5P_DEFAULT), H5Dclose, "/context",
                         "cannot open as a dataset");
        context = readString(f, ds.get(), false, "/context");
    }
    std::vector<OpenTensor> tensors;
    tensors.reserve(2 * size_t(info.shape.numLayers));
    for (int l = 0; l < info.shape.numLayers; ++l) {
        tensors.push_back(openTensor(f, root, info, l, KvKind::Key));
        tensors.push_back(openTensor(f, root, info, l, KvKind::Value));
    }

    KvSet kv;
    try {
        kv = KvSet(info.shape, info.dtype);
        kv.tokens.resize(tokens.count);
    } catch (const std::bad_alloc&) {
        f.fail("", "cannot allocate memory for " + std::to_string(info.shape.totalValues()) +
                       " values");
    }
    if (!kv.tokens.empty())
        f.check(H5Dread(tokens.ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        kv.tokens.data()),
                "/tokens", "cannot read");
    for (int l = 0; l < info.shape.numLayers; ++l) {
        const std::string group = layerGroupName(l, info.shape.numLayers);
        for (KvKind kind : {KvKind::Key, KvKind::Value}) {
            const OpenTensor& t = tensors[2 * size_t(l) + size_t(kind)];
            f.check(H5Dread(t.ds.get(), t.memType, H5S_ALL, H5S_ALL, H5P_DEFAULT, kv.data(kind, l)),
                    tensorPlace(group, kind), "cannot read");
        }
    }
    kv.modelName = info.modelName;
    kv.modelFingerprint = info.modelFingerprint;
    kv.context = std::move(context);

    // Optional codec side data: RoPE parameters and attention statistics.
    const size_t H = size_t(info.shape.numKvHeads), D = size_t(info.shape.headDim);
    kv.ropeInvFreq = readOptionalF32(f, root, "rope_inv_freq", D / 2, "/rope_inv_freq");
    if (kv.hasRope()) {
        const int64_t p0 = hasAttr(f, root, "rope_position0", "attribute rope_position0")
                               ? readIntAttr(f, root, "rope_position0")
                               : 0;
        if (p0 < 0 || p0 > int64_t(1) << 30) f.fail("attribute rope_position0", std::to_string(p0) + " is out of range");
        kv.ropePosition0 = int(p0);
    }
    bool anyQ = false, anyV = false, anyA = false;
    std::vector<std::vector<float>> q(size_t(info.shape.numLayers)), w(size_t(info.shape.numLayers)),
        a(size_t(info.shape.numLayers));
    for (int l = 0; l < info.shape.numLayers; ++l) {
        const std::string group = layerGroupName(l, info.shape.numLayers);
        Hid g = f.check(H5Gopen2(root, ("layers/" + group).c_str(), H5P_DEFAULT), H5Gclose, "/layers/" + group,
                        "cannot open group");
        q[size_t(l)] = readOptionalF32(f, g.get(), "query_sq", H * D, "/layers/" + group + "/query_sq");
        w[size_t(l)] = readOptionalF32(f, g.get(), "value_weight", H * D * D, "/layers/" + group + "/value_weight");
        a[size_t(l)] = readOptionalF32(f, g.get(), "attn_mass", H * size_t(info.shape.numTokens),
                                       "/layers/" + group + "/attn_mass");
        anyA = anyA || !a[size_t(l)].empty();
        anyQ = anyQ || !q[size_t(l)].empty();
        anyV = anyV || !w[size_t(l)].empty();
    }
    for (int l = 0; l < info.shape.numLayers; ++l) {
        const std::string group = layerGroupName(l, info.shape.numLayers);
        if (anyQ && q[size_t(l)].empty()) f.fail("/layers/" + group + "/query_sq", "missing while other layers have it");
        if (anyA && a[size_t(l)].empty()) f.fail("/layers/" + group + "/attn_mass", "missing while other layers have it");
        if (anyV && w[size_t(l)].empty()) f.fail("/layers/" + group + "/value_weight", "missing while other layers have it");
    }
    if (anyQ) kv.querySq = std::move(q);
    if (anyV) kv.valueWeight = std::move(w);
    if (anyA) kv.attnMass = std::move(a);
    return kv;
}

std::string hdf5LibraryVersion()
{
    unsigned major = 0, minor = 0, release = 0;
    if (H5get_libversion(&major, &minor, &release) < 0) return std::string();
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

}  // namespace kvscope
