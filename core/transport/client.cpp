#include "transport/client.h"

#include "common/error.h"
#include "transport/link.h"

#include <algorithm>
#include <limits>

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
    Reply rep;
    receivePart(rep, maxPayload, deadline, std::numeric_limits<double>::infinity(), log);
    return rep;
}

bool ChunkClient::receivePart(Reply& out, uint64_t maxPayload, double deadline, double yieldAt, ArrivalLog* log)
{
    KVSCOPE_ASSERT(!m_pending.empty());
    const Pending req = m_pending.front();
    Partial& p = m_part;
    if (!p.active) {
        p = Partial{};
        p.active = true;
        p.rep.sentAt = req.sentAt;
        p.progressAt = monoSeconds();
    }
    try {
        // Reads until `n` bytes are in `dst` (`got` of them already): each wait ends at the stall
        // limit or the deadline (errors) or at yieldAt (false: come back later).
        auto readInto = [&](uint8_t* dst, size_t n, size_t& got) {
            while (got < n) {
                if (monoSeconds() >= yieldAt) return false;
                const double limit = std::min(deadline, p.progressAt + m_opt.stallTimeout);
                if (yieldAt < limit && !m_socket.waitReadable(yieldAt)) return false;
                const size_t k = m_socket.recvSome(dst + got, n - got, limit);
                const double now = monoSeconds();
                if (p.total == 0) p.rep.firstByteAt = now;
                got += k;
                p.total += k;
                p.rep.arrivedAt = now;
                p.progressAt = now;
                if (log) log->emplace_back(now, p.total);
            }
            return true;
        };
        if (!p.headerDone) {
            if (!readInto(p.header, sizeof p.header, p.headerGot)) return false;
            FrameType type;
            std::string why;
            if (!parseFrameHeader(p.header, &type, &p.length, &why)) throw Error("chunk server: " + why);
            if (type != FrameType::Error && type != FrameType(uint8_t(req.type) | 0x80))
                throw Error("chunk server: reply of type " + std::to_string(int(type)) + " to a request of type " +
                            std::to_string(int(req.type)));
            const uint64_t limit = type == FrameType::Error ? kMaxErrorBytes : maxPayload;
            if (p.length > limit)
                throw Error("chunk server: reply of " + std::to_string(p.length) + " bytes exceeds the expected " +
                            std::to_string(limit));
            p.rep.type = type;
            // Grow as bytes come (reserve does not touch the pages): zero-filling a 64 MB buffer up
            // front would stall reading for tens of milliseconds while the link keeps delivering.
            p.rep.payload.reserve(p.length);
            p.headerDone = true;
        }
        while (p.payloadGot < p.length) {
            if (p.rep.payload.size() == p.payloadGot)
                p.rep.payload.resize(std::min<size_t>(p.length, p.payloadGot + (size_t(1) << 20)));
            if (!readInto(p.rep.payload.data(), p.rep.payload.size(), p.payloadGot)) return false;
        }
        p.rep.wireBytes = p.total;
        out = std::move(p.rep);
        p = Partial{};
        m_pending.pop_front();
        return true;
    } catch (...) {
        close();  // a half-read reply leaves the stream unusable
        throw;
    }
}

}  // namespace kvscope
