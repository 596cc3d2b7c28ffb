// The chunk client: one TCP connection to a ChunkServer, with the arrival time of every reply
// measured on the monotonic clock. Requests may be pipelined: send() several, then receive() their
// replies in the same order (the server answers each connection's requests in order), so the link
// carries the next reply while the caller is still busy with the previous one. Nothing blocks past a deadline: a reply
// that makes no progress for stallTimeout seconds, or misses the caller's deadline, fails with
// NetError(Timeout); a reply larger than the caller allows fails before it is read.
#pragma once

#include "transport/net.h"
#include "transport/protocol.h"

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

struct ClientOptions {
    double connectTimeout = 2.0;
    double stallTimeout = 2.0;  // seconds without a single byte of a reply in progress
};

struct Reply {
    FrameType type = FrameType::Error;
    std::vector<uint8_t> payload;
    double sentAt = 0;       // request written (monotonic seconds)
    double firstByteAt = 0;  // first byte of the reply read
    double arrivedAt = 0;    // last byte read
    uint64_t wireBytes = 0;  // header + payload
};

// (monotonic time, bytes of the reply read so far) after every read: the pacing tests' raw data.
using ArrivalLog = std::vector<std::pair<double, uint64_t>>;

class ChunkClient {
public:
    ChunkClient(std::string host, int port, const ClientOptions& options = {});

    // Connects when not connected. Throws NetError.
    void connect();
    bool connected() const { return m_socket.valid(); }
    // Closes the connection; requests still pending are lost.
    void close()
    {
        m_socket.close();
        m_pending.clear();
        m_part = Partial{};
    }

    // Pipelining: send() writes a request (connecting when needed) and returns its send time;
    // receive() reads the reply to the oldest request still pending. Both throw like request(),
    // and any failure closes the connection and forgets every pending request.
    double send(const Request& r);
    Reply receive(uint64_t maxPayload, double deadline, ArrivalLog* log = nullptr);
    size_t pending() const { return m_pending.size(); }
    // receive() in installments: reads the oldest pending reply until it is whole (true, in `out`)
    // or until yieldAt (monotonic) comes first (false; what was read is kept, and the next call
    // goes on from there). Errors, the stall timeout and the deadline as receive(); the stall clock
    // runs from the last byte read (or the first call), time spent away from the call included.
    bool receivePart(Reply& out, uint64_t maxPayload, double deadline, double yieldAt, ArrivalLog* log = nullptr);
    bool receiving() const { return m_part.active; }  // a reply is partly read
    uint64_t partialBytes() const { return m_part.active ? m_part.total : 0; }  // of the reply partly read

    // Sends the request and reads the reply before `deadline` (monotonic seconds); nothing may be
    // pending. A reply whose
    // payload exceeds maxPayload fails without being read. Error frames come back as replies of
    // type FrameType::Error (the connection stays usable). Throws NetError (timeouts, closed
    // connection) or kvscope::Error (a frame that breaks the protocol); either closes the connection.
    Reply request(const Request& r, uint64_t maxPayload, double deadline, ArrivalLog* log = nullptr);

private:
    std::string m_host;
    int m_port;
    ClientOptions m_opt;
    Socket m_socket;
    struct Pending {
        FrameType type;
        double sentAt;
    };
    std::deque<Pending> m_pending;
    // The reply being read (receivePart).
    struct Partial {
        bool active = false;
        Reply rep;
        uint8_t header[kFrameHeaderBytes] = {};
        size_t headerGot = 0;
        bool headerDone = false;
        uint32_t length = 0;
        size_t payloadGot = 0;
        uint64_t total = 0;
        double progressAt = 0;  // last byte read, or the first call
    };
    Partial m_part;
};

}  // namespace kvscope
