// KV files through the HDF5 C API. Every HDF5 failure becomes kvscope::Error("file: place: reason")
// with the innermost message of HDF5's error stack; every handle lives in an RAII wrapper so an
// exception never leaks one (a leaked file handle would also keep the file open).
#include "kvio/kv_h5.h"
#include "kvio/kv_h5_bounds.h"

#include "common/error.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvscope {

namespace {

const char kFormatName[] = "kvscope-kv";

// HDF5 builds without --enable-threadsafe must not be entered from two threads; Debian's build is
// threadsafe, but a GUI worker and a CLI pipeline should not depend on how HDF5 was configured.
std::mutex& h5Mutex()
{
    static std::mutex m;
    return m;
}

// Held for the duration of one public call: serialises HDF5 and silences its automatic error
// printing (we report through exceptions), restoring the caller's handler afterwards.
//
// HDF5 1.10 cannot close a file whose final flush failed (disk full, EFBIG): H5Fclose fails,
// the id stays registered, and any later close of it, including the one HDF5's atexit handler
// makes, segfaults. So the library is told not to clean up at exit (before it initialises); such
// a file then stays as a small leak (its descriptor and cache) instead of crashing the process.
class H5Session {
public:
    H5Session() : m_lock(h5Mutex())
    {
        static std::once_flag once;
        std::call_once(once, [] { H5dont_atexit(); });
        H5Eget_auto2(H5E_DEFAULT, &m_func, &m_data);
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    }
    ~H5Session() { H5Eset_auto2(H5E_DEFAULT, m_func, m_data); }
    H5Session(const H5Session&) = delete;
    H5Session& operator=(const H5Session&) = delete;

private:
    std::lock_guard<std::mutex> m_lock;
    H5E_auto2_t m_func = nullptr;
    void* m_data = nullptr;
};

// Owns one hid_t and closes it with the matching H5xclose.
class Hid {
public:
    using Closer = herr_t (*)(hid_t);
    Hid() = default;
    Hid(hid_t id, Closer close) : m_id(id), m_close(close) {}
    Hid(Hid&& o) noexcept : m_id(std::exchange(o.m_id, -1)), m_close(o.m_close) {}
    Hid& operator=(Hid&& o) noexcept
    {
        if (this != &o) {
            reset();
            m_id = std::exchange(o.m_id, -1);
            m_close = o.m_close;
        }
        return *this;
    }
    Hid(const Hid&) = delete;
    Hid& operator=(const Hid&) = delete;
    ~Hid() { reset(); }

    hid_t get() const { return m_id; }
    void reset()
    {
        if (m_id >= 0 && m_close) m_close(m_id);
        m_id = -1;
    }
    // Closes now and reports the result (a file's close is where buffered writes can fail).
    herr_t close()
    {
        herr_t r = 0;
        if (m_id >= 0 && m_close) r = m_close(m_id);
        m_id = -1;
        return r;
    }

private:
    hid_t m_id = -1;
    Closer m_close = nullptr;
};

// The most specific message on HDF5's error stack (where the failure arose), then clears it.
std::string h5Reason()
{
    std::string reason;
    auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        if (n == 0 && e && e->desc) *static_cast<std::string*>(data) = e->desc;
        return 0;
    };
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &reason);
    H5Eclear2(H5E_DEFAULT);
    if (reason.empty()) return "HDF5 error";
    // The POSIX driver's messages span lines with time, descriptor and buffer address; keep the
    // operation and the system's message ("file write failed: File too large").
    const std::string key = "error message = '";
    const size_t at = reason.find(key);
    if (at != std::string::npos) {
        const size_t start = at + key.size();
        const size_t end = reason.find('\'', start);
        const size_t colon = reason.find(':');
        reason = reason.substr(0, colon) + ": " +
                 reason.substr(start, end == std::string::npos ? std::string::npos : end - start);
    }
    for (char& c : reason)
        if (c == '\n' || c == '\r') c = ' ';
    return reason;
}

// Throws "file: place: what (HDF5's reason)" when an HDF5 call failed.
class Failer {
public:
    explicit Failer(std::string file) : m_file(std::move(file)) {}
    const std::string& file() const { return m_file; }

