#include "transport/kernel_link.h"

#include "common/error.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/gen_stats.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvscope {

namespace {

// Live namespaces, for the signal handler (plain storage: it may only use async-signal-safe calls).
constexpr int kMaxLive = 8;
char g_live[kMaxLive][64];
std::mutex g_liveMutex;
std::atomic<int> g_serial{0};

void addLive(const std::string& name)
{
    std::lock_guard<std::mutex> lock(g_liveMutex);
    for (auto& slot : g_live)
        if (!slot[0]) {
            std::snprintf(slot, sizeof slot, "%s", name.c_str());
            return;
        }
}

void removeLive(const std::string& name)
{
    std::lock_guard<std::mutex> lock(g_liveMutex);
    for (auto& slot : g_live)
        if (name == slot) slot[0] = 0;
}

// Runs argv[0] (searched in PATH) with argv, waits; returns its exit status and, in *output, what
// it wrote on stdout and stderr (at most 4 KiB).
int runTool(const std::vector<std::string>& argv, std::string* output)
{
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        ::dup2(fds[1], 1);
        ::dup2(fds[1], 2);
        ::execvp(args[0], args.data());
        ::_exit(127);
    }
    ::close(fds[1]);
    std::string out;
    char buf[512];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0)
        if (out.size() < 4096) out.append(buf, size_t(n));
    ::close(fds[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (output) {
        while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
        *output = out;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void mustRun(const std::vector<std::string>& argv)
{
    std::string out;
    if (runTool(argv, &out) != 0) {
        std::string cmd;
        for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
        throw Error("kernel link: '" + cmd + "' failed: " + (out.empty() ? "no output" : out));
    }
}

bool hasNetAdmin()
{
    FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return ::geteuid() == 0;
    char line[256];
    unsigned long long caps = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::strncmp(line, "CapEff:", 7) == 0) caps = std::strtoull(line + 7, nullptr, 16);
    std::fclose(f);
    return (caps >> 12) & 1;  // CAP_NET_ADMIN
}

bool inPath(const char* tool)
{
    const char* path = std::getenv("PATH");
    std::string p = path ? path : "";
    p += ":/usr/sbin:/sbin";
    size_t pos = 0;
    while (pos <= p.size()) {
        const size_t c = p.find(':', pos);
        const std::string dir = p.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
        if (!dir.empty() && ::access((dir + "/" + tool).c_str(), X_OK) == 0) return true;
        if (c == std::string::npos) break;
        pos = c + 1;
    }
    return false;
}

// Namespaces left by runs that died without cleaning up (their PID is gone).
void sweepStale()
{
    DIR* d = ::opendir("/var/run/netns");
    if (!d) return;
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
        int pid = 0, n = 0;
        if (std::sscanf(e->d_name, "kvscope-%d-%d", &pid, &n) == 2 && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
            stale.push_back(e->d_name);
    }
    ::closedir(d);
    for (const std::string& s : stale) runTool({"ip", "netns", "del", s}, nullptr);
}

void onSignal(int sig)
{
    for (auto& slot : g_live) {
        if (!slot[0]) continue;
        const pid_t pid = ::fork();
        if (pid == 0) {
            const char* argv[] = {"ip", "netns", "del", slot, nullptr};
            ::execvp("ip", const_cast<char* const*>(argv));
            ::_exit(127);
        }
        if (pid > 0) ::waitpid(pid, nullptr, 0);
    }
    ::_exit(128 + sig);
}

// The MAC address in `ip -o link show dev X` output ("... link/ether aa:bb:... brd ...").
std::string linkAddress(const std::vector<std::string>& argv)
{
    std::string out;
    if (runTool(argv, &out) != 0) throw Error("kernel link: cannot read the link address: " + out);
    const size_t p = out.find("link/ether ");
    if (p == std::string::npos) throw Error("kernel link: no link/ether address in '" + out + "'");
    const std::string mac = out.substr(p + 11, 17);
    if (mac.size() != 17) throw Error("kernel link: malformed link address in '" + out + "'");
    return mac;
}

// tbf's queue: 1 s at the schedule's mean rate, at least 1 MiB. A cellular base station keeps a
// deep queue per user (the traces' gaps of up to ~1 s lose no data, they delay it); a shallow
// queue turns every gap into a burst of losses and TCP into retransmission timeouts.
constexpr double kQueueSeconds = 1.0;
constexpr double kFrameBytes = 1514;  // a full-size frame on a 1500-byte MTU, as tbf charges it
constexpr uint32_t kTbfHandle = 0x10u << 16;  // "handle 10:" (tc handles are hexadecimal)
constexpr uint64_t kQueueMinBytes = 1u << 20;

std::string bitRate(double bytesPerSecond)
{
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.0fbit", std::max(8000.0, bytesPerSecond * 8));
    return buf;
}

// The links' addresses: /30 blocks of 10.213.0.0/16 (16384 of them), "10.213.X.Y" for host 1
// (this side) or 2 (the namespace's side) of block b.
constexpr uint32_t kBlocks = 16384;

std::string blockAddress(uint32_t block, int host)
{
    const uint32_t a = (block % kBlocks) * 4 + uint32_t(host);
    return "10.213." + std::to_string(a >> 8) + "." + std::to_string(a & 255);
}

// A block no interface of this namespace has an address in, searched from `start`: another
// process's live link, or a veth end that outlives its run (the kernel frees a dead namespace
// only once its last socket is gone, which a connection still retransmitting into a stopped
// shaper delays by minutes), would otherwise put two routes on one subnet and every connect would
// go to the wrong one.
uint32_t freeBlock(uint32_t start)
{
    std::vector<char> used(kBlocks, 0);
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) == 0) {
        for (ifaddrs* i = list; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            const uint32_t a = ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
            if ((a >> 16) == ((10u << 8) | 213u)) used[(a & 0xFFFF) / 4] = 1;
        }
        ::freeifaddrs(list);
    }
    for (uint32_t k = 0; k < kBlocks; ++k)
        if (!used[(start + k) % kBlocks]) return (start + k) % kBlocks;
    throw Error("kernel link: every /30 block of 10.213.0.0/16 is in use on this host");
}

}  // namespace

