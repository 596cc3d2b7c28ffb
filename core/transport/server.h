// The chunk server: answers protocol.h requests from a ChunkStore over TCP, pacing every byte it
// writes through one LinkPacer (the shaped link lives on the sending side; clients just measure
// arrival times). Binds 127.0.0.1 unless told otherwise.
//
// Pipelining: each connection has a reader thread that takes requests as they arrive (at most
// kMaxPipelined waiting; beyond that the reader stops reading and TCP pushes back) and stamps
// their arrival, and a sender thread that answers them in order. With rttSeconds set, a reply's
// first byte leaves no earlier than its request's arrival + rttSeconds (the path's round trip
// folded into the sending side), so a client that keeps the next request in flight finds the link
// busy without a gap, exactly as on a real path. A connection whose next request is already due
// when a reply ends keeps its busy period open at the pacer, so the capacity of a late wake-up
// at the end of one reply is made up in the next, as a link whose queue never emptied would.
//
// Robustness: requests are at most kMaxRequestBytes; a peer that sends no complete request for
// idleTimeout seconds while nothing is owed to it, or that stops reading for ioTimeout seconds, is
// disconnected; bytes that are not a frame get an error frame and a closed connection; a
// well-framed bad request (unknown context, chunk or level, malformed fields) gets an error frame
// and the connection stays open. Memory per connection is bounded: kMaxPipelined requests of at
// most kMaxRequestBytes and the one reply being sent. Connections share the link through the
// pacer's fair queueing (link.h): a peer that stops reading holds no share while it is stuck.
//
// Faults for the lab (FaultPlan) let tests and demos see a dying server, a corrupt chunk and a
// stalled connection; they count chunk replies over the server's life, from 0.
#pragma once

#include "transport/link.h"
#include "transport/net.h"
#include "transport/protocol.h"
#include "transport/store.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace kvscope {

struct FaultPlan {
    int dieAtChunk = -1;      // that chunk reply stops halfway and the server shuts down for good
    int corruptChunk = -1;    // that chunk reply has one byte flipped (the client's CRC check fails)
    int stallChunk = -1;      // that chunk reply stops halfway and the connection goes silent
    double stallSeconds = 60;
    bool any() const { return dieAtChunk >= 0 || corruptChunk >= 0 || stallChunk >= 0; }
};
// "die:3", "corrupt:1", "stall:2", comma-separated; throws kvscope::Error on bad text.
FaultPlan parseFaults(const std::string& text);

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 0;                 // 0 = any free port (see ChunkServer::port())
    LinkSchedule link = LinkSchedule::constant(125e9);  // effectively unshaped unless set
    double rttSeconds = 0;        // each reply waits one RTT before its first byte
    double idleTimeout = 30;      // seconds without a complete request
    double ioTimeout = 10;        // seconds without progress writing or reading a frame
    int maxConnections = 32;
    FaultPlan faults;
    // Makes the listening socket instead of Socket::listenTcp(host, port) (a KernelLink's
    // namespace, for instance).
    std::function<Socket(const std::string& host, int port)> listen;
};

struct ServerStats {
    uint64_t connections = 0, requests = 0, errorFrames = 0, chunkReplies = 0, bytesSent = 0;
};

constexpr size_t kMaxPipelined = 16;  // requests a connection may have waiting

class ChunkServer {
public:
    // Listens right away (throws kvscope::Error when it cannot); serves once start() is called.
    ChunkServer(std::shared_ptr<ChunkStore> store, const ServerOptions& options);
    ~ChunkServer();  // stop()
    ChunkServer(const ChunkServer&) = delete;
    ChunkServer& operator=(const ChunkServer&) = delete;

    void start();
    // Closes the listener and every connection, joins every thread. Idempotent.
    void stop();
    bool dead() const { return m_dead; }  // stopped, or killed by a fault
    int port() const { return m_port; }
    LinkPacer& pacer() { return m_pacer; }
    ServerStats stats() const;

private:
    struct Incoming {
        enum Kind { Frame, Bad, End } kind = End;
        FrameType type = FrameType::Error;
        std::vector<uint8_t> payload;
        double arrivedAt = 0;
        std::string error;  // Bad: the error frame's message
    };
    struct Connection {
        Socket socket;
        std::thread thread, reader;
        std::atomic<bool> done{false};
        std::mutex mutex;
        std::condition_variable cv;
        std::deque<Incoming> queue;
        bool closing = false;               // the sender is finished: the reader stops
        std::atomic<bool> busy{false};      // a reply is owed or being sent
        std::atomic<double> lastActivity{0};
        int sendId = -1;                    // the pacer's sender id while a busy period is open
    };
    void acceptLoop();
    void serve(Connection* c);
    void readRequests(Connection* c);
    // Writes n bytes through the pacer as connection c's sender (opening its busy period when
    // none is open); throws NetError when the peer stops reading, and then ends the busy period.
    void sendPaced(Connection* c, const uint8_t* data, size_t n);
    void sendFrame(Connection* c, FrameType type, const std::vector<uint8_t>& payload, int fault, size_t* sent,
                   double notBefore);
    // Ends c's busy period unless its next request is already due (queued, its RTT elapsed): a
    // connection with replies back to back keeps the link backlogged, so a reply that ended late
    // (the sending thread woke late) is made up in the next one, as a link whose queue never
    // emptied would.
    void settleBusy(Connection* c, bool force);
    bool sleepUnlessStopped(double until);
    void reap(bool all);

    std::shared_ptr<ChunkStore> m_store;
    ServerOptions m_opt;
    LinkPacer m_pacer;
    Socket m_listener;
    int m_port = 0;
    std::thread m_acceptThread;
    std::atomic<bool> m_stop{false};
    std::atomic<bool> m_dead{false};
    std::mutex m_mutex;  // m_conns
    std::condition_variable m_wake;
    std::list<std::unique_ptr<Connection>> m_conns;
    std::atomic<uint64_t> m_connections{0}, m_requests{0}, m_errors{0}, m_chunkReplies{0};
};

}  // namespace kvscope
