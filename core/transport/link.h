// Link shaping for the streaming lab: how many bytes a throttled link can carry between two
// instants (a pure function of its bandwidth schedule), and a pacer that makes a real sender obey it.
//
// READ ME FIRST
//  - Time is "link time" in seconds: 0 is when the link starts (LinkPacer::reset). Schedules are
//    defined on link time only; the pacer maps the monotonic clock onto it.
//  - Capacity counts the interval (t0, t1]: a trace opportunity at exactly t0 belongs to the
//    interval before. So capacityBytes(a, b) + capacityBytes(b, c) == capacityBytes(a, c).
//  - Mahimahi traces (see ../shared/traces/README.md): a line "t" is one packet opportunity at t ms;
//    the trace loops with period = its last timestamp. We count 1500 bytes per opportunity (the
//    documented figure; Mahimahi's code uses 1504, +0.27%), times the scale factor. Bytes are
//    fluid: an opportunity carries up to 1500 bytes of the byte stream, never a partial loss.
//  - Unused capacity is lost, as on a real link: the pacer banks no credit across idle periods.
//    While the sender is backlogged it gets exactly the schedule's capacity, to the byte.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kvscope {

// Seconds on the monotonic clock (std::chrono::steady_clock), the one clock of core/stream.
double monoSeconds();

// "50Mbit", "1Gbit", "800kbit", "12.5Mbit/s", "2mbps" (decimal prefixes, bits) -> bytes per second.
// Throws kvscope::Error "what: 'text' is not a rate like 50Mbit, 1Gbit or 800kbit" otherwise,
// and for zero or negative rates.
double parseRate(const std::string& text, const std::string& what = "rate");
// 6.25e6 -> "50Mbit"
std::string formatRate(double bytesPerSecond);

struct RateStep {
    double seconds = 0;         // how long the step lasts; the last step lasts forever
    double bytesPerSecond = 0;  // > 0
};

class LinkSchedule {
public:
    static constexpr double kTraceBytesPerOpportunity = 1500.0;

    LinkSchedule() = default;  // a constant 0: useless until assigned
    static LinkSchedule constant(double bytesPerSecond);
    // Rates one after another; the last one holds forever. Throws kvscope::Error for an empty list,
    // a rate <= 0 or a non-final step of duration <= 0.
    static LinkSchedule steps(const std::vector<RateStep>& steps);
    // Parses "RATE" or "RATE:SECONDS,RATE:SECONDS,...,RATE" (e.g. "1Gbit:0.5,50Mbit": 1 Gbit/s for
    // half a second, then 50 Mbit/s). Throws kvscope::Error naming `what` on bad text.
    static LinkSchedule parse(const std::string& text, const std::string& what = "--bandwidth");
    // A Mahimahi trace (timestamps in ms, non-decreasing, last > 0), each opportunity carrying
    // 1500 * scale bytes. Throws kvscope::Error "name: line N: reason" on bad data.
    static LinkSchedule fromTrace(const std::vector<uint32_t>& timestampsMs, double scale, const std::string& name);
    static LinkSchedule loadTrace(const std::string& path, double scale);
    // The same schedule with every rate (trace: every opportunity's bytes) multiplied by factor > 0;
    // step durations and trace timestamps are unchanged. Throws kvscope::Error otherwise.
    LinkSchedule scaled(double factor) const;

    // Bytes the link can carry in link time (t0, t1]; 0 when t1 <= t0. Never negative.
    double capacityBytes(double t0, double t1) const;
    // The earliest t1 >= t0 with capacityBytes(t0, t1) >= bytes (t0 when bytes <= 0).
    double timeForBytes(double t0, double bytes) const;
    // Mean rate over one trace period or over the steps (the last step counted for 1 s).
    double meanBytesPerSecond() const;
    double tracePeriodSeconds() const;  // 0 unless a trace
    bool isTrace() const { return m_kind == Kind::Trace; }
    std::string describe() const;       // "50Mbit", "1Gbit:0.5,50Mbit", "trace X.down x0.5"

private:
    enum class Kind { Steps, Trace };
    double opportunitiesUpTo(double tMs) const;  // trace: opportunities at times <= tMs
    double cumulative(double t) const;           // bytes in (0, t]

    Kind m_kind = Kind::Steps;
    std::vector<RateStep> m_steps;
    std::vector<double> m_stepStart;   // (steps) link time where each step begins
    std::vector<double> m_stepBytes;   // (steps) cumulative bytes at each step's start
    std::vector<uint32_t> m_traceMs;   // (opportunities in one period), sorted
    double m_bytesPerOpportunity = kTraceBytesPerOpportunity;
    std::string m_name;
};

