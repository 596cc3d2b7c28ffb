#include "transport/server.h"

#include "transport/protocol.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

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
    m_wakeFd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m_wakeFd < 0) throw Error(std::string("chunk server: eventfd: ") + std::strerror(errno));
}

ChunkServer::~ChunkServer()
{
    stop();
    ::close(m_wakeFd);
}

void ChunkServer::start()
{
    if (m_loopThread.joinable() || m_stop) return;
    m_loopThread = std::thread([this] { eventLoop(); });
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
    wakeLoop();
    if (m_loopThread.joinable()) m_loopThread.join();
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
    s.evicted = m_evicted;
    s.refused = m_refused;
    s.frameTimeouts = m_frameTimeouts;
    s.idleTimeouts = m_idleTimeouts;
    s.open = m_open;
    return s;
}

void ChunkServer::wakeLoop()
{
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(m_wakeFd, &one, sizeof one);
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
        m_open = m_conns.size();
    }
    for (auto& c : finished) {
        c->socket.shutdown();
        if (c->sender.joinable()) c->sender.join();
    }
}

bool ChunkServer::owes(Connection* c)
{
    std::lock_guard<std::mutex> lock(c->mutex);
    return c->senderRunning || !c->queue.empty();
}

void ChunkServer::push(Connection* c, Incoming in)
{
    bool start = false;
    {
        std::lock_guard<std::mutex> lock(c->mutex);
        if (c->done) return;  // its sender failed meanwhile: nobody will read a reply
        c->queue.push_back(std::move(in));
        start = !c->senderRunning;
        c->senderRunning = true;
    }
    if (!start) return;
    if (c->sender.joinable()) c->sender.join();  // the last one has left serve() (senderRunning was false)
    c->sender = std::thread([this, c] { serve(c); });
}

void ChunkServer::endOfInput(Connection* c)
{
    c->reading = false;
    std::lock_guard<std::mutex> lock(c->mutex);
    if (!c->senderRunning && c->queue.empty()) {
        c->done = true;
        return;
    }
    c->queue.push_back(Incoming{});  // End: the sender finishes what is owed, then closes
}

void ChunkServer::closeConnection(Connection* c)
{
    c->reading = false;
    c->socket.shutdown();
    std::lock_guard<std::mutex> lock(c->mutex);
    if (!c->senderRunning) c->done = true;  // else the sender fails on the shut socket and finishes
}

void ChunkServer::eventLoop()
{
    std::vector<pollfd> fds;
    std::vector<Connection*> polled;
    while (!m_stop) {
        reap(false);
        const double now = monoSeconds();
        fds.clear();
        polled.clear();
        fds.push_back({m_wakeFd, POLLIN, 0});
        const bool accepting = now >= m_acceptPausedUntil;
        if (accepting) fds.push_back({m_listener.fd(), POLLIN, 0});
        for (auto& up : m_conns) {
            Connection* c = up.get();
            if (!c->reading || c->done) continue;
            {
                std::lock_guard<std::mutex> lock(c->mutex);
                if (c->queue.size() >= kMaxPipelined) continue;  // TCP pushes back until the sender takes one
            }
            fds.push_back({c->socket.fd(), POLLIN, 0});
            polled.push_back(c);
        }
        // 50 ms: the granularity of the frame and idle deadlines.
        const int r = ::poll(fds.data(), nfds_t(fds.size()), 50);
        if (r < 0 && errno != EINTR) {
            std::fprintf(stderr, "serve: poll: %s\n", std::strerror(errno));
            break;
        }
        if (m_stop) break;
        const double t = monoSeconds();
        if (r > 0) {
            if (fds[0].revents) {
                uint64_t v;
                [[maybe_unused]] const ssize_t n = ::read(m_wakeFd, &v, sizeof v);
            }
            const size_t first = accepting ? 2 : 1;
            for (size_t i = first; i < fds.size(); ++i)
                if (fds[i].revents) readFrom(polled[i - first], t);
            if (accepting && fds[1].revents) acceptAll(t);
        }
        enforceDeadlines(t);
    }
    m_listener.close();  // a dead server refuses new connections
}

void ChunkServer::acceptAll(double now)
{
    // The longest-idle live connection that owes nothing, or null.
    auto idlest = [&]() -> Connection* {
        Connection* best = nullptr;
        for (auto& up : m_conns) {
            Connection* c = up.get();
            if (c->done || !c->reading || owes(c)) continue;
            if (!best || c->lastActivity < best->lastActivity) best = c;
        }
        return best;
    };
    auto live = [&] {
        int n = 0;
        for (auto& up : m_conns) n += !up->done;
        return n;
    };
    int open = live();
    for (;;) {
        Socket s = m_listener.acceptNow();
        if (!s.valid()) {
            if (errno == EMFILE || errno == ENFILE) {
                // Out of descriptors: free one for the next round, or wait when all are owed replies.
                if (Connection* victim = idlest()) {
                    closeConnection(victim);
                    ++m_evicted;
                } else {
                    m_acceptPausedUntil = now + 0.1;
                }
            }
            return;
        }
        if (open >= m_opt.maxConnections) {
            Connection* victim = idlest();
            if (!victim) {
                ++m_refused;
                continue;  // closed by Socket's destructor
            }
            closeConnection(victim);
            ++m_evicted;
            --open;
        }
        ++m_connections;
        auto c = std::make_unique<Connection>();
        c->socket = std::move(s);
        c->lastActivity = now;
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_conns.push_back(std::move(c));
            m_open = m_conns.size();
        }
        ++open;
    }
}