bool KernelLink::available(std::string* why)
{
    std::string reason;
    if (!hasNetAdmin()) reason = "needs root or CAP_NET_ADMIN to create a network namespace and shape it with tc";
    else if (!inPath("ip")) reason = "the 'ip' tool (iproute2) is not installed";
    else if (!inPath("tc")) reason = "the 'tc' tool (iproute2) is not installed";
    if (why) *why = reason;
    return reason.empty();
}

void KernelLink::cleanupOnSignal()
{
    std::signal(SIGINT, onSignal);
    std::signal(SIGTERM, onSignal);
}

KernelLink::KernelLink(const KernelLinkOptions& options) : m_opt(options)
{
    std::string why;
    if (!available(&why)) throw Error("--link kernel: " + why);
    if (!(m_opt.lossPercent >= 0 && m_opt.lossPercent <= 100)) throw Error("--loss: must be within 0..100");
    sweepStale();
    const int n = g_serial++ % 250;
    m_netns = "kvscope-" + std::to_string(::getpid()) + "-" + std::to_string(n);
    m_hostDev = "kvs" + std::to_string(::getpid() % 100000) + "a" + std::to_string(n);
    m_nsDev = "kvs" + std::to_string(::getpid() % 100000) + "b" + std::to_string(n);
    const uint32_t block = freeBlock(uint32_t(::getpid()) * 7 + uint32_t(n));
    m_clientAddr = blockAddress(block, 1);
    m_serverAddr = blockAddress(block, 2);
    try {
        mustRun({"ip", "netns", "add", m_netns});
        m_created = true;
        addLive(m_netns);
        mustRun({"ip", "link", "add", m_hostDev, "type", "veth", "peer", "name", m_nsDev, "netns", m_netns});
        mustRun({"ip", "addr", "add", m_clientAddr + "/30", "dev", m_hostDev});
        mustRun({"ip", "link", "set", m_hostDev, "up"});
        mustRun({"ip", "-n", m_netns, "addr", "add", m_serverAddr + "/30", "dev", m_nsDev});
        // One segment per packet from the namespace's TCP: a GSO packet is queued whole when it
        // fits tbf's bucket at enqueue, and a later tick's smaller bucket (the burst follows the
        // rate) can never pay for it: tbf then stalls with a full queue until the rate rises
        // enough again (a run started at a slow part of a trace, after a fast one: for ever).
        // With single-frame packets the 2-frame minimum bucket always passes the head.
        mustRun({"ip", "-n", m_netns, "link", "set", m_nsDev, "gso_max_segs", "1"});
        mustRun({"ip", "-n", m_netns, "link", "set", m_nsDev, "up"});
        mustRun({"ip", "-n", m_netns, "link", "set", "lo", "up"});
        // The kick socket (see shaperLoop): UDP from inside the namespace to the discard port of
        // the client's address, out through the shaped device.
        const std::string kerr = inNamespace([&] {
            m_kickFd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(9);
            ::inet_pton(AF_INET, m_clientAddr.c_str(), &a.sin_addr);
            m_kickAddr = a;
            if (m_kickFd < 0) throw Error(std::string("kernel link: kick socket: ") + std::strerror(errno));
        });
        if (!kerr.empty()) throw Error(kerr);
        // Permanent neighbour entries both ways: ARP on a shaped link would otherwise take part.
        // A stale entry's probe waits in tbf's queue behind the data (or in a trace's gap) and,
        // unanswered in time, marks the neighbour failed: every packet is dropped until it
        // resolves again.
        const std::string hostMac = linkAddress({"ip", "-o", "link", "show", "dev", m_hostDev});
        const std::string nsMac = linkAddress({"ip", "-n", m_netns, "-o", "link", "show", "dev", m_nsDev});
        mustRun({"ip", "neigh", "replace", m_serverAddr, "lladdr", nsMac, "dev", m_hostDev, "nud", "permanent"});
        mustRun({"ip", "-n", m_netns, "neigh", "replace", m_clientAddr, "lladdr", hostMac, "dev", m_nsDev, "nud", "permanent"});
        char delay[32], loss[32];
        std::snprintf(delay, sizeof delay, "%.3fms", m_opt.rttSeconds * 1e3);
        std::snprintf(loss, sizeof loss, "%.4f%%", m_opt.lossPercent);
        std::vector<std::string> netem = {"ip", "netns", "exec", m_netns, "tc", "qdisc", "add", "dev", m_nsDev,
                                          "root", "handle", "1:", "netem", "delay", delay, "limit", "100000"};
        if (m_opt.lossPercent > 0) {
            netem.push_back("loss");
            netem.push_back(loss);
        }
        std::string out;
        if (runTool(netem, &out) != 0) {
            // Kernels built without sch_netem: tbf alone shapes the rate; the caller delays replies.
            if (out.find("unknown") == std::string::npos) mustRun(netem);  // another failure: report it
            if (m_opt.lossPercent > 0)
                throw Error("kernel link: --loss needs the netem qdisc, which this kernel lacks (" + out + ")");
            m_netem = false;
        }
        setRate(m_opt.schedule.capacityBytes(0, m_opt.tickSeconds) / m_opt.tickSeconds, true);
        openStats();
        // The congestion control of the server's sockets: set on the listening socket, which
        // accepted connections inherit (a namespace's default can only name the "allowed" ones).
        m_congestion = m_opt.congestion;
        if (m_congestion.empty()) {
            inNamespace([&] {
                char buf[64] = {0};
                if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r")) {
                    if (std::fgets(buf, sizeof buf, f)) m_congestion = buf;
                    std::fclose(f);
                }
            });
            while (!m_congestion.empty() && (m_congestion.back() == '\n' || m_congestion.back() == ' ')) m_congestion.pop_back();
        }
    } catch (...) {
        destroy();
        throw;
    }
}

