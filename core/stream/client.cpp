#include "stream/client.h"

#include "common/error.h"
#include "stream/link.h"

#include <algorithm>

namespace kvscope {

ChunkClient::ChunkClient(std::string host, int port, const ClientOptions& options)
    : m_host(std::move(host)), m_port(port), m_opt(options)
{
}

void ChunkClient::connect()
{
    if (!m_socket.valid()) m_socket = Socket::connectTcp(m_host, m_port, m_opt.connectTimeout);
}

double ChunkClient::send(const Request& r)
{
    connect();
    try {
        const std::vector<uint8_t> frame = encodeRequest(r);
        const double sentAt = monoSeconds();
        m_socket.sendAll(frame.data(), frame.size(), sentAt + m_opt.stallTimeout);
        m_pending.push_back({r.type, sentAt});
        return sentAt;
    } catch (...) {
        close();
        throw;
    }
}

Reply ChunkClient::request(const Request& r, uint64_t maxPayload, double deadline, ArrivalLog* log)
{
    KVSCOPE_ASSERT(m_pending.empty());
    send(r);
    return receive(maxPayload, deadline, log);
}

Reply ChunkClient::receive(uint64_t maxPayload, double deadline, ArrivalLog* log)
{
    KVSCOPE_ASSERT(!m_pending.empty());
    const Pending req = m_pending.front();
    Reply rep;
    rep.sentAt = req.sentAt;
    try {
        // Reads until `n` bytes are in `dst`: each read may wait stallTimeout, never past the deadline.
        uint64_t total = 0;
        auto readInto = [&](uint8_t* dst, size_t n) {
            size_t got = 0;
            while (got < n) {
                const double limit = std::min(deadline, monoSeconds() + m_opt.stallTimeout);
                const size_t k = m_socket.recvSome(dst + got, n - got, limit);
                const double now = monoSeconds();
                if (total == 0) rep.firstByteAt = now;
                got += k;
                total += k;
                rep.arrivedAt = now;
                if (log) log->emplace_back(now, total);
            }
        };
        uint8_t h[kFrameHeaderBytes];
        readInto(h, sizeof h);
        FrameType type;
        uint32_t length = 0;
        std::string why;
        if (!parseFrameHeader(h, &type, &length, &why)) throw Error("chunk server: " + why);
        if (type != FrameType::Error && type != FrameType(uint8_t(req.type) | 0x80))
            throw Error("chunk server: reply of type " + std::to_string(int(type)) + " to a request of type " +
                        std::to_string(int(req.type)));
        const uint64_t limit = type == FrameType::Error ? kMaxErrorBytes : maxPayload;
        if (length > limit)
            throw Error("chunk server: reply of " + std::to_string(length) + " bytes exceeds the expected " +
                        std::to_string(limit));
        rep.type = type;
        // Grow as bytes come (reserve does not touch the pages): zero-filling a 64 MB buffer up
        // front would stall reading for tens of milliseconds while the link keeps delivering.
        rep.payload.reserve(length);
        while (rep.payload.size() < length) {
            const size_t have = rep.payload.size();
            rep.payload.resize(std::min<size_t>(length, have + (size_t(1) << 20)));
            readInto(rep.payload.data() + have, rep.payload.size() - have);
        }
        rep.wireBytes = total;
        m_pending.pop_front();
        return rep;
    } catch (...) {
        close();  // a half-read reply leaves the stream unusable
        throw;
    }
}

}  // namespace kvscope
