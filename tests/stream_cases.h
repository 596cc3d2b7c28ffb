// Shared set-up of the streaming suites (tst_stream, tst_stream_load): synthetic caches with token
// ids, their .kvc files, protocol requests and a free local port.
#pragma once

#include "codec/container.h"
#include "codec/profile.h"
#include "kv/kv_set.h"
#include "transport/net.h"
#include "transport/protocol.h"

#include <string>

namespace kvscope_test {

using namespace kvscope;

// A synthetic cache with token ids, so contexts have names and text replies have content.
inline KvSet syntheticKv(int layers, int heads, int tokens, uint64_t seed)
{
    SyntheticSpec spec;
    spec.shape = KvShape{layers, heads, 64, tokens};
    spec.seed = seed;
    KvSet kv = makeSyntheticKv(spec);
    for (int t = 0; t < tokens; ++t) kv.tokens.push_back(int32_t((t * 7919 + int(seed)) % 49152));
    return kv;
}

// Writes kv to path with the default profile at the given chunk size; returns path.
inline std::string encode(const KvSet& kv, CodecId codec, int chunkTokens, const std::string& path)
{
    CodecParams p;
    p.codec = codec;
    p.shape = kv.shape();
    p.dtype = kv.dtype();
    p.profile = defaultProfile(kv.shape().numLayers);
    p.profile.chunkTokens = chunkTokens;
    writeKvc(kv, p, path);
    return path;
}

inline Request request(FrameType type, const std::string& context, CodecId codec, int chunk = 0, int level = 0)
{
    Request r;
    r.type = type;
    r.codec = codec;
    r.context = context;
    r.chunk = uint32_t(chunk);
    r.level = uint32_t(level);
    return r;
}

// A TCP port on 127.0.0.1 that was free a moment ago.
inline int freePort()
{
    Socket s = Socket::listenTcp("127.0.0.1", 0);
    return s.localPort();
}

}  // namespace kvscope_test