KernelLink::~KernelLink() { destroy(); }

void KernelLink::destroy()
{
    stopShaping();
    if (m_kickFd >= 0) ::close(m_kickFd);
    m_kickFd = -1;
    if (m_nlFd >= 0) ::close(m_nlFd);
    m_nlFd = -1;
    if (m_created) {
        runTool({"ip", "netns", "del", m_netns}, nullptr);  // deletes both veth ends
        runTool({"ip", "link", "del", m_hostDev}, nullptr);  // normally gone already
        removeLive(m_netns);
        m_created = false;
    }
}

std::string KernelLink::describe() const
{
    char buf[320];
    const char* loop = m_nlFd >= 0 ? ", rate corrected from tbf's counters" : ", open loop (tbf's counters unreadable)";
    if (m_netem)
        std::snprintf(buf, sizeof buf, "kernel veth %s<->%s (netns %s, tcp %s), netem delay %.1f ms loss %g%%, tbf following %s%s",
                      m_hostDev.c_str(), m_nsDev.c_str(), m_netns.c_str(), m_congestion.c_str(), m_opt.rttSeconds * 1e3, m_opt.lossPercent,
                      m_opt.schedule.describe().c_str(), loop);
    else
        std::snprintf(buf, sizeof buf,
                      "kernel veth %s<->%s (netns %s, tcp %s), tbf following %s%s; no netem in this kernel: the "
                      "%.1f ms RTT is added by the server",
                      m_hostDev.c_str(), m_nsDev.c_str(), m_netns.c_str(), m_congestion.c_str(), m_opt.schedule.describe().c_str(),
                      loop, m_opt.rttSeconds * 1e3);
    return buf;
}

