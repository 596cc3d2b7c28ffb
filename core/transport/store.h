// Chunk stores: where a chunk server finds the compressed KV of a context. Two kinds:
//  - files: one or more .kvc containers, or a folder of them (each is one (context, codec));
//  - Redis (redis://HOST:PORT/PREFIX), the store a deployment shares across serving nodes
//    (LMCache keeps remote KV there too), filled by pushKvcToRedis:
//        PREFIX:CONTEXT:CODEC:skeleton        the .kvc without payloads (KvcReader::skeleton)
//        PREFIX:CONTEXT:CODEC:CHUNK:LEVEL     one payload, bytes as in the .kvc
//    CONTEXT is contextKey() of the file's fingerprint and tokens, CODEC its name ("cachegen").
// Only store.cpp and redis_store.cpp know hiredis; no third-party type appears here.
#pragma once

#include "codec/container.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

// A lookup that found nothing (unknown context, chunk or level): the server answers with an
// error frame and keeps the connection.
class StoreMiss : public Error {
public:
    explicit StoreMiss(const std::string& m) : Error(m) {}
};

class ChunkStore {
public:
    virtual ~ChunkStore() = default;
    virtual std::string describe() const = 0;
    // Throw StoreMiss when absent, kvscope::Error when the store fails. Thread-safe.
    virtual std::vector<uint8_t> skeleton(const std::string& context, CodecId codec) = 0;
    virtual std::vector<uint8_t> chunk(const std::string& context, CodecId codec, int chunk, int level) = 0;
    // "CONTEXT:CODEC" of everything held (for logs and `serve`'s banner).
    virtual std::vector<std::string> contents() = 0;
};

// "a.kvc", "a.kvc,b.kvc", a folder (every *.kvc in it) or "redis://HOST:PORT/PREFIX".
// Throws kvscope::Error naming the file or URL.
std::unique_ptr<ChunkStore> openStore(const std::string& url);
bool isRedisUrl(const std::string& url);

struct RedisAddress {
    std::string host = "127.0.0.1";
    int port = 6379;
    std::string prefix = "kvscope";
};
// redis://HOST[:PORT][/PREFIX]; throws kvscope::Error "url: reason".
RedisAddress parseRedisUrl(const std::string& url);

struct PushReport {
    std::string context;
    std::string codec;
    int keys = 0;
    uint64_t bytes = 0;
    double seconds = 0;
};
// Loads every (chunk, level) of a .kvc into Redis, plus its skeleton key. Throws kvscope::Error.
PushReport pushKvcToRedis(const KvcReader& kvc, const std::string& url);

// The key of a context in a .kvc: contextKey(fingerprint, tokens).
std::string kvcContextKey(const KvcReader& kvc);

}  // namespace kvscope
