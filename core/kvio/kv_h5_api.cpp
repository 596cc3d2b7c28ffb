// The HDF5 C API wrapped for the KV files (kv_h5_api.h): the session, HDF5's error stack, the
// types, attributes and strings of the format.
#include "kvio/kv_h5_api.h"

#include <cstdio>
#include <vector>

namespace kvscope::h5 {

// HDF5 builds without --enable-threadsafe must not be entered from two threads; Debian's build is
// threadsafe, but a GUI worker and a CLI pipeline should not depend on how HDF5 was configured.
std::mutex& h5Mutex()
{
    static std::mutex m;
    return m;
}

H5Session::H5Session() : m_lock(h5Mutex())
{
    static std::once_flag once;
    std::call_once(once, [] { H5dont_atexit(); });
    H5Eget_auto2(H5E_DEFAULT, &m_func, &m_data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

H5Session::~H5Session() { H5Eset_auto2(H5E_DEFAULT, m_func, m_data); }

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

bool linkExists(const Failer& f, hid_t loc, const std::string& name, const std::string& place)
{
    const htri_t e = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
    if (e < 0) f.failH5(place, "cannot look up");
    return e > 0;
}

}  // namespace kvscope::h5
