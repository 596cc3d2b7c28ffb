#include "transport/server.h"

#include "transport/protocol.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

namespace kvscope {

FaultPlan parseFaults(const std::string& text)
{
    FaultPlan f;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t comma = text.find(',', pos);
        if (comma == std::string::npos) comma = text.size();
        const std::string item = text.substr(pos, comma - pos);
        pos = comma + 1;
        const size_t colon = item.find(':');
        const std::string kind = item.substr(0, colon);
        int n = -1;
        if (colon != std::string::npos) {
            const std::string num = item.substr(colon + 1);
            char* end = nullptr;
            const long v = std::strtol(num.c_str(), &end, 10);
            if (!num.empty() && !*end && v >= 0 && v < 1000000) n = int(v);
        }
        if (n < 0 || (kind != "die" && kind != "corrupt" && kind != "stall"))
            throw inputError("--fault", "'" + item + "'", "expected die:N, corrupt:N or stall:N (N = chunk reply, from 0)");
        (kind == "die" ? f.dieAtChunk : kind == "corrupt" ? f.corruptChunk : f.stallChunk) = n;
    }
    return f;
}

namespace {

enum ReplyFault { kNoFault, kDieHalfway, kStallHalfway };

constexpr size_t kWritePiece = size_t(64) << 10;  // bytes per write with its own ioTimeout

std::chrono::steady_clock::time_point toTimePoint(double mono)
{
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(mono)));
}

}  // namespace

ChunkServer::ChunkServer(std::shared_ptr<ChunkStore> store, const ServerOptions& options)
    : m_store(std::move(store)), m_opt(options), m_pacer(options.link)
{
    m_listener = m_opt.listen ? m_opt.listen(m_opt.host, m_opt.port) : Socket::listenTcp(m_opt.host, m_opt.port);
    m_port = m_listener.localPort();
}

ChunkServer::~ChunkServer() { stop(); }

void ChunkServer::start()
{
    if (m_acceptThread.joinable() || m_stop) return;
    m_acceptThread = std::thread([this] { acceptLoop(); });
}

void ChunkServer::stop()
{
    {
        std::lock_guard<std::mutex> lock(m_mutex);  // under the lock: no sleeper misses the wake-up
        m_stop = true;
        m_dead = true;
        for (auto& c : m_conns) c->socket.shutdown();
    }
    m_wake.notify_all();
    if (m_acceptThread.joinable()) m_acceptThread.join();
    reap(true);
    m_listener.close();
}

ServerStats ChunkServer::stats() const
{
    ServerStats s;
    s.connections = m_connections;
    s.requests = m_requests;
    s.errorFrames = m_errors;
    s.chunkReplies = m_chunkReplies;
    s.bytesSent = m_pacer.bytesSent();
    return s;
}