    [[noreturn]] void fail(const std::string& place, const std::string& reason) const
    {
        throw inputError(m_file, place, reason);
    }
    [[noreturn]] void failH5(const std::string& place, const std::string& what) const
    {
        fail(place, what + ": " + h5Reason());
    }
    Hid check(hid_t id, Hid::Closer close, const std::string& place, const std::string& what) const
    {
        if (id < 0) failH5(place, what);
        return Hid(id, close);
    }
    void check(herr_t status, const std::string& place, const std::string& what) const
    {
        if (status < 0) failH5(place, what);
    }

private:
    std::string m_file;
};

// A string from the file, quoted for an error message: control characters escaped and long
// values cut, so a hostile attribute cannot break the one-line message.
std::string quoted(const std::string& s)
{
    std::string out = "\"";
    for (size_t i = 0; i < s.size() && i < 64; ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    if (s.size() > 64) out += "...";
    return out + "\"";
}

// ---- types ----------------------------------------------------------------------------------

// IEEE binary16 the way h5py builds it (HDF5 1.10 has no predefined half type): numpy reads it
// as '<f2'. `native` gives the in-memory order for H5Dread/H5Dwrite.
Hid makeHalfType(const Failer& f, bool native)
{
    Hid t = f.check(H5Tcopy(native ? H5T_NATIVE_FLOAT : H5T_IEEE_F32LE), H5Tclose, "float16 type",
                    "cannot copy type");
    f.check(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), "float16 type", "cannot set fields");
    f.check(H5Tset_size(t.get(), 2), "float16 type", "cannot set size");
    f.check(H5Tset_ebias(t.get(), 15), "float16 type", "cannot set exponent bias");
    return t;
}

Hid makeStringType(const Failer& f, H5T_cset_t cset)
{
    Hid t = f.check(H5Tcopy(H5T_C_S1), H5Tclose, "string type", "cannot copy type");
    f.check(H5Tset_size(t.get(), H5T_VARIABLE), "string type", "cannot set size");
    f.check(H5Tset_cset(t.get(), cset), "string type", "cannot set character set");
    return t;
}

bool isHalfType(hid_t t)
{
    if (H5Tget_class(t) != H5T_FLOAT || H5Tget_size(t) != 2) return false;
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
    return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
           H5Tget_ebias(t) == 15;
}

bool isFloat32Type(hid_t t)
{
    if (H5Tget_class(t) != H5T_FLOAT || H5Tget_size(t) != 4) return false;
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
    return spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23 &&
           H5Tget_ebias(t) == 127;
}

std::string describeType(hid_t t)
{
    const size_t bits = 8 * H5Tget_size(t);
    switch (H5Tget_class(t)) {
    case H5T_FLOAT:
        if (isHalfType(t)) return "float16";
        return "float" + std::to_string(bits);
    case H5T_INTEGER:
        return (H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    default: return "unsupported type";
    }
}

// ---- attributes and strings -----------------------------------------------------------------

void writeStringAttr(const Failer& f, hid_t obj, const char* name, const std::string& value,
                     const std::string& place)
{
    const std::string where = place + "attribute " + name;
    Hid type = makeStringType(f, H5T_CSET_UTF8);
    Hid space = f.check(H5Screate(H5S_SCALAR), H5Sclose, where, "cannot create dataspace");
    Hid attr = f.check(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       H5Aclose, where, "cannot create");
    const char* p = value.c_str();
    f.check(H5Awrite(attr.get(), type.get(), &p), where, "cannot write");
}

void writeIntAttr(const Failer& f, hid_t obj, const char* name, int64_t value)
{
    const std::string where = std::string("attribute ") + name;
    Hid space = f.check(H5Screate(H5S_SCALAR), H5Sclose, where, "cannot create dataspace");
    Hid attr = f.check(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       H5Aclose, where, "cannot create");
    f.check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), where, "cannot write");
}

bool hasAttr(const Failer& f, hid_t obj, const char* name, const std::string& where)
{
    const htri_t e = H5Aexists(obj, name);
    if (e < 0) f.failH5(where, "cannot look up attribute");
    return e > 0;
}

// Number of elements of a dataspace; throws for a dataspace HDF5 cannot describe.
hssize_t countPoints(const Failer& f, hid_t space, const std::string& where)
{
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    if (n < 0) f.failH5(where, "cannot read dataspace");
    return n;
}