void KernelLink::openBatch()
{
    // One long-lived `tc -n NETNS -force -batch -` takes every rate change on its stdin: no fork
    // per tick (a fork and exec of tc costs 10-20 ms on a loaded machine). A tc that dies makes
    // writes fail with EPIPE (SIGPIPE ignored) and the link falls back to one tc per change.
    std::signal(SIGPIPE, SIG_IGN);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        return;
    }
    if (pid == 0) {
        ::dup2(fds[0], 0);
        const char* argv[] = {"tc", "-n", m_netns.c_str(), "-force", "-batch", "-", nullptr};
        ::execvp("tc", const_cast<char* const*>(argv));
        ::_exit(127);
    }
    ::close(fds[0]);
    m_batchPid = pid;
    m_batchFd = fds[1];
}

void KernelLink::closeBatch()
{
    if (m_batchFd >= 0) ::close(m_batchFd);
    m_batchFd = -1;
    if (m_batchPid > 0) {
        int status = 0;
        while (::waitpid(m_batchPid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    m_batchPid = -1;
}

void KernelLink::setRate(double bytesPerSecond, bool add, double extraFrameBytes)
{
    // Bucket: 2 ms at the rate, at least 2 full-size frames. Every `tc qdisc change` refills
    // tbf's bucket (tbf_change sets tokens = buffer) and drops the tokens accrued towards the
    // frame at the head of the queue: a backlogged tbf gets between burst - one frame (its next
    // dequeue is the timer armed for that frame, which had a frame's tokens by then) and the whole
    // burst (a packet enqueued right after the change makes it dequeue at once) free at every
    // tick, on top of rate x tick. Which one depends on how the sender's TCP feeds the queue
    // (TSQ-throttled enqueues, right after each dequeue, or ACK-clocked ones in between): the
    // rate is lowered by the first, which is what the senders measured here got (a chunk server
    // and a bare sendAll, cubic, 4 Mbit/s: the whole bucket paid left them 0.8-1 frame short per
    // tick), and the counters loop (shaperLoop) pays whatever else. Queue: kQueueSeconds at
    // the schedule's mean rate, the same at every tick: a rate drop drains the queue slower
    // instead of dropping what it holds.
    const double tick = m_opt.tickSeconds;
    bytesPerSecond *= m_opt.frameBytesPerPayloadByte;  // payload rate -> frame rate
    const uint64_t burst = uint64_t(std::max(2.0 * kFrameBytes, bytesPerSecond * 0.002));
    const double gift = double(burst) - kFrameBytes;
    const double rate = std::max(1000.0, add ? bytesPerSecond : bytesPerSecond + (extraFrameBytes - gift) / tick);
    const uint64_t limit = uint64_t(std::max(double(kQueueMinBytes), m_opt.schedule.meanBytesPerSecond() * kQueueSeconds));
    if (!add && m_batchFd >= 0) {
        char line[256];
        const int n = std::snprintf(line, sizeof line, "qdisc change dev %s %s handle 10: tbf rate %s burst %llu limit %llu\n",
                                    m_nsDev.c_str(), m_netem ? "parent 1:1" : "root", bitRate(rate).c_str(),
                                    (unsigned long long)burst, (unsigned long long)limit);
        if (::write(m_batchFd, line, size_t(n)) == n) {
            ++m_changes;
            return;
        }
    }
    std::vector<std::string> cmd = {"ip", "netns", "exec", m_netns, "tc", "qdisc", add ? "add" : "change", "dev", m_nsDev};
    if (m_netem) cmd.insert(cmd.end(), {"parent", "1:1"});
    else cmd.push_back("root");
    cmd.insert(cmd.end(), {"handle", "10:", "tbf", "rate", bitRate(rate), "burst", std::to_string(burst), "limit",
                           std::to_string(limit)});
    mustRun(cmd);
    ++m_changes;
}

void KernelLink::openStats()
{
    int fd = -1, index = 0;
    inNamespace([&] {
        index = int(::if_nametoindex(m_nsDev.c_str()));
        fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);  // bound to this namespace
    });
    m_nlFd = fd;
    m_nsIfindex = index;
    uint64_t bytes = 0;
    uint32_t backlog = 0;
    if (m_nlFd >= 0 && (index <= 0 || !readStats(&bytes, &backlog))) {
        ::close(m_nlFd);  // no counters: the shaper runs open loop
        m_nlFd = -1;
    }
}

bool KernelLink::readStats(uint64_t* bytes, uint32_t* backlog)
{
    if (m_nlFd < 0) return false;
    struct {
        nlmsghdr nh;
        tcmsg tc;
    } req{};
    req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(tcmsg));
    req.nh.nlmsg_type = RTM_GETQDISC;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.nh.nlmsg_seq = ++m_nlSeq;
    req.tc.tcm_family = AF_UNSPEC;
    req.tc.tcm_ifindex = m_nsIfindex;
    if (::send(m_nlFd, &req, req.nh.nlmsg_len, MSG_DONTWAIT) < 0) return false;
    bool gotBytes = false, gotQueue = false;
    const double until = monoSeconds() + 0.02;
    alignas(nlmsghdr) char buf[16384];
    for (;;) {
        pollfd pfd{m_nlFd, POLLIN, 0};
        const int ms = int(std::ceil((until - monoSeconds()) * 1e3));
        if (ms <= 0 || ::poll(&pfd, 1, ms) <= 0) return false;
        const ssize_t len = ::recv(m_nlFd, buf, sizeof buf, MSG_DONTWAIT);
        if (len < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (len <= 0) return false;
        int left = int(len);
        for (nlmsghdr* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_seq != m_nlSeq) continue;  // the rest of a dump that timed out
            if (h->nlmsg_type == NLMSG_DONE) return gotBytes && gotQueue;
            if (h->nlmsg_type == NLMSG_ERROR) return false;
            if (h->nlmsg_type != RTM_NEWQDISC || h->nlmsg_len < NLMSG_LENGTH(sizeof(tcmsg))) continue;
            tcmsg* t = static_cast<tcmsg*>(NLMSG_DATA(h));
            if (t->tcm_ifindex != m_nsIfindex || t->tcm_handle != kTbfHandle) continue;
            int alen = int(h->nlmsg_len - NLMSG_LENGTH(sizeof(tcmsg)));
            for (rtattr* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(t) + NLMSG_ALIGN(sizeof(tcmsg))); RTA_OK(a, alen);
                 a = RTA_NEXT(a, alen)) {
                if (a->rta_type != TCA_STATS2) continue;
                int nlen = int(RTA_PAYLOAD(a));
                for (rtattr* b = static_cast<rtattr*>(RTA_DATA(a)); RTA_OK(b, nlen); b = RTA_NEXT(b, nlen)) {
                    if (b->rta_type == TCA_STATS_BASIC && RTA_PAYLOAD(b) >= sizeof(uint64_t)) {
                        std::memcpy(bytes, RTA_DATA(b), sizeof(uint64_t));  // gnet_stats_basic.bytes
                        gotBytes = true;
                    } else if (b->rta_type == TCA_STATS_QUEUE && RTA_PAYLOAD(b) >= sizeof(gnet_stats_queue)) {
                        gnet_stats_queue q;
                        std::memcpy(&q, RTA_DATA(b), sizeof q);
                        *backlog = q.backlog;
                        gotQueue = true;
                    }
                }
            }
        }
    }
}

