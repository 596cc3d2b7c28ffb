// The chunk server: answers protocol.h requests from a ChunkStore over TCP, pacing every byte it
// writes through one LinkPacer (the shaped link lives on the sending side; clients just measure
// arrival times). Binds 127.0.0.1 unless told otherwise.
//
// Connections: one event thread polls the listener and every connection (poll(2)), reads
// requests as their bytes arrive and enforces every deadline; a connection costs a thread only
// while a reply is owed to it (its sender, started for the first request waiting and gone when
// none is left). So idle and half-open peers cost a socket and a few bytes each, and the limit
// (maxConnections, default 512) can be sized for real use. When the table is full, the newcomer
// takes the place of the longest-idle connection that owes nothing (no request waiting, no reply
// being sent; idle since its last complete request, reply or connect), and is refused only when
// every connection is owed a reply.
//
// Pipelining: at most kMaxPipelined requests wait per connection (beyond that the event thread
// stops reading it and TCP pushes back); they are stamped on arrival and answered in order. With
// rttSeconds set, a reply's first byte leaves no earlier than its request's arrival + rttSeconds
// (the path's round trip folded into the sending side), so a client that keeps the next request
// in flight finds the link busy without a gap, exactly as on a real path. A connection whose next
// request is already due when a reply ends keeps its busy period open at the pacer, so the
// capacity of a late wake-up at the end of one reply is made up in the next, as a link whose
// queue never emptied would.
//
// Robustness: requests are at most kMaxRequestBytes; a frame whose first byte arrived must be
// whole within frameTimeout seconds (slowloris: an error frame when nothing else is owed, then the
// connection is closed); a peer that sends no complete request for idleTimeout seconds while
// nothing is owed to it, or that stops reading for ioTimeout seconds, is disconnected; bytes that
// are not a frame get an error frame and a closed connection; a well-framed bad request (unknown
// context, chunk or level, malformed fields) gets an error frame and the connection stays open.
// Memory per connection is bounded: kMaxPipelined requests of at most kMaxRequestBytes and the one
// reply being sent. Connections share the link through the pacer's fair queueing (link.h): a peer
// that stops reading holds no share while it is stuck.
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
#include <map>
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
    double idleTimeout = 30;      // seconds without a complete request while nothing is owed
    double frameTimeout = 5;      // seconds from a request frame's first byte to its last
    double ioTimeout = 10;        // seconds without progress writing a reply
    int maxConnections = 512;     // open connections; a newcomer replaces the longest-idle one
    FaultPlan faults;
    // Makes the listening socket instead of Socket::listenTcp(host, port) (a KernelLink's
    // namespace, for instance).
    std::function<Socket(const std::string& host, int port)> listen;
};

struct ServerStats {
    uint64_t connections = 0, requests = 0, errorFrames = 0, chunkReplies = 0, bytesSent = 0;
    uint64_t evicted = 0;        // idle connections closed to admit a newcomer
    uint64_t refused = 0;        // newcomers closed because every connection was owed a reply
    uint64_t frameTimeouts = 0;  // connections closed for a frame not completed within frameTimeout
    uint64_t idleTimeouts = 0;   // connections closed after idleTimeout without a request
    uint64_t open = 0;           // connections open now
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
        std::thread sender;  // runs serve() while requests wait or a reply is being sent
        std::atomic<bool> done{false};  // finished: the event thread closes and removes it
        std::atomic<double> lastActivity{0};  // connect, last complete request, last reply sent
        std::mutex mutex;                     // queue, senderRunning
        std::deque<Incoming> queue;
        bool senderRunning = false;
        // The event thread's reading state: the frame being read.
        bool reading = true;
        uint8_t header[kFrameHeaderBytes] = {};
        size_t headerGot = 0, payloadGot = 0;
        bool headerDone = false;
        Incoming frame;
        double frameStartedAt = 0;
        // The sender's state.
        int sendId = -1;  // the pacer's sender id while a busy period is open
        std::map<std::pair<std::string, CodecId>, std::unique_ptr<KvcReader>> skeletons;  // for text replies
    };
    void eventLoop();
    void acceptAll(double now);
    void readFrom(Connection* c, double now);
    void enforceDeadlines(double now);
    // Queues a request (or Bad/End) and starts c's sender when none runs.
    void push(Connection* c, Incoming in);
    // The peer finished sending (EOF or a reset): done now when nothing is owed, else after the sender.
    void endOfInput(Connection* c);
    // Stops reading c and shuts its socket down; done now when no sender runs (it finishes otherwise).
    void closeConnection(Connection* c);
    bool owes(Connection* c);
    void wakeLoop();
    void serve(Connection* c);
    void answer(Connection* c, Incoming& in);
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
    // Joins and removes finished connections (all of them when `all`).
    void reap(bool all);

    std::shared_ptr<ChunkStore> m_store;
    ServerOptions m_opt;
    LinkPacer m_pacer;
    Socket m_listener;
    int m_port = 0;
    std::thread m_loopThread;
    int m_wakeFd = -1;  // eventfd: senders and stop() wake the event thread
    std::atomic<bool> m_stop{false};
    std::atomic<bool> m_dead{false};
    std::mutex m_mutex;  // m_conns (changed by the event thread only; others iterate under it)
    std::condition_variable m_wake;
    std::list<std::unique_ptr<Connection>> m_conns;
    double m_acceptPausedUntil = 0;  // out of file descriptors with nobody to evict: accept later
    std::atomic<uint64_t> m_connections{0}, m_requests{0}, m_errors{0}, m_chunkReplies{0};
    std::atomic<uint64_t> m_evicted{0}, m_refused{0}, m_frameTimeouts{0}, m_idleTimeouts{0}, m_open{0};
};

}  // namespace kvscope