void ChunkServer::reap(bool all)
{
    std::list<std::unique_ptr<Connection>> finished;
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        for (auto it = m_conns.begin(); it != m_conns.end();) {
            if (all || (*it)->done) {
                finished.push_back(std::move(*it));
                it = m_conns.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto& c : finished) {
        c->socket.shutdown();
        if (c->thread.joinable()) c->thread.join();
        if (c->reader.joinable()) c->reader.join();
    }
}

void ChunkServer::acceptLoop()
{
    while (!m_stop) {
        Socket s = m_listener.accept(monoSeconds() + 0.05);
        reap(false);
        if (!s.valid()) continue;
        if (m_stop) break;
        std::lock_guard<std::mutex> lock(m_mutex);
        if (int(m_conns.size()) >= m_opt.maxConnections) continue;  // closed by Socket's destructor
        ++m_connections;
        m_conns.push_back(std::make_unique<Connection>());
        Connection* c = m_conns.back().get();
        c->socket = std::move(s);
        c->lastActivity = monoSeconds();
        c->reader = std::thread([this, c] { readRequests(c); });
        c->thread = std::thread([this, c] { serve(c); });
    }
    m_listener.close();  // a dead server refuses new connections
}

bool ChunkServer::sleepUnlessStopped(double until)
{
    std::unique_lock<std::mutex> lock(m_mutex);
    return !m_wake.wait_until(lock, toTimePoint(until), [this] { return m_stop.load(); });
}

void ChunkServer::settleBusy(Connection* c, bool force)
{
    if (c->sendId < 0) return;
    bool keep = false;
    if (!force) {
        std::lock_guard<std::mutex> lock(c->mutex);
        keep = !c->queue.empty() && c->queue.front().kind == Incoming::Frame &&
               c->queue.front().arrivedAt + m_opt.rttSeconds <= monoSeconds();
    }
    if (keep) return;
    m_pacer.endSend(c->sendId);
    c->sendId = -1;
}

void ChunkServer::sendPaced(Connection* c, const uint8_t* data, size_t n)
{
    const Socket& s = c->socket;
    if (c->sendId < 0) c->sendId = m_pacer.beginSend();
    struct EndOnThrow {
        ChunkServer* self;
        Connection* c;
        bool armed = true;
        ~EndOnThrow()
        {
            if (armed) self->settleBusy(c, true);
        }
    } guard{this, c};
    const int id = c->sendId;
    // Wake up for about half a millisecond of data: precise enough, and not a busy loop.
    const uint64_t wakeBytes =
        uint64_t(std::clamp(m_pacer.schedule().meanBytesPerSecond() * 0.0005, 1500.0, 65536.0));
    size_t sent = 0;
    while (sent < n) {
        if (m_stop) throw NetError(NetError::Closed, "server stopping");
        const double now = monoSeconds();
        const uint64_t g = m_pacer.grant(std::min<uint64_t>(n - sent, uint64_t(4) << 20), now, id);
        if (g == 0) {
            // No credit yet, or others are owed first (then the link has credit: look again shortly).
            const double t = m_pacer.whenAvailable(std::min<uint64_t>(n - sent, wakeBytes));
            std::this_thread::sleep_until(toTimePoint(std::clamp(t, now + 0.0002, now + 0.05)));
            continue;
        }
        // ioTimeout bounds a write that makes no progress, not a whole grant: under --link kernel
        // the pacer is unlimited and grants up to 4 MiB at once, which a slow shaped link may take
        // longer than ioTimeout to drain (2.8 MB at 2 Mbit/s: 11 s).
        for (size_t off = 0; off < size_t(g);) {
            const size_t piece = std::min<size_t>(size_t(g) - off, kWritePiece);
            s.sendAll(data + sent + off, piece, monoSeconds() + m_opt.ioTimeout);
            off += piece;
        }
        sent += size_t(g);
    }
    guard.armed = false;
}

void ChunkServer::sendFrame(Connection* c, FrameType type, const std::vector<uint8_t>& payload, int fault,
                            size_t* sentOut, double notBefore)
{
    if (m_opt.rttSeconds > 0 && notBefore > monoSeconds() && !sleepUnlessStopped(notBefore))
        throw NetError(NetError::Closed, "server stopping");
    std::vector<uint8_t> frame = frameHeader(type, uint32_t(payload.size()));
    frame.insert(frame.end(), payload.begin(), payload.end());
    size_t n = frame.size();
    if (fault != kNoFault) n = kFrameHeaderBytes + payload.size() / 2;
    sendPaced(c, frame.data(), n);
    if (sentOut) *sentOut = n;
    if (fault != kNoFault) settleBusy(c, true);
    if (fault == kDieHalfway) {
        std::fprintf(stderr, "serve: fault: dying halfway through a chunk reply\n");
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_dead = true;
            m_stop = true;
            for (auto& c : m_conns) c->socket.shutdown();
        }
        m_wake.notify_all();
        throw NetError(NetError::Closed, "server died (fault)");
    }
    if (fault == kStallHalfway) {
        std::fprintf(stderr, "serve: fault: stalling a chunk reply for %.0f s\n", m_opt.faults.stallSeconds);
        sleepUnlessStopped(monoSeconds() + m_opt.faults.stallSeconds);
        throw NetError(NetError::Closed, "stalled reply abandoned (fault)");
    }
}

void ChunkServer::readRequests(Connection* c)
{
    const Socket& s = c->socket;
    auto push = [&](Incoming in) {
        std::unique_lock<std::mutex> lock(c->mutex);
        c->cv.wait(lock, [&] { return c->closing || m_stop || c->queue.size() < kMaxPipelined || in.kind != Incoming::Frame; });
        c->queue.push_back(std::move(in));
        c->busy = true;
        c->cv.notify_all();
    };
    // Reads exactly n bytes. Waiting is allowed while a reply is owed; otherwise `limit` seconds
    // after the connection's last activity the peer counts as gone.
    auto readExact = [&](uint8_t* dst, size_t n, double limit) {
        size_t got = 0;
        while (got < n) {
            if (m_stop) throw NetError(NetError::Closed, "server stopping");
            {
                std::lock_guard<std::mutex> lock(c->mutex);
                if (c->closing) throw NetError(NetError::Closed, "connection closing");
            }
            try {
                got += s.recvSome(dst + got, n - got, monoSeconds() + 0.1);
            } catch (const NetError& e) {
                if (e.kind() != NetError::Timeout) throw;
                if (!c->busy && monoSeconds() - c->lastActivity > limit) throw;
            }
        }
    };
    try {
        while (!m_stop) {
            uint8_t h[kFrameHeaderBytes];
            readExact(h, sizeof h, m_opt.idleTimeout);
            Incoming in;
            uint32_t length = 0;
            std::string why;
            if (!parseFrameHeader(h, &in.type, &length, &why)) {
                in.kind = Incoming::Bad;
                in.error = "bad frame: " + why;  // no way to find the next frame in garbage
            } else if (!isRequest(in.type)) {
                in.kind = Incoming::Bad;
                in.error = "bad frame: type " + std::to_string(int(in.type)) + " is not a request";
            } else if (length > kMaxRequestBytes) {
                in.kind = Incoming::Bad;
                in.error = "bad frame: a request of " + std::to_string(length) + " bytes exceeds the limit of " +
                           std::to_string(kMaxRequestBytes);
            }
            if (in.kind == Incoming::Bad) {
                in.arrivedAt = monoSeconds();
                push(std::move(in));
                return;
            }
            in.kind = Incoming::Frame;
            in.payload.resize(length);
            readExact(in.payload.data(), length, m_opt.ioTimeout);
            in.arrivedAt = monoSeconds();
            c->lastActivity = in.arrivedAt;
            push(std::move(in));
        }
    } catch (const NetError&) {
        // timeouts, closed peers, a stopping server
    }
    push(Incoming{});  // End
}

