// The chunk protocol between a chunk server and its clients, over TCP, one request at a time per
// connection. Every frame is a 12-byte header and a payload; all integers little-endian.
//
//   u32 magic "KVS1" (bytes 4B 56 53 31)   u8 type   u8[3] reserved (0)   u32 payload length
//
// Requests (client -> server), payload at most kMaxRequestBytes:
//   u8 codec (core/codec/chunk_codec.h CodecId)  u32 chunk  u32 level  u16 n  u8 context[n]
//   type 1 skeleton: the .kvc without payloads (KvcReader::skeleton) of (context, codec)
//   type 2 chunk:    the payload of (chunk, level), exactly as in the .kvc (its CRC is in the skeleton)
//   type 3 text:     the chunk's token ids (i32 each), for recomputation
// Replies (server -> client): type 0x81/0x82/0x83 with the bytes above, or 0xFF with a UTF-8
// error message (at most kMaxErrorBytes). A request the server cannot parse gets an error frame;
// bytes that are not a frame get an error frame and a closed connection.
//
// A context is named by contextKey(model fingerprint, token ids): the same text under the same
// model has the same key on every node (content addressing, as LMCache does).
#pragma once

#include "codec/chunk_codec.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

constexpr uint32_t kFrameMagic = 0x3153564B;  // "KVS1" read as little-endian u32
constexpr size_t kFrameHeaderBytes = 12;
constexpr uint32_t kMaxRequestBytes = 1024;
constexpr uint32_t kMaxErrorBytes = 4096;
constexpr size_t kMaxContextKeyBytes = 256;

enum class FrameType : uint8_t {
    SkeletonRequest = 1,
    ChunkRequest = 2,
    TextRequest = 3,
    Skeleton = 0x81,
    Chunk = 0x82,
    Text = 0x83,
    Error = 0xFF,
};

struct Request {
    FrameType type = FrameType::ChunkRequest;
    CodecId codec = CodecId::CacheGen;
    std::string context;
    uint32_t chunk = 0;
    uint32_t level = 0;
};

// 16 hex digits: FNV-1a (64 bit) over the fingerprint's bytes, a 0 byte, and the token ids (LE).
std::string contextKey(const std::string& modelFingerprint, const std::vector<int32_t>& tokens);

std::vector<uint8_t> frameHeader(FrameType type, uint32_t length);
// Checks magic and reserved bytes; false with a reason otherwise.
bool parseFrameHeader(const uint8_t* header, FrameType* type, uint32_t* length, std::string* why);
// The whole frame of a request.
std::vector<uint8_t> encodeRequest(const Request& r);
// Throws kvscope::Error "request: reason" for a malformed payload.
Request parseRequest(FrameType type, const uint8_t* payload, size_t size);
bool isRequest(FrameType t);

std::vector<uint8_t> encodeTokens(const std::vector<int32_t>& tokens);
// Throws kvscope::Error "where: reason" when size is not a multiple of 4.
std::vector<int32_t> decodeTokens(const uint8_t* data, size_t size, const std::string& where);

}  // namespace kvscope
