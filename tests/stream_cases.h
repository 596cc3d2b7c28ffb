// Shared set-up of the streaming suites (tst_stream, tst_server, tst_stream_load): synthetic caches
// with token ids, their .kvc files, protocol requests, a free local port and a redis-server of a
// test's own.
#pragma once

#include "codec/container.h"
#include "codec/profile.h"
#include "kv/kv_set.h"
#include "transport/link.h"
#include "transport/net.h"
#include "transport/protocol.h"

#include <QFile>
#include <QProcess>
#include <QString>

#include <chrono>
#include <string>
#include <thread>

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

// A redis-server of one test's own: on a free loopback port, no persistence, files in dir; stopped
// (terminate, then kill) when it goes out of scope. up() says whether it accepted a connection
// within 10 s. Check installed() first and QSKIP without it.
class TestRedis {
public:
    static constexpr const char* kPath = "/usr/bin/redis-server";
    static bool installed() { return QFile::exists(kPath); }

    explicit TestRedis(const QString& dir) : m_port(freePort())
    {
        m_proc.start(kPath, {"--port", QString::number(m_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--daemonize", "no", "--dir", dir});
        if (!m_proc.waitForStarted(5000)) return;
        for (double until = monoSeconds() + 10; !m_up && monoSeconds() < until;) {
            try {
                Socket::connectTcp("127.0.0.1", m_port, 0.5);
                m_up = true;
            } catch (const NetError&) {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        }
    }
    ~TestRedis()
    {
        m_proc.terminate();
        if (!m_proc.waitForFinished(5000)) m_proc.kill();
    }
    TestRedis(const TestRedis&) = delete;
    TestRedis& operator=(const TestRedis&) = delete;

    bool up() const { return m_up; }
    // The store URL of key prefix `prefix` on this server.
    std::string url(const std::string& prefix) const { return "redis://127.0.0.1:" + std::to_string(m_port) + "/" + prefix; }

private:
    int m_port;
    QProcess m_proc;
    bool m_up = false;
};

}  // namespace kvscope_test