void ChunkServer::serve(Connection* c)
{
    std::map<std::pair<std::string, CodecId>, std::unique_ptr<KvcReader>> skeletons;  // for text replies
    double notBefore = 0;
    auto sendError = [&](const std::string& message) {
        ++m_errors;
        const std::string m = message.substr(0, kMaxErrorBytes);
        sendFrame(c, FrameType::Error, std::vector<uint8_t>(m.begin(), m.end()), kNoFault, nullptr, notBefore);
        settleBusy(c, false);
    };
    try {
        while (!m_stop) {
            Incoming in;
            {
                std::unique_lock<std::mutex> lock(c->mutex);
                c->busy = !c->queue.empty();
                c->cv.wait(lock, [&] { return !c->queue.empty() || m_stop; });
                if (c->queue.empty()) break;
                in = std::move(c->queue.front());
                c->queue.pop_front();
                c->busy = true;
                c->cv.notify_all();
            }
            if (in.kind == Incoming::End) break;
            notBefore = in.arrivedAt + m_opt.rttSeconds;
            if (in.kind == Incoming::Bad) {
                sendError(in.error);
                break;
            }
            ++m_requests;
            Request r;
            std::vector<uint8_t> reply;
            FrameType replyType = FrameType::Error;
            try {
                r = parseRequest(in.type, in.payload.data(), in.payload.size());
                if (r.type == FrameType::SkeletonRequest) {
                    reply = m_store->skeleton(r.context, r.codec);
                    replyType = FrameType::Skeleton;
                } else if (r.type == FrameType::ChunkRequest) {
                    reply = m_store->chunk(r.context, r.codec, int(std::min<uint32_t>(r.chunk, 1u << 30)),
                                           int(std::min<uint32_t>(r.level, 1u << 30)));
                    replyType = FrameType::Chunk;
                } else {
                    auto& sk = skeletons[{r.context, r.codec}];
                    if (!sk) sk = KvcReader::fromSkeleton(m_store->skeleton(r.context, r.codec), "context " + r.context);
                    const CodecParams& cp = sk->params();
                    if (sk->tokens().empty()) throw StoreMiss("the store holds no token ids for context " + r.context);
                    if (r.chunk >= uint32_t(cp.numChunks()))
                        throw StoreMiss("no chunk " + std::to_string(r.chunk) + " in context " + r.context);
                    const int c0 = cp.chunkStart(int(r.chunk)), n = cp.chunkLength(int(r.chunk));
                    reply = encodeTokens(std::vector<int32_t>(sk->tokens().begin() + c0, sk->tokens().begin() + c0 + n));
                    replyType = FrameType::Text;
                }
            } catch (const NetError&) {
                throw;
            } catch (const Error& e) {
                sendError(e.what());
                c->lastActivity = monoSeconds();
                continue;
            }
            int fault = kNoFault;
            if (replyType == FrameType::Chunk) {
                const int index = int(m_chunkReplies++);
                const FaultPlan& f = m_opt.faults;
                if (index == f.corruptChunk && !reply.empty()) reply[reply.size() / 2] ^= 0x5A;
                if (index == f.stallChunk) fault = kStallHalfway;
                if (index == f.dieAtChunk) fault = kDieHalfway;
            }
            sendFrame(c, replyType, reply, fault, nullptr, notBefore);
            settleBusy(c, false);
            c->lastActivity = monoSeconds();
        }
    } catch (const NetError&) {
        // timeouts, closed peers, a stopping server: this connection ends, the others go on
    } catch (const std::exception& e) {
        std::fprintf(stderr, "serve: connection ended: %s\n", e.what());
    }
    settleBusy(c, true);
    {
        std::lock_guard<std::mutex> lock(c->mutex);
        c->closing = true;
        c->cv.notify_all();
    }
    c->socket.shutdown();
    if (c->reader.joinable()) c->reader.join();
    c->done = true;
}

}  // namespace kvscope
