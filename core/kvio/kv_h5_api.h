// The HDF5 C API as the KV file code uses it (kv_h5.cpp reads, kv_h5_write.cpp writes, kv_h5_api.cpp
// defines what is declared here): a session that serialises HDF5, RAII handles, failures turned into
// kvscope::Error("file: place: reason") with HDF5's innermost message, and the types, attributes
// and strings of the format in kv_h5.h. Internal to kvscope_kvio (the only stage that sees hdf5.h).
#pragma once

#include "kv/kv_set.h"
#include "common/error.h"

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace kvscope::h5 {

inline constexpr char kFormatName[] = "kvscope-kv";

// Held for the duration of one public call: serialises HDF5 and silences its automatic error
// printing (we report through exceptions), restoring the caller's handler afterwards.
//
// HDF5 1.10 cannot close a file whose final flush failed (disk full, EFBIG): H5Fclose fails,
// the id stays registered, and any later close of it, including the one HDF5's atexit handler
// makes, segfaults. So the library is told not to clean up at exit (before it initialises); such
// a file then stays as a small leak (its descriptor and cache) instead of crashing the process.
class H5Session {
public:
    H5Session();
    ~H5Session();
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
std::string h5Reason();

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
std::string quoted(const std::string& s);

// ---- types (IEEE binary16 as h5py builds it: numpy reads it as '<f2'; `native` gives the
// in-memory order for H5Dread/H5Dwrite)
Hid makeHalfType(const Failer& f, bool native);
Hid makeStringType(const Failer& f, H5T_cset_t cset);
bool isHalfType(hid_t t);
bool isFloat32Type(hid_t t);
// "float16", "uint16", "string", ... for messages.
std::string describeType(hid_t t);

// ---- attributes, strings and links
void writeStringAttr(const Failer& f, hid_t obj, const char* name, const std::string& value,
                     const std::string& place);
void writeIntAttr(const Failer& f, hid_t obj, const char* name, int64_t value);
bool hasAttr(const Failer& f, hid_t obj, const char* name, const std::string& where);
// Number of elements of a dataspace; throws for a dataspace HDF5 cannot describe.
hssize_t countPoints(const Failer& f, hid_t space, const std::string& where);
// One string element of an attribute (isAttr) or a dataset: variable or fixed length, ASCII or UTF-8.
std::string readString(const Failer& f, hid_t obj, bool isAttr, const std::string& where);
std::string readStringAttr(const Failer& f, hid_t obj, const char* name);
// Any integer type; "missing" when absent.
int64_t readIntAttr(const Failer& f, hid_t obj, const char* name);
// readIntAttr, representable as int (validateShape checks the real limits).
int readDimAttr(const Failer& f, hid_t obj, const char* name);
bool linkExists(const Failer& f, hid_t loc, const std::string& name, const std::string& place);

// ---- layout
// "00".."99", wider when the layer count needs it (3 digits above 100 layers, 4 above 1000).
std::string layerGroupName(int layer, int numLayers);
// "/layers/NN/key" or "/layers/NN/value".
std::string tensorPlace(const std::string& group, KvKind kind);

}  // namespace kvscope::h5
