// A real shaped link for the streaming lab: a veth pair between this process's network namespace
// and one made for the run, shaped by Linux tc, so the kernel's TCP (slow start, congestion
// control, queueing, loss recovery) carries every byte.
//
// READ ME FIRST
//  - Topology: namespace "kvscope-PID-N" holds veth end "kvsPIDbN" (host 2 of a /30 block of
//    10.213.0.0/16); this namespace holds "kvsPIDaN" (host 1). The block is one no interface here
//    has an address in (another process's link, or a veth end the kernel has not freed yet). The
//    chunk server listens inside the namespace (listen() creates the socket from a thread that
//    entered it; the socket stays there), the client connects from here to serverAddress(), so
//    replies leave through kvsPIDbN. That end sends one TCP segment per packet (gso_max_segs 1):
//    tbf cannot send a queued packet larger than its current bucket, and the bucket follows the
//    rate, so a GSO packet queued at a fast tick would stall tbf at every slower one.
//  - Shaping on kvsNb's egress (the reply direction): netem (delay = the RTT, optional random
//    loss) as the root qdisc, tbf (rate, burst, 1 s of queue at the mean rate) as its child. Requests and ACKs
//    travel back unshaped and undelayed, so the path's round trip is the netem delay. A kernel
//    without sch_netem gets tbf alone as the root qdisc; the RTT is then added by the chunk server
//    (kernelDelay() false) and loss is refused.
//  - Following a schedule: once start() is called, a thread sets tbf's rate every tick (50 ms) to
//    the schedule's mean rate over the coming tick (capacityBytes(t, t + tick) / tick) with
//    `tc qdisc change`, written to one long-lived `tc -batch` process (no fork per tick). The
//    capacity of every tick is the schedule's; the shape within a tick is
//    tbf's. A tick with no capacity (a trace's gap) gets a floor of 8 kbit/s (tbf needs a rate).
//    Two tbf properties are compensated: every change refills the bucket and drops the tokens
//    the head frame had accrued, which gives a backlogged tbf between bucket - 1 frame and the
//    whole bucket free per tick, depending on when its next dequeue comes (the timer armed for
//    the head frame, or an enqueue: how the sender's TCP feeds the queue). The rate is set lower
//    by bucket - 1 frame (what TSQ-limited senders get, as measured), and a counters loop pays
//    whatever else: every tick reads tbf's sent bytes and
//    backlog through rtnetlink (a NETLINK_ROUTE socket made inside the namespace), and while the
//    queue stayed non-empty the difference between what the schedule gave (x frame bytes per
//    payload byte) and what tbf sent is carried, half per tick, by the next ticks (bounded by
//    2 frames + 5% of a tick; none in a tick without capacity). Paying the whole bucket, open
//    loop, left a TSQ-limited sender at 4 Mbit/s 6% short (one frame per 50 ms tick). An empty
//    queue resets it: capacity the sender left unused is lost. And a change does not make tbf
//    look at its queue again (a frame that found no tokens at a gap's crawl waits for a timer
//    armed at the crawl's rate, up to 1.5 s): after every rising tick a 1-byte UDP datagram
//    ("kick") goes out through the same qdisc, whose enqueue makes it dequeue at the new rate.
//  - Congestion control: the server's sockets use cubic by default (TCP_CONGESTION on the
//    listening socket). Many systems default to BBR, which paces at the largest delivery rate seen over
//    the last ~10 round trips: with the sub-millisecond RTT of a veth pair that window is ~10 ms,
//    so every 50 ms low tick of a cellular trace resets the estimate, and BBR climbs back only by
//    its 1.25x probing steps (on the T-Mobile trace, before the tbf fixes above: BBR 0.85,
//    0.35, 0.41 of capacity, cubic 0.99, 0.59, 0.99). Cubic fills tbf's queue and keeps it full.
//  - Needs root or CAP_NET_ADMIN and the ip and tc tools (iproute2): available() says which is
//    missing, and callers fall back to the in-process pacer.
//  - Clean-up: the destructor stops the thread and deletes the namespace (which deletes both veth
//    ends). Creating a link first deletes namespaces "kvscope-PID-*" whose process is gone (a run
//    killed with SIGKILL), and cleanupOnSignal() makes SIGINT/SIGTERM delete the live ones.
#pragma once