// Reads one string element from an attribute or a dataset of string type (variable or fixed
// length, ASCII or UTF-8), as h5py and other writers produce them.
std::string readString(const Failer& f, hid_t obj, bool isAttr, const std::string& where)
{
    Hid ftype = f.check(isAttr ? H5Aget_type(obj) : H5Dget_type(obj), H5Tclose, where,
                        "cannot read type");
    if (H5Tget_class(ftype.get()) != H5T_STRING)
        f.fail(where, "expected a string, found " + describeType(ftype.get()));
    Hid space = f.check(isAttr ? H5Aget_space(obj) : H5Dget_space(obj), H5Sclose, where,
                        "cannot read dataspace");
    if (countPoints(f, space.get(), where) != 1) f.fail(where, "expected a single string");
    const htri_t isVlen = H5Tis_variable_str(ftype.get());
    if (isVlen < 0) f.failH5(where, "cannot read type");
    const H5T_cset_t cset = H5Tget_cset(ftype.get());
    if (isVlen > 0) {
        Hid mtype = makeStringType(f, cset == H5T_CSET_UTF8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
        char* p = nullptr;
        const herr_t r = isAttr ? H5Aread(obj, mtype.get(), &p)
                                : H5Dread(obj, mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p);
        if (r < 0) f.failH5(where, "cannot read");
        std::string s = p ? std::string(p) : std::string();
        if (p) H5free_memory(p);
        return s;
    }
    const size_t size = H5Tget_size(ftype.get());
    if (size == 0 || size > (size_t(1) << 24)) f.fail(where, "string size out of range");
    std::vector<char> buf(size + 1, '\0');
    Hid mtype = f.check(H5Tcopy(ftype.get()), H5Tclose, where, "cannot copy type");
    const herr_t r = isAttr ? H5Aread(obj, mtype.get(), buf.data())
                            : H5Dread(obj, mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    if (r < 0) f.failH5(where, "cannot read");
    std::string s(buf.data(), size);
    const size_t nul = s.find('\0');
    if (nul != std::string::npos) s.resize(nul);
    // space-padded fixed strings (Fortran style) carry trailing blanks that are not content
    if (H5Tget_strpad(ftype.get()) == H5T_STR_SPACEPAD)
        while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
}

std::string readStringAttr(const Failer& f, hid_t obj, const char* name)
{
    const std::string where = std::string("attribute ") + name;
    Hid attr = f.check(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, where, "cannot open");
    return readString(f, attr.get(), true, where);
}

int64_t readIntAttr(const Failer& f, hid_t obj, const char* name)
{
    const std::string where = std::string("attribute ") + name;
    if (!hasAttr(f, obj, name, where)) f.fail(where, "missing");
    Hid attr = f.check(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, where, "cannot open");
    Hid type = f.check(H5Aget_type(attr.get()), H5Tclose, where, "cannot read type");
    if (H5Tget_class(type.get()) != H5T_INTEGER)
        f.fail(where, "expected an integer, found " + describeType(type.get()));
    Hid space = f.check(H5Aget_space(attr.get()), H5Sclose, where, "cannot read dataspace");
    if (countPoints(f, space.get(), where) != 1) f.fail(where, "expected a single integer");
    int64_t v = 0;
    f.check(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), where, "cannot read");
    return v;
}

int readDimAttr(const Failer& f, hid_t obj, const char* name)
{
    const int64_t v = readIntAttr(f, obj, name);
    // validateShape gives the real limits; this only keeps the value representable as int
    if (v < -(int64_t(1) << 31) || v >= (int64_t(1) << 31))
        f.fail(std::string("attribute ") + name, std::to_string(v) + " is out of range");
    return int(v);
}

// ---- layout ---------------------------------------------------------------------------------

// "00".."99", wider when the layer count needs it (3 digits above 100 layers, 4 above 1000).
std::string layerGroupName(int layer, int numLayers)
{
    int width = 2;
    for (int n = numLayers - 1; n >= 100; n /= 10) ++width;
    std::string s = std::to_string(layer);
    if (int(s.size()) < width) s.insert(0, size_t(width) - s.size(), '0');
    return s;
}

std::string tensorPlace(const std::string& group, KvKind kind)
{
    return "/layers/" + group + "/" + kindName(kind);
}

// ---- writing --------------------------------------------------------------------------------

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

bool linkExists(const Failer& f, hid_t loc, const std::string& name, const std::string& place);

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

bool linkExists(const Failer& f, hid_t loc, const std::string& name, const std::string& place)
{
    const htri_t e = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
    if (e < 0) f.failH5(place, "cannot look up");
    return e > 0;
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
