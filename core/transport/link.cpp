#include "transport/link.h"

#include "common/error.h"
#include "common/file_io.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

namespace kvscope {

double monoSeconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// Rates

double parseRate(const std::string& text, const std::string& what)
{
    const Error bad = inputError(what, "", "'" + text + "' is not a rate like 50Mbit, 1Gbit or 800kbit");
    size_t used = 0;
    double value = 0;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
        throw bad;
    }
    std::string unit = text.substr(used);
    for (char& c : unit) c = char(std::tolower((unsigned char)c));
    if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) unit.resize(unit.size() - 2);
    if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "ps") == 0) unit = unit.substr(0, unit.size() - 2) + "it";
    double scale = 0;
    if (unit == "bit") scale = 1;
    else if (unit == "kbit") scale = 1e3;
    else if (unit == "mbit") scale = 1e6;
    else if (unit == "gbit") scale = 1e9;
    else throw bad;
    if (!std::isfinite(value) || value <= 0) throw inputError(what, "", "'" + text + "': the rate must be positive");
    return value * scale / 8.0;
}

std::string formatRate(double bytesPerSecond)
{
    const double bits = bytesPerSecond * 8;
    const char* unit = "bit";
    double v = bits;
    if (bits >= 1e9) { v = bits / 1e9; unit = "Gbit"; }
    else if (bits >= 1e6) { v = bits / 1e6; unit = "Mbit"; }
    else if (bits >= 1e3) { v = bits / 1e3; unit = "kbit"; }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g%s", v, unit);
    return buf;
}

// ---------------------------------------------------------------------------------------------
// Schedules

LinkSchedule LinkSchedule::constant(double bytesPerSecond) { return steps({{0.0, bytesPerSecond}}); }

LinkSchedule LinkSchedule::steps(const std::vector<RateStep>& steps)
{
    if (steps.empty()) throw Error("bandwidth schedule: no steps");
    LinkSchedule s;
    s.m_kind = Kind::Steps;
    double t = 0, bytes = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
        const RateStep& st = steps[i];
        if (!(st.bytesPerSecond > 0) || !std::isfinite(st.bytesPerSecond))
            throw Error("bandwidth schedule: step " + std::to_string(i + 1) + ": the rate must be positive");
        const bool last = i + 1 == steps.size();
        if (!last && !(st.seconds > 0 && std::isfinite(st.seconds)))
            throw Error("bandwidth schedule: step " + std::to_string(i + 1) + ": the duration must be positive");
        s.m_steps.push_back(st);
        s.m_stepStart.push_back(t);
        s.m_stepBytes.push_back(bytes);
        if (!last) {
            t += st.seconds;
            bytes += st.seconds * st.bytesPerSecond;
        }
    }
    return s;
}

