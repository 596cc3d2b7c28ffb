// TCP plumbing for the chunk server and client: an owning socket, connect/listen on loopback, and
// send/receive with deadlines. Every blocking call waits with poll() against a monotonic deadline
// (monoSeconds()), so nothing in core/stream can hang on a silent peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvscope {

// Why a socket operation failed; the message says more.
class NetError : public std::exception {
public:
    enum Kind { Timeout, Closed, Failed };
    NetError(Kind kind, std::string message) : m_kind(kind), m_message(std::move(message)) {}
    Kind kind() const { return m_kind; }
    const char* what() const noexcept override { return m_message.c_str(); }

private:
    Kind m_kind;
    std::string m_message;
};

class Socket {
public:
    Socket() = default;
    explicit Socket(int fd) : m_fd(fd) {}
    ~Socket() { close(); }
    Socket(Socket&& o) noexcept : m_fd(o.m_fd) { o.m_fd = -1; }
    Socket& operator=(Socket&& o) noexcept;
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;

    int fd() const { return m_fd; }
    bool valid() const { return m_fd >= 0; }
    void close();
    // Wakes up any thread blocked on this socket (shutdown(2) both ways) without closing it.
    void shutdown();

    // Connects to host:port (numeric IPv4, or "localhost") within timeoutSeconds.
    // Throws NetError(Timeout|Failed).
    static Socket connectTcp(const std::string& host, int port, double timeoutSeconds);
    // Listens on host:port (port 0 = any free port). Throws kvscope::Error for a bad address or a
    // port in use.
    static Socket listenTcp(const std::string& host, int port);
    int localPort() const;
    // Waits for a connection until the deadline; returns an invalid socket on timeout.
    Socket accept(double deadline) const;
    // A connection already waiting, without blocking; an invalid socket when none is (or accept
    // failed: errno says why, EMFILE when out of descriptors).
    Socket acceptNow() const;

    // Writes all n bytes before `deadline` (monotonic seconds). Throws NetError.
    void sendAll(const void* data, size_t n, double deadline) const;
    // Reads at least 1 and at most n bytes before the deadline. Throws NetError (Closed at EOF).
    size_t recvSome(void* data, size_t n, double deadline) const;
    // Reads exactly n bytes before the deadline. Throws NetError.
    void recvAll(void* data, size_t n, double deadline) const;
    // Waits until a read would not block (data, end of stream or an error to report) or the
    // deadline passes (false). Reads nothing.
    bool waitReadable(double deadline) const;

private:
    int m_fd = -1;
};

}  // namespace kvscope