#include "transport/link.h"
#include "transport/net.h"

#include <netinet/in.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace kvscope {

struct KernelLinkOptions {
    LinkSchedule schedule;
    double rttSeconds = 0;
    double lossPercent = 0;   // random loss on the reply direction, 0..100
    double tickSeconds = 0.05;
    // TCP congestion control of the server's (sending) sockets: "" keeps the namespace's default.
    // Set with TCP_CONGESTION on the listening socket; accepted sockets inherit it.
    std::string congestion = "cubic";
    // The schedule counts payload bytes (as the in-process pacer does); tbf charges every
    // Ethernet frame in full. A full TCP segment on a 1500-byte MTU carries 1448 payload bytes
    // (20 B IP + 20 B TCP + 12 B timestamp option) in a 1514-byte frame, so tbf's rate is the
    // schedule's times this factor: a backlogged sender then gets the schedule's payload rate.
    // 1 shapes the frames to the schedule instead (payload then tops out at 1448/1514 of it).
    double frameBytesPerPayloadByte = 1514.0 / 1448.0;
};

class KernelLink {
public:
    // True when this process may create namespaces and shape links; otherwise false and why.
    static bool available(std::string* why);
    // Creates the namespace, the veth pair and the qdiscs; throws kvscope::Error naming the
    // command that failed (everything made so far is removed).
    explicit KernelLink(const KernelLinkOptions& options);
    ~KernelLink();
    KernelLink(const KernelLink&) = delete;
    KernelLink& operator=(const KernelLink&) = delete;

    const std::string& netns() const { return m_netns; }
    const std::string& serverAddress() const { return m_serverAddr; }  // inside the namespace
    const std::string& clientAddress() const { return m_clientAddr; }
    // A listening socket inside the namespace (port 0 = any free port).
    Socket listen(const std::string& host, int port) const;
    // Starts following the schedule from link time offsetSeconds, now (restarts when running).
    void start(double offsetSeconds);
    void stopShaping();
    int rateChanges() const { return m_changes; }
    int kicks() const { return m_kicks; }  // rate rises after which the queue was woken
    int correctedTicks() const { return m_corrected; }  // ticks the counters loop adjusted
    bool countersLoop() const { return m_nlFd >= 0; }   // tbf's counters readable: closed loop
    // False when the kernel lacks the netem qdisc: then tbf alone is the root qdisc and the
    // caller must add the RTT itself (ChunkServer's rttSeconds); loss is unavailable.
    bool kernelDelay() const { return m_netem; }
    std::string describe() const;
    const std::string& congestion() const { return m_congestion; }  // in force in the namespace

    // SIGINT and SIGTERM delete every live KernelLink's namespace, then exit(130/143).
    static void cleanupOnSignal();

private:
    // bytesPerSecond: the schedule's payload rate for the coming tick; extraFrameBytes: what the
    // tick should carry beyond it (the counters loop's correction, frame bytes).
    void setRate(double bytesPerSecond, bool add, double extraFrameBytes = 0);
    void openStats();
    // tbf's counters through rtnetlink: frame bytes sent since it was created and bytes queued.
    bool readStats(uint64_t* bytes, uint32_t* backlog);
    void openBatch();
    void closeBatch();
    void shaperLoop(double epoch);
    void kick();
    void destroy();
    // Runs fn on a thread that entered the namespace; returns its error text ("" when none).
    std::string inNamespace(const std::function<void()>& fn) const;

    KernelLinkOptions m_opt;
    std::string m_congestion;
    std::string m_netns, m_hostDev, m_nsDev, m_serverAddr, m_clientAddr;
    std::thread m_thread;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    bool m_stop = false;
    std::atomic<int> m_changes{0};
    bool m_created = false;
    bool m_netem = true;
    int m_batchFd = -1;
    int m_kickFd = -1;
    sockaddr_in m_kickAddr{};
    std::atomic<int> m_kicks{0};
    int m_batchPid = -1;
    int m_nlFd = -1;  // NETLINK_ROUTE socket inside the namespace (tbf's counters); -1: open loop
    int m_nsIfindex = 0;
    uint32_t m_nlSeq = 0;
    std::atomic<int> m_corrected{0};  // ticks whose rate the counters loop adjusted
};

}  // namespace kvscope