std::string KernelLink::inNamespace(const std::function<void()>& fn) const
{
    std::string error;
    std::thread t([&] {
        const std::string path = "/var/run/netns/" + m_netns;
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
            error = "kernel link: cannot enter " + path + ": " + std::strerror(errno);
            if (fd >= 0) ::close(fd);
            return;
        }
        ::close(fd);
        try {
            fn();
        } catch (const std::exception& e) {
            error = e.what();
        }
    });
    t.join();
    return error;
}

Socket KernelLink::listen(const std::string& host, int port) const
{
    Socket result;
    const std::string error = inNamespace([&] {
        result = Socket::listenTcp(host, port);
        if (!m_opt.congestion.empty() &&
            ::setsockopt(result.fd(), IPPROTO_TCP, TCP_CONGESTION, m_opt.congestion.c_str(),
                         socklen_t(m_opt.congestion.size())) != 0)
            throw Error("kernel link: TCP congestion control '" + m_opt.congestion + "': " + std::strerror(errno) +
                        " (see /proc/sys/net/ipv4/tcp_available_congestion_control)");
    });
    if (!error.empty()) throw Error(error);
    return result;
}

void KernelLink::start(double offsetSeconds)
{
    stopShaping();
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_stop = false;
    }
    openBatch();
    const double epoch = monoSeconds() - offsetSeconds;
    setRate(m_opt.schedule.capacityBytes(offsetSeconds, offsetSeconds + m_opt.tickSeconds) / m_opt.tickSeconds, false);
    m_thread = std::thread([this, epoch] { shaperLoop(epoch); });
}