LinkSchedule LinkSchedule::parse(const std::string& text, const std::string& what)
{
    std::vector<RateStep> steps;
    size_t pos = 0;
    while (pos <= text.size()) {
        const size_t comma = text.find(',', pos);
        const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        const size_t colon = item.find(':');
        RateStep st;
        st.bytesPerSecond = parseRate(item.substr(0, colon), what);
        if (colon != std::string::npos) {
            const std::string dur = item.substr(colon + 1);
            size_t used = 0;
            try {
                st.seconds = std::stod(dur, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (dur.empty() || used != dur.size() || !(st.seconds > 0) || !std::isfinite(st.seconds))
                throw inputError(what, "'" + item + "'", "the duration after ':' must be a positive number of seconds");
        } else if (comma != std::string::npos) {
            throw inputError(what, "'" + item + "'", "every step but the last needs ':SECONDS' (e.g. 1Gbit:0.5,50Mbit)");
        }
        steps.push_back(st);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return LinkSchedule::steps(steps);
}

LinkSchedule LinkSchedule::fromTrace(const std::vector<uint32_t>& ms, double scale, const std::string& name)
{
    if (ms.empty()) throw inputError(name, "", "the trace holds no timestamps");
    for (size_t i = 1; i < ms.size(); ++i)
        if (ms[i] < ms[i - 1])
            throw inputError(name, "line " + std::to_string(i + 1), "timestamps must not decrease");
    if (ms.back() == 0) throw inputError(name, "", "the last timestamp (the period) must be positive");
    if (!(scale > 0) || !std::isfinite(scale)) throw inputError(name, "", "the scale factor must be positive");
    LinkSchedule s;
    s.m_kind = Kind::Trace;
    s.m_traceMs = ms;
    s.m_bytesPerOpportunity = kTraceBytesPerOpportunity * scale;
    s.m_name = name;
    return s;
}

LinkSchedule LinkSchedule::loadTrace(const std::string& path, double scale)
{
    const std::string text = readSmallFile(path, 256u << 20);
    std::vector<uint32_t> ms;
    size_t line = 0, pos = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string item = text.substr(pos, end - pos);
        ++line;
        pos = end + 1;
        while (!item.empty() && (item.back() == '\r' || item.back() == ' ' || item.back() == '\t')) item.pop_back();
        if (item.empty()) continue;
        uint64_t v = 0;
        for (char c : item) {
            if (c < '0' || c > '9' || v > 0xFFFFFFFFull / 10)
                throw inputError(path, "line " + std::to_string(line), "'" + item + "' is not a millisecond timestamp");
            v = v * 10 + uint64_t(c - '0');
        }
        if (v > 0xFFFFFFFFull) throw inputError(path, "line " + std::to_string(line), "timestamp too large");
        ms.push_back(uint32_t(v));
    }
    return fromTrace(ms, scale, path);
}

LinkSchedule LinkSchedule::scaled(double factor) const
{
    if (!(factor > 0) || !std::isfinite(factor)) throw Error("link schedule: the scale factor must be positive");
    LinkSchedule s = *this;
    if (m_kind == Kind::Trace) {
        s.m_bytesPerOpportunity *= factor;
        return s;
    }
    std::vector<RateStep> steps = m_steps;
    for (RateStep& st : steps) st.bytesPerSecond *= factor;
    return LinkSchedule::steps(steps);
}

double LinkSchedule::opportunitiesUpTo(double tMs) const
{
    // Seconds -> ms is inexact (0.003 * 1000 = 2.9999999999999996): snap to the whole ms when close.
    const double whole = std::round(tMs);
    if (std::abs(tMs - whole) < 1e-6) tMs = whole;
    if (tMs < 0) return 0;
    const double period = m_traceMs.back();
    const double k = std::floor(tMs / period);
    const double rem = tMs - k * period;
    const size_t inPeriod = size_t(std::upper_bound(m_traceMs.begin(), m_traceMs.end(), rem,
                                                    [](double a, uint32_t b) { return a < double(b); }) -
                                   m_traceMs.begin());
    return k * double(m_traceMs.size()) + double(inPeriod);
}

double LinkSchedule::cumulative(double t) const
{
    if (m_kind == Kind::Trace) return m_bytesPerOpportunity * opportunitiesUpTo(t * 1000.0);
    if (t <= 0) return 0;
    size_t i = size_t(std::upper_bound(m_stepStart.begin(), m_stepStart.end(), t) - m_stepStart.begin()) - 1;
    return m_stepBytes[i] + (t - m_stepStart[i]) * m_steps[i].bytesPerSecond;
}

double LinkSchedule::capacityBytes(double t0, double t1) const
{
    if (m_steps.empty() && m_traceMs.empty()) return 0;
    if (t1 <= t0) return 0;
    return std::max(0.0, cumulative(t1) - cumulative(t0));
}

double LinkSchedule::timeForBytes(double t0, double bytes) const
{
    if (bytes <= 0) return t0;
    if (m_kind == Kind::Trace) {
        // The opportunity that completes `bytes`: global index j (0-based) after those up to t0.
        const double need = std::ceil(bytes / m_bytesPerOpportunity - 1e-9);
        const double j = opportunitiesUpTo(t0 * 1000.0) + need - 1;
        const double n = double(m_traceMs.size());
        const double k = std::floor(j / n);
        const size_t i = size_t(j - k * n);
        const double tMs = double(m_traceMs[i]) + k * double(m_traceMs.back());
        return std::max(t0, tMs / 1000.0 + 1e-9);  // a hair after, against rounding of ms -> s
    }
    if (m_steps.empty()) return std::numeric_limits<double>::infinity();
    const double target = cumulative(std::max(0.0, t0)) + bytes;
    size_t i = size_t(std::upper_bound(m_stepBytes.begin(), m_stepBytes.end(), target) - m_stepBytes.begin()) - 1;
    const double t = m_stepStart[i] + (target - m_stepBytes[i]) / m_steps[i].bytesPerSecond;
    return std::max(t0, t);
}

double LinkSchedule::meanBytesPerSecond() const
{
    if (m_kind == Kind::Trace) return m_bytesPerOpportunity * double(m_traceMs.size()) / (m_traceMs.back() / 1000.0);
    if (m_steps.empty()) return 0;
    const double span = m_stepStart.back() + 1.0;
    return cumulative(span) / span;
}

double LinkSchedule::tracePeriodSeconds() const
{
    return m_kind == Kind::Trace ? m_traceMs.back() / 1000.0 : 0.0;
}

std::string LinkSchedule::describe() const
{
    if (m_kind == Kind::Trace) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " x%g (mean %s)", m_bytesPerOpportunity / kTraceBytesPerOpportunity,
                      formatRate(meanBytesPerSecond()).c_str());
        return "trace " + m_name + buf;
    }
    std::string s;
    for (size_t i = 0; i < m_steps.size(); ++i) {
        if (i) s += ",";
        s += formatRate(m_steps[i].bytesPerSecond);
        if (i + 1 < m_steps.size()) {
            char buf[32];
            std::snprintf(buf, sizeof buf, ":%g", m_steps[i].seconds);
            s += buf;
        }
    }
    return s;
}

