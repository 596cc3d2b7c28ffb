#include "transport/net.h"

#include "common/error.h"
#include "transport/link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

namespace kvscope {

namespace {

// Milliseconds poll() may wait before `deadline`; 0 when it has passed.
int msUntil(double deadline)
{
    const double left = deadline - monoSeconds();
    if (left <= 0) return 0;
    return left > 3600 ? 3600 * 1000 : int(std::ceil(left * 1000.0));
}

// Waits until fd is ready for `events` or the deadline passes (false).
bool waitFor(int fd, short events, double deadline)
{
    for (;;) {
        pollfd p{fd, events, 0};
        const int r = ::poll(&p, 1, msUntil(deadline));
        if (r > 0) return true;
        if (r == 0) {
            if (monoSeconds() >= deadline) return false;
            continue;
        }
        if (errno != EINTR) throw NetError(NetError::Failed, std::string("poll: ") + std::strerror(errno));
    }
}

sockaddr_in address(const std::string& host, int port)
{
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    const std::string h = host == "localhost" ? "127.0.0.1" : host;
    if (port < 0 || port > 65535 || ::inet_pton(AF_INET, h.c_str(), &a.sin_addr) != 1)
        throw Error(host + ":" + std::to_string(port) + ": not a numeric IPv4 address and port");
    return a;
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept
{
    if (this != &o) {
        close();
        m_fd = o.m_fd;
        o.m_fd = -1;
    }
    return *this;
}

void Socket::close()
{
    if (m_fd >= 0) ::close(m_fd);
    m_fd = -1;
}

void Socket::shutdown()
{
    if (m_fd >= 0) ::shutdown(m_fd, SHUT_RDWR);
}

Socket Socket::connectTcp(const std::string& host, int port, double timeoutSeconds)
{
    sockaddr_in a;
    try {
        a = address(host, port);
    } catch (const Error& e) {
        throw NetError(NetError::Failed, e.what());
    }
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) throw NetError(NetError::Failed, std::string("socket: ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(s.m_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const std::string who = host + ":" + std::to_string(port);
    if (::connect(s.m_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (errno != EINPROGRESS) throw NetError(NetError::Failed, who + ": connect: " + std::strerror(errno));
        if (!waitFor(s.m_fd, POLLOUT, monoSeconds() + timeoutSeconds))
            throw NetError(NetError::Timeout, who + ": connect: timed out");
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(s.m_fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) throw NetError(NetError::Failed, who + ": connect: " + std::strerror(err));
    }
    return s;
}

Socket Socket::listenTcp(const std::string& host, int port)
{
    const sockaddr_in a = address(host, port);
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) throw Error(std::string("socket: ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(s.m_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const std::string who = host + ":" + std::to_string(port);
    if (::bind(s.m_fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
        throw Error(who + ": bind: " + std::strerror(errno));
    // A deep backlog: a connect flood must not keep legitimate connects waiting in SYN retries.
    if (::listen(s.m_fd, SOMAXCONN) != 0) throw Error(who + ": listen: " + std::strerror(errno));
    return s;
}

int Socket::localPort() const
{
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (::getsockname(m_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
    return ntohs(a.sin_port);
}

Socket Socket::accept(double deadline) const
{
    if (!waitFor(m_fd, POLLIN, deadline)) return Socket();
    return acceptNow();
}

Socket Socket::acceptNow() const
{
    Socket c(::accept4(m_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (c.valid()) {
        const int saved = errno;
        const int one = 1;
        ::setsockopt(c.m_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        errno = saved;
    }
    return c;
}

void Socket::sendAll(const void* data, size_t n, double deadline) const
{
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::send(m_fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= size_t(w);
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!waitFor(m_fd, POLLOUT, deadline)) throw NetError(NetError::Timeout, "send: timed out");
            continue;
        }
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) throw NetError(NetError::Closed, "send: peer closed");
        throw NetError(NetError::Failed, std::string("send: ") + std::strerror(errno));
    }
}

size_t Socket::recvSome(void* data, size_t n, double deadline) const
{
    for (;;) {
        const ssize_t r = ::recv(m_fd, data, n, 0);
        if (r > 0) return size_t(r);
        if (r == 0) throw NetError(NetError::Closed, "connection closed by peer");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!waitFor(m_fd, POLLIN, deadline)) throw NetError(NetError::Timeout, "receive: timed out");
            continue;
        }
        if (errno == ECONNRESET) throw NetError(NetError::Closed, "connection reset by peer");
        throw NetError(NetError::Failed, std::string("recv: ") + std::strerror(errno));
    }
}

bool Socket::waitReadable(double deadline) const { return waitFor(m_fd, POLLIN, deadline); }

void Socket::recvAll(void* data, size_t n, double deadline) const
{
    char* p = static_cast<char*>(data);
    while (n > 0) {
        const size_t r = recvSome(p, n, deadline);
        p += r;
        n -= r;
    }
}

}  // namespace kvscope
