#include "transport/protocol.h"

#include "common/error.h"

#include <cctype>
#include <cstdio>

namespace kvscope {

namespace {

void putU32(std::vector<uint8_t>& b, uint32_t v)
{
    for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

uint32_t getU32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

}  // namespace

std::string contextKey(const std::string& modelFingerprint, const std::vector<int32_t>& tokens)
{
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint8_t b) {
        h ^= b;
        h *= 0x100000001b3ull;
    };
    for (char c : modelFingerprint) mix(uint8_t(c));
    mix(0);
    for (int32_t t : tokens)
        for (int i = 0; i < 4; ++i) mix(uint8_t(uint32_t(t) >> (8 * i)));
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
    return buf;
}

bool isRequest(FrameType t)
{
    return t == FrameType::SkeletonRequest || t == FrameType::ChunkRequest || t == FrameType::TextRequest;
}

std::vector<uint8_t> frameHeader(FrameType type, uint32_t length)
{
    std::vector<uint8_t> b;
    b.reserve(kFrameHeaderBytes);
    putU32(b, kFrameMagic);
    b.push_back(uint8_t(type));
    b.push_back(0);
    b.push_back(0);
    b.push_back(0);
    putU32(b, length);
    return b;
}

bool parseFrameHeader(const uint8_t* h, FrameType* type, uint32_t* length, std::string* why)
{
    if (getU32(h) != kFrameMagic) {
        *why = "bad magic (not a kvscope chunk frame)";
        return false;
    }
    if (h[5] || h[6] || h[7]) {
        *why = "reserved header bytes are not zero";
        return false;
    }
    *type = FrameType(h[4]);
    *length = getU32(h + 8);
    return true;
}

std::vector<uint8_t> encodeRequest(const Request& r)
{
    KVSCOPE_ASSERT(isRequest(r.type) && r.context.size() <= kMaxContextKeyBytes);
    std::vector<uint8_t> p;
    p.push_back(uint8_t(r.codec));
    putU32(p, r.chunk);
    putU32(p, r.level);
    p.push_back(uint8_t(r.context.size()));
    p.push_back(uint8_t(r.context.size() >> 8));
    p.insert(p.end(), r.context.begin(), r.context.end());
    std::vector<uint8_t> f = frameHeader(r.type, uint32_t(p.size()));
    f.insert(f.end(), p.begin(), p.end());
    return f;
}

Request parseRequest(FrameType type, const uint8_t* p, size_t size)
{
    if (!isRequest(type)) throw Error("request: frame type " + std::to_string(int(type)) + " is not a request");
    if (size < 11) throw Error("request: payload of " + std::to_string(size) + " bytes is shorter than 11");
    Request r;
    r.type = type;
    if (p[0] > uint8_t(CodecId::Transform)) throw Error("request: unknown codec id " + std::to_string(p[0]));
    r.codec = CodecId(p[0]);
    r.chunk = getU32(p + 1);
    r.level = getU32(p + 5);
    const size_t n = size_t(p[9]) | size_t(p[10]) << 8;
    if (n > kMaxContextKeyBytes) throw Error("request: context name of " + std::to_string(n) + " bytes is too long");
    if (11 + n != size) throw Error("request: context name length does not match the payload");
    r.context.assign(reinterpret_cast<const char*>(p + 11), n);
    for (char c : r.context)
        if (!(std::isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.'))
            throw Error("request: the context name holds characters other than [A-Za-z0-9_.-]");
    return r;
}

std::vector<uint8_t> encodeTokens(const std::vector<int32_t>& tokens)
{
    std::vector<uint8_t> b;
    b.reserve(tokens.size() * 4);
    for (int32_t t : tokens) putU32(b, uint32_t(t));
    return b;
}

std::vector<int32_t> decodeTokens(const uint8_t* data, size_t size, const std::string& where)
{
    if (size % 4) throw Error(where + ": token payload of " + std::to_string(size) + " bytes is not a multiple of 4");
    std::vector<int32_t> t(size / 4);
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(getU32(data + 4 * i));
    return t;
}

}  // namespace kvscope
