// The Redis chunk store and `push`, on Debian's hiredis (synchronous API). One connection per
// store, guarded by a mutex: hiredis contexts are not thread-safe, and a lab server has few peers.
#include "transport/store.h"

#include "transport/link.h"
#include "transport/protocol.h"

#include <hiredis/hiredis.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <sys/time.h>

namespace kvscope {

RedisAddress parseRedisUrl(const std::string& url)
{
    if (!isRedisUrl(url)) throw inputError(url, "", "not a redis:// URL");
    RedisAddress a;
    std::string rest = url.substr(8);
    const size_t slash = rest.find('/');
    if (slash != std::string::npos) {
        const std::string prefix = rest.substr(slash + 1);
        if (!prefix.empty()) a.prefix = prefix;
        rest = rest.substr(0, slash);
    }
    const size_t colon = rest.rfind(':');
    if (colon != std::string::npos) {
        const std::string port = rest.substr(colon + 1);
        char* end = nullptr;
        const long p = std::strtol(port.c_str(), &end, 10);
        if (port.empty() || *end || p < 1 || p > 65535) throw inputError(url, "port", "'" + port + "' is not a port number");
        a.port = int(p);
        rest = rest.substr(0, colon);
    }
    if (!rest.empty()) a.host = rest == "localhost" ? "127.0.0.1" : rest;
    for (char c : a.prefix)
        if (c == ' ' || c == '\n' || c == '\r') throw inputError(url, "prefix", "holds whitespace");
    return a;
}

namespace {

struct ReplyDeleter {
    void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisConnection {
public:
    explicit RedisConnection(const std::string& url) : m_url(url), m_addr(parseRedisUrl(url))
    {
        timeval tv{2, 0};
        m_ctx = redisConnectWithTimeout(m_addr.host.c_str(), m_addr.port, tv);
        if (!m_ctx) throw inputError(url, "connect", "out of memory");
        if (m_ctx->err) {
            const std::string why = m_ctx->errstr;
            redisFree(m_ctx);
            m_ctx = nullptr;
            throw inputError(url, "connect", why);
        }
        timeval io{10, 0};  // every command answers within 10 s or fails
        redisSetTimeout(m_ctx, io);
    }
    ~RedisConnection()
    {
        if (m_ctx) redisFree(m_ctx);
    }
    const RedisAddress& address() const { return m_addr; }

    // One command; throws on a connection error or an error reply.
    Reply command(const std::vector<std::string>& args)
    {
        std::vector<const char*> argv;
        std::vector<size_t> lens;
        for (const std::string& a : args) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        Reply r(static_cast<redisReply*>(redisCommandArgv(m_ctx, int(argv.size()), argv.data(), lens.data())));
        check(r, args.front());
        return r;
    }
    // Pipelined: append many, then collect every reply.
    void append(const std::vector<std::string>& args)
    {
        std::vector<const char*> argv;
        std::vector<size_t> lens;
        for (const std::string& a : args) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        if (redisAppendCommandArgv(m_ctx, int(argv.size()), argv.data(), lens.data()) != REDIS_OK)
            throw inputError(m_url, args.front(), m_ctx->errstr);
        ++m_pending;
    }
    void collect()
    {
        for (; m_pending > 0; --m_pending) {
            void* raw = nullptr;
            if (redisGetReply(m_ctx, &raw) != REDIS_OK) throw inputError(m_url, "pipeline", m_ctx->errstr);
            check(Reply(static_cast<redisReply*>(raw)), "pipeline");
        }
    }

private:
    void check(const Reply& r, const std::string& what)
    {
        if (!r) throw inputError(m_url, what, m_ctx->errstr[0] ? m_ctx->errstr : "no reply");
        if (r->type == REDIS_REPLY_ERROR) throw inputError(m_url, what, std::string(r->str, r->len));
    }
    std::string m_url;
    RedisAddress m_addr;
    redisContext* m_ctx = nullptr;
    int m_pending = 0;
};

class RedisStore : public ChunkStore {
public:
    explicit RedisStore(const std::string& url) : m_url(url), m_conn(url) {}
    std::string describe() const override { return m_url; }

    std::vector<uint8_t> skeleton(const std::string& context, CodecId codec) override
    {
        return get(key(context, codec) + ":skeleton", "no context " + context + " with codec " + codecName(codec));
    }
    std::vector<uint8_t> chunk(const std::string& context, CodecId codec, int chunk, int level) override
    {
        return get(key(context, codec) + ":" + std::to_string(chunk) + ":" + std::to_string(level),
                   "no chunk " + std::to_string(chunk) + " at level " + std::to_string(level) + " of context " + context);
    }
    std::vector<std::string> contents() override
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        const std::string prefix = m_conn.address().prefix + ":";
        Reply r = m_conn.command({"KEYS", prefix + "*:skeleton"});
        std::vector<std::string> out;
        if (r->type == REDIS_REPLY_ARRAY)
            for (size_t i = 0; i < r->elements; ++i) {
                std::string k(r->element[i]->str, r->element[i]->len);
                k = k.substr(prefix.size(), k.size() - prefix.size() - 9);  // CONTEXT:CODEC
                out.push_back(k);
            }
        return out;
    }

private:
    std::string key(const std::string& context, CodecId codec) const
    {
        return m_conn.address().prefix + ":" + context + ":" + codecName(codec);
    }
    std::vector<uint8_t> get(const std::string& k, const std::string& missing)
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        Reply r = m_conn.command({"GET", k});
        if (r->type == REDIS_REPLY_NIL) throw StoreMiss(missing + " in " + m_url);
        if (r->type != REDIS_REPLY_STRING) throw inputError(m_url, k, "not a string value");
        return std::vector<uint8_t>(r->str, r->str + r->len);
    }
    std::string m_url;
    std::mutex m_mutex;
    RedisConnection m_conn;
};

}  // namespace

std::unique_ptr<ChunkStore> openRedisStore(const std::string& url) { return std::make_unique<RedisStore>(url); }

PushReport pushKvcToRedis(const KvcReader& kvc, const std::string& url)
{
    const double t0 = monoSeconds();
    RedisConnection conn(url);
    PushReport rep;
    rep.context = kvcContextKey(kvc);
    rep.codec = codecName(kvc.params().codec);
    const std::string base = conn.address().prefix + ":" + rep.context + ":" + rep.codec;
    // Chunks first, skeleton last: a reader that sees the skeleton finds every chunk.
    for (int c = 0; c < kvc.params().numChunks(); ++c) {
        for (int l = 1; l <= kvc.params().numLevels(); ++l) {
            const std::vector<uint8_t> b = kvc.readChunk(c, l);
            conn.append({"SET", base + ":" + std::to_string(c) + ":" + std::to_string(l), std::string(b.begin(), b.end())});
            rep.bytes += b.size();
            ++rep.keys;
        }
        conn.collect();  // one chunk's levels in flight at a time bounds memory
    }
    const std::vector<uint8_t> s = kvc.skeleton();
    conn.command({"SET", base + ":skeleton", std::string(s.begin(), s.end())});
    rep.bytes += s.size();
    ++rep.keys;
    rep.seconds = monoSeconds() - t0;
    return rep;
}

}  // namespace kvscope