// Decides when bytes may leave a sender so that what leaves follows a LinkSchedule. Thread-safe:
// several connections of one server share one pacer, i.e. one bottleneck link.
//
// Usage: beginSend() when a response starts, then repeatedly grant(want) -> bytes that may be
// written now (0: sleep until whenAvailable(n)), and endSend() when done. When no sender is
// active the link is idle and its unused capacity is lost; the next beginSend starts a new busy
// period counted from that instant.
//
// Fair sharing (max-min): a sender that passes the id beginSend() returned is served by virtual
// finish tags. Each sender's tag counts the bytes granted to it; while several senders are
// active, a grant goes only to a sender whose tag is within one quantum (kFairQuantum) of the
// smallest tag among the senders waiting for a grant, and is at most one quantum. So backlogged
// senders get equal shares, a sender that wants less keeps what it wants, and the rest is split
// among the others. A sender that stops asking (its peer stopped reading) is not waited for: only
// waiting senders count, and one that comes back after more than kComebackSeconds has its tag
// raised to the smallest waiting tag, so it cannot claim the capacity it missed. A new sender
// starts there too. When no sender waits at that instant, both take the virtual time (the
// largest tag a grant started from): a new flow with tag 0 would otherwise cut in ahead of
// every flow already sending for as long as their tags are ahead of it.
class LinkPacer {
public:
    LinkPacer() : LinkPacer(LinkSchedule::constant(125e6)) {}
    explicit LinkPacer(LinkSchedule schedule);

    // Starts the link: link time becomes offsetSeconds now (a trace replay can start mid-trace).
    // Clears the counters.
    void reset(double offsetSeconds = 0.0);
    void setSchedule(LinkSchedule schedule);  // also resets
    const LinkSchedule& schedule() const { return m_schedule; }
    double linkTime(double mono) const { return mono - m_epoch; }
    double epoch() const { return m_epoch; }

    static constexpr uint64_t kFairQuantum = 32768;
    // A sender that asks again within this time of its last ask counts as backlogged throughout
    // (it only wrote what it was granted); one that stayed away longer comes back level with the
    // least-served waiting sender.
    static constexpr double kComebackSeconds = 0.05;

    // Returns the sender's id for grant and endSend (fair sharing); -1 callers are served first come.
    int beginSend();
    void endSend(int id = -1);
    // Bytes that may leave at monotonic time `now`, at most `want`; they count as sent. With an id,
    // 0 may also mean "others are owed first": sleep briefly and ask again.
    uint64_t grant(uint64_t want, double now, int id = -1);
    // Monotonic time at which `bytes` more may leave (assuming the busy period continues).
    double whenAvailable(uint64_t bytes) const;
    uint64_t bytesSent() const;  // since reset
    // Capacity lost since reset: while no sender was active (idle), and credit a busy period left
    // unused when it ended (the sender was late or blocked).
    double idleLostBytes() const;
    double busyLostBytes() const;
    // The schedule's capacity summed over the busy periods ended since reset (a sender active
    // throughout): utilisation while backlogged = 1 - busyLostBytes / busyCapacityBytes.
    double busyCapacityBytes() const;
    // Monotonic time at which the current (or last) busy period began: where a backlogged
    // sender's capacity is counted from.
    double busyStart() const;

private:
    mutable std::mutex m_mutex;
    LinkSchedule m_schedule;
    double m_epoch = 0;
    int m_active = 0;
    double m_busyStart = 0;     // link time where the current busy period began
    uint64_t m_busySent = 0;    // bytes granted in the current busy period
    uint64_t m_totalSent = 0;
    struct Sender {
        double tag = 0;        // bytes granted, in virtual time
        bool waiting = false;  // asked for a grant and got none since
        double lastAsk = -1;   // monotonic time of its last grant() call (-1: never asked)
    };
    std::map<int, Sender> m_senders;
    // Start-time fair queueing's virtual time: the largest start tag granted so far. Where a
    // sender that arrives, or comes back, while no other one waits is placed.
    double m_virtualTime = 0;
    // The smallest tag among the waiting senders other than `except`, else the virtual time.
    double leastWaitingTag(int except) const;
    int m_nextId = 0;
    double m_idleSince = 0;     // link time the link went idle
    double m_idleLost = 0, m_busyLost = 0, m_busyCapacity = 0;
};

}  // namespace kvscope