// ---------------------------------------------------------------------------------------------
// Pacer

LinkPacer::LinkPacer(LinkSchedule schedule) : m_schedule(std::move(schedule)) { reset(); }

void LinkPacer::reset(double offsetSeconds)
{
    std::lock_guard<std::mutex> lock(m_mutex);
    m_epoch = monoSeconds() - offsetSeconds;
    m_busyStart = offsetSeconds;
    m_busySent = 0;
    m_totalSent = 0;
    m_idleSince = offsetSeconds;
    m_idleLost = m_busyLost = m_busyCapacity = 0;
}

void LinkPacer::setSchedule(LinkSchedule schedule)
{
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_schedule = std::move(schedule);
    }
    reset();
}

int LinkPacer::beginSend()
{
    std::lock_guard<std::mutex> lock(m_mutex);
    const int id = m_nextId++;
    Sender snd;
    // A new sender starts level with the least-served waiting one (a fresh flow owes nothing and is
    // owed nothing), or, when none waits at this instant, at the virtual time of the last grant:
    // never at 0, which would let it cut in ahead of every flow already sending.
    snd.tag = leastWaitingTag(-1);
    m_senders[id] = snd;
    if (m_active++ == 0) {
        // The link was idle: what it could have carried meanwhile is gone.
        m_busyStart = monoSeconds() - m_epoch;
        m_busySent = 0;
        m_idleLost += m_schedule.capacityBytes(m_idleSince, m_busyStart);
    }
    return id;
}

void LinkPacer::endSend(int id)
{
    std::lock_guard<std::mutex> lock(m_mutex);
    if (id >= 0) m_senders.erase(id);
    if (m_active > 0 && --m_active == 0) {
        m_idleSince = monoSeconds() - m_epoch;
        const double capacity = std::floor(m_schedule.capacityBytes(m_busyStart, m_idleSince));
        m_busyCapacity += capacity;
        m_busyLost += std::max(0.0, capacity - double(m_busySent));
    }
}

double LinkPacer::idleLostBytes() const
{
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_idleLost;
}

double LinkPacer::busyLostBytes() const
{
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_busyLost;
}

double LinkPacer::busyCapacityBytes() const
{
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_busyCapacity;
}

uint64_t LinkPacer::grant(uint64_t want, double now, int id)
{
    std::lock_guard<std::mutex> lock(m_mutex);
    Sender* me = nullptr;
    if (id >= 0) {
        auto it = m_senders.find(id);
        if (it != m_senders.end()) me = &it->second;
    }
    if (me && !me->waiting) {
        // Coming back from a stall: never behind the least-served waiting sender. Coming back
        // from writing what it was granted is not a stall: its deficit, if any, still counts.
        const bool stalled = me->lastAsk < 0 || now - me->lastAsk > kComebackSeconds;
        if (stalled) me->tag = std::max(me->tag, leastWaitingTag(id));
        me->waiting = true;
    }
    if (me) me->lastAsk = now;
    const double cap = std::floor(m_schedule.capacityBytes(m_busyStart, now - m_epoch));
    const double credit = cap - double(m_busySent);
    if (credit < 1) return 0;
    uint64_t n = std::min<uint64_t>(want, uint64_t(credit));
    if (me && m_senders.size() > 1) {
        for (const auto& [k, v] : m_senders)
            if (v.waiting && k != id && v.tag + double(kFairQuantum) < me->tag) return 0;  // others are owed first
        n = std::min<uint64_t>(n, kFairQuantum);
    }
    if (me) {
        m_virtualTime = std::max(m_virtualTime, me->tag);  // the start tag of the flow in service
        me->tag += double(n);
        me->waiting = false;
    }
    m_busySent += n;
    m_totalSent += n;
    return n;
}

double LinkPacer::leastWaitingTag(int except) const
{
    bool any = false;
    double least = 0;
    for (const auto& [k, v] : m_senders)
        if (v.waiting && k != except) {
            least = any ? std::min(least, v.tag) : v.tag;
            any = true;
        }
    return any ? least : m_virtualTime;
}

double LinkPacer::whenAvailable(uint64_t bytes) const
{
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_epoch + m_schedule.timeForBytes(m_busyStart, double(m_busySent + bytes));
}

double LinkPacer::busyStart() const
{
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_epoch + m_busyStart;
}

uint64_t LinkPacer::bytesSent() const
{
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_totalSent;
}

}  // namespace kvscope
