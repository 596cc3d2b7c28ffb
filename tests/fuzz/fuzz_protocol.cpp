// libFuzzer target for the chunk protocol as the chunk server reads it (core/transport/protocol.h,
// the request loop of core/transport/server.cpp): the input is the byte stream a client sends on one
// connection. Frames are taken one after another exactly as the server does (header check, request
// type, length limit, parseRequest), and every parsed request is answered from a FileStore over the
// golden .kvc files, so the store's lookups see fuzzed contexts, codecs, chunks and levels. A
// request whose context is the single byte '@' is given the store's first key, so that the chunk
// and level paths are reachable without the fuzzer guessing a 16-digit hash. The reply frames'
// token payloads go through decodeTokens, as the client reads them.
//
// Contract: parseFrameHeader rejects bad headers with a reason; parseRequest, the store and
// decodeTokens either answer or throw kvscope::Error. Only kvscope::Error is caught.
#include "codec/container.h"
#include "common/error.h"
#include "transport/protocol.h"
#include "transport/store.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

using namespace kvscope;

namespace {

ChunkStore& store()
{
    // cachegen-shared.kvc holds the same context and codec as cachegen-inband.kvc: one of them.
    static std::unique_ptr<ChunkStore> s =
        openStore(KVSCOPE_FUZZ_GOLDEN "/cachegen-inband.kvc," KVSCOPE_FUZZ_GOLDEN "/int8.kvc");
    return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    static const std::vector<std::string> keys = store().contents();
    size_t at = 0;
    while (size - at >= kFrameHeaderBytes) {
        FrameType type;
        uint32_t length = 0;
        std::string why;
        if (!parseFrameHeader(data + at, &type, &length, &why)) {
            if (why.empty()) __builtin_trap();  // the server sends the reason to the client
            break;
        }
        at += kFrameHeaderBytes;
        if (!isRequest(type) || length > kMaxRequestBytes) break;
        if (length > size - at) break;  // the server would wait for the rest, then time out
        const uint8_t* payload = data + at;
        at += length;
        try {
            Request r = parseRequest(type, payload, length);
            if (r.context == "@" && !keys.empty()) r.context = keys[0];
            if (r.type == FrameType::SkeletonRequest) {
                store().skeleton(r.context, r.codec);
            } else if (r.type == FrameType::ChunkRequest) {
                store().chunk(r.context, r.codec, int(std::min<uint32_t>(r.chunk, 1u << 30)),
                              int(std::min<uint32_t>(r.level, 1u << 30)));
            } else {
                // The text reply, as the server builds it: the chunk's token ids from the skeleton;
                // the client decodes them.
                auto sk = KvcReader::fromSkeleton(store().skeleton(r.context, r.codec), "context " + r.context);
                const CodecParams& cp = sk->params();
                if (!sk->tokens().empty() && r.chunk < uint32_t(cp.numChunks())) {
                    const int c0 = cp.chunkStart(int(r.chunk)), n = cp.chunkLength(int(r.chunk));
                    const std::vector<uint8_t> ids =
                        encodeTokens(std::vector<int32_t>(sk->tokens().begin() + c0, sk->tokens().begin() + c0 + n));
                    decodeTokens(ids.data(), ids.size(), "reply");
                }
                decodeTokens(payload, length, "reply");
            }
            encodeRequest(r);
        } catch (const Error&) {
        }
    }
    return 0;
}