void KernelLink::stopShaping()
{
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_stop = true;
    }
    m_cv.notify_all();
    if (m_thread.joinable()) m_thread.join();
    closeBatch();
}

void KernelLink::kick()
{
    // Unconnected: the port unreachable that comes back is not reported to the next send.
    if (m_kickFd >= 0)
        (void)::sendto(m_kickFd, "k", 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&m_kickAddr),
                       sizeof m_kickAddr);
    ++m_kicks;
}

void KernelLink::shaperLoop(double epoch)
{
    const double tick = m_opt.tickSeconds;
    double next = std::ceil((monoSeconds() - epoch) / tick + 1e-9) * tick;  // link time of the next tick
    double lastRate = 0;
    // The counters loop: while tbf stays backlogged, `owed` is what the schedule gave it (in
    // frame bytes) minus what it sent, since the backlog began; every tick carries half of it on
    // top of the schedule, within +-(2 frames + 5% of the tick), so whatever the refill model in
    // setRate gets wrong (and timer slack) is paid back within a few ticks instead of piling up.
    // A reading with an empty queue resets it: an idle link loses its capacity, as the pacer's does.
    uint64_t prevSent = 0;
    uint32_t prevBacklog = 0;
    double prevAt = -1;  // link time of the previous reading's tick (-1: none yet)
    double owed = 0;
    std::unique_lock<std::mutex> lock(m_mutex);
    while (!m_stop) {
        const auto until = std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(epoch + next)));
        if (m_cv.wait_until(lock, until, [this] { return m_stop; })) break;
        lock.unlock();
        const double capacity = m_opt.schedule.capacityBytes(next, next + tick);
        const double rate = capacity / tick;
        double extra = 0;
        uint64_t sent = 0;
        uint32_t backlog = 0;
        if (readStats(&sent, &backlog)) {
            if (prevAt >= 0 && backlog > 0 && prevBacklog > 0)
                owed += m_opt.schedule.capacityBytes(prevAt, next) * m_opt.frameBytesPerPayloadByte - double(sent - prevSent);
            else
                owed = 0;
            const double bound = 2 * kFrameBytes + 0.05 * capacity * m_opt.frameBytesPerPayloadByte;
            owed = std::clamp(owed, -2 * bound, 2 * bound);
            // No extra in a tick without capacity (a trace's gap stays a gap).
            if (capacity > 0) extra = std::clamp(0.5 * owed, -bound, bound);
            if (extra != 0) ++m_corrected;
            prevSent = sent;
            prevBacklog = backlog;
            prevAt = next;
        } else {
            prevAt = -1;
        }
        try {
            setRate(rate, false, extra);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%s\n", e.what());
        }
        if (rate > lastRate) {
            // tbf does not look at its queue again when its rate changes: a packet that found no
            // tokens at a gap's crawl armed a timer for when the crawl would have paid for it (a
            // full frame at 8 kbit/s: 1.5 s), and the link would sit idle until then. A datagram
            // through the same qdisc, once tc has applied the change, makes it dequeue now (43
            // bytes on the wire per rising tick, under 1 kB/s).
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            kick();
        }
        lastRate = rate;
        lock.lock();
        next += tick;
        const double now = monoSeconds() - epoch;
        if (next < now) next = std::ceil(now / tick) * tick;  // fell behind: skip to the coming tick
    }
}

}  // namespace kvscope