void ChunkServer::readFrom(Connection* c, double now)
{
    for (;;) {
        uint8_t* dst;
        size_t want;
        if (!c->headerDone) {
            dst = c->header + c->headerGot;
            want = kFrameHeaderBytes - c->headerGot;
        } else {
            dst = c->frame.payload.data() + c->payloadGot;
            want = c->frame.payload.size() - c->payloadGot;
        }
        ssize_t r = 0;
        if (want > 0) {
            r = ::recv(c->socket.fd(), dst, want, MSG_DONTWAIT);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) {  // end of stream, or a reset
                endOfInput(c);
                return;
            }
            if (!c->headerDone && c->headerGot == 0) c->frameStartedAt = now;
            (c->headerDone ? c->payloadGot : c->headerGot) += size_t(r);
        }
        if (!c->headerDone) {
            if (c->headerGot < kFrameHeaderBytes) continue;
            Incoming& in = c->frame;
            uint32_t length = 0;
            std::string why;
            in.kind = Incoming::Frame;
            if (!parseFrameHeader(c->header, &in.type, &length, &why)) {
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
                in.arrivedAt = now;
                c->reading = false;
                push(c, std::move(in));
                return;
            }
            in.payload.assign(length, 0);
            c->headerDone = true;
        }
        if (c->payloadGot < c->frame.payload.size()) continue;
        // A whole request.
        Incoming in = std::move(c->frame);
        c->frame = Incoming{};
        c->headerGot = c->payloadGot = 0;
        c->headerDone = false;
        in.arrivedAt = monoSeconds();
        c->lastActivity = in.arrivedAt;
        push(c, std::move(in));
        std::lock_guard<std::mutex> lock(c->mutex);
        if (c->queue.size() >= kMaxPipelined) return;
    }
}

void ChunkServer::enforceDeadlines(double now)
{
    for (auto& up : m_conns) {
        Connection* c = up.get();
        if (c->done || !c->reading) continue;
        const bool partial = c->headerGot > 0 || c->headerDone;
        if (partial && now - c->frameStartedAt > m_opt.frameTimeout) {
            ++m_frameTimeouts;
            if (!owes(c)) {
                // Best effort, unpaced and without waiting: a peer that stalls a frame is told why.
                ++m_errors;
                const size_t got = c->headerDone ? kFrameHeaderBytes + c->payloadGot : c->headerGot;
                const size_t of = c->headerDone ? kFrameHeaderBytes + c->frame.payload.size() : kFrameHeaderBytes;
                char msg[160];
                std::snprintf(msg, sizeof msg, "incomplete frame: %zu of %zu bytes within the frame timeout of %g s", got,
                              of, m_opt.frameTimeout);
                std::vector<uint8_t> f = frameHeader(FrameType::Error, uint32_t(std::strlen(msg)));
                f.insert(f.end(), msg, msg + std::strlen(msg));
                [[maybe_unused]] const ssize_t w = ::send(c->socket.fd(), f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
            }
            closeConnection(c);
            continue;
        }
        if (now - c->lastActivity > m_opt.idleTimeout && !owes(c)) {
            ++m_idleTimeouts;
            closeConnection(c);
        }
    }
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
        wakeLoop();
        throw NetError(NetError::Closed, "server died (fault)");
    }
    if (fault == kStallHalfway) {
        std::fprintf(stderr, "serve: fault: stalling a chunk reply for %.0f s\n", m_opt.faults.stallSeconds);
        sleepUnlessStopped(monoSeconds() + m_opt.faults.stallSeconds);
        throw NetError(NetError::Closed, "stalled reply abandoned (fault)");
    }
}

void ChunkServer::serve(Connection* c)
{
    try {
        for (;;) {
            Incoming in;
            {
                std::unique_lock<std::mutex> lock(c->mutex);
                if (c->queue.empty()) {
                    lock.unlock();
                    settleBusy(c, true);  // nothing due: the busy period ends
                    lock.lock();
                    if (c->queue.empty()) {
                        c->senderRunning = false;  // push() starts another for the next request
                        return;
                    }
                }
                const bool wasFull = c->queue.size() >= kMaxPipelined;
                in = std::move(c->queue.front());
                c->queue.pop_front();
                if (wasFull) wakeLoop();  // room again: the event thread reads this peer again
            }
            if (m_stop || in.kind == Incoming::End) break;
            answer(c, in);
            if (in.kind == Incoming::Bad) break;
        }
    } catch (const NetError&) {
        // timeouts, closed peers, a stopping server: this connection ends, the others go on
    } catch (const std::exception& e) {
        std::fprintf(stderr, "serve: connection ended: %s\n", e.what());
    }
    settleBusy(c, true);
    c->socket.shutdown();
    {
        std::lock_guard<std::mutex> lock(c->mutex);
        c->queue.clear();
        c->senderRunning = false;
        c->done = true;
    }
    wakeLoop();
}

void ChunkServer::answer(Connection* c, Incoming& in)
{
    const double notBefore = in.arrivedAt + m_opt.rttSeconds;
    auto sendError = [&](const std::string& message) {
        ++m_errors;
        const std::string m = message.substr(0, kMaxErrorBytes);
        sendFrame(c, FrameType::Error, std::vector<uint8_t>(m.begin(), m.end()), kNoFault, nullptr, notBefore);
        settleBusy(c, false);
        c->lastActivity = monoSeconds();
    };
    if (in.kind == Incoming::Bad) {
        sendError(in.error);
        return;
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
            auto& sk = c->skeletons[{r.context, r.codec}];
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
        return;
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

}  // namespace kvscope
