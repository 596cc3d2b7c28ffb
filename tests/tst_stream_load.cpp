// The chunk server under load: 16 streaming clients sharing one shaped bottleneck get max-min fair
// shares while misbehaving peers (a reader that stops reading, garbage and oversized frames,
// disconnects mid-reply) come and go, memory stays bounded; 16 clients keep fetching whole
// contexts in time while 200 slowloris peers and a connect flood try to lock them out; and the
// Redis store serves reads while other contexts are pushed concurrently.
#include "testmain.h"
#include "stream_cases.h"

#include "codec/container.h"
#include "codec/profile.h"
#include "common/error.h"
#include "kv/kv_set.h"
#include "transport/client.h"
#include "transport/link.h"
#include "transport/protocol.h"
#include "transport/server.h"
#include "transport/store.h"

#include <QFile>
#include <QProcess>
#include <QTemporaryDir>

#include <algorithm>
#include <atomic>
#include <deque>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace kvscope;
using kvscope_test::encode;
using kvscope_test::freePort;
using kvscope_test::request;
using kvscope_test::syntheticKv;
using kvscope_test::TestRedis;

namespace {

long rssKiB()
{
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return 0;
}

// Bytes a client had read by monotonic time t, from its (time, cumulative bytes) samples.
double bytesAt(const std::vector<std::pair<double, double>>& samples, double t)
{
    double b = 0;
    for (const auto& [when, total] : samples) {
        if (when > t) break;
        b = total;
    }
    return b;
}

}  // namespace

class TestStreamLoad : public QObject {
    Q_OBJECT
    QTemporaryDir m_dir;
    std::string path(const char* name) const { return (m_dir.path() + "/" + name).toStdString(); }

private slots:
    void initTestCase() { QVERIFY(m_dir.isValid()); }

    void fairShares()
    {
        constexpr int kClients = 16;
        constexpr double kRate = 10e6;  // 80 Mbit/s shared by everyone
        const KvSet kv = syntheticKv(8, 4, 512, 11);  // fp16 chunks of 16 tokens: 128 KiB each
        const std::string file = encode(kv, CodecId::Fp16, 16, path("load.kvc"));
        const auto reader = KvcReader::openFile(file);
        const std::string ctx = kvcContextKey(*reader);
        const int chunks = reader->params().numChunks();
        ServerOptions o;
        o.link = LinkSchedule::constant(kRate);
        o.ioTimeout = 1.0;  // a peer that stops reading is dropped after a second
        o.maxConnections = 64;
        auto server = std::make_unique<ChunkServer>(std::shared_ptr<ChunkStore>(openStore(file)), o);
        server->start();
        const int port = server->port();
        const long rss0 = rssKiB();

        std::atomic<bool> stop{false};
        std::vector<std::vector<std::pair<double, double>>> progress(kClients);
        std::vector<std::string> failures(kClients);
        std::vector<std::thread> threads;
        for (int c = 0; c < kClients; ++c)
            threads.emplace_back([&, c] {
                try {
                    ChunkClient client("127.0.0.1", port, ClientOptions{2.0, 5.0});
                    double total = 0;
                    int next = c % chunks;
                    for (int k = 0; k < 2; ++k) client.send(request(FrameType::ChunkRequest, ctx, CodecId::Fp16, next++ % chunks, 1));
                    while (!stop) {
                        ArrivalLog log;
                        const Reply r = client.receive(1 << 20, monoSeconds() + 30, &log);
                        if (r.type != FrameType::Chunk) throw Error("unexpected reply");
                        for (const auto& [t, b] : log) progress[size_t(c)].emplace_back(t, total + double(b));
                        total += double(r.wireBytes);
                        client.send(request(FrameType::ChunkRequest, ctx, CodecId::Fp16, next++ % chunks, 1));
                    }
                } catch (const std::exception& e) {
                    failures[size_t(c)] = e.what();
                }
            });

        // The misbehaving peers, over and over while the good ones stream.
        std::atomic<int> garbage{0}, oversized{0}, cut{0};
        std::vector<Socket> stuck;  // peers that asked and stopped reading, kept open
        std::thread bad([&] {
            int round = 0;
            while (!stop) {
                try {
                    if (round % 4 == 0 && stuck.size() < 4) {
                        Socket s = Socket::connectTcp("127.0.0.1", port, 1);
                        for (int k = 0; k < 8; ++k) {
                            const std::vector<uint8_t> f = encodeRequest(request(FrameType::ChunkRequest, ctx, CodecId::Fp16, k, 1));
                            s.sendAll(f.data(), f.size(), monoSeconds() + 1);
                        }
                        stuck.push_back(std::move(s));
                    } else if (round % 4 == 1) {
                        Socket s = Socket::connectTcp("127.0.0.1", port, 1);
                        const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
                        s.sendAll(http, sizeof http - 1, monoSeconds() + 1);
                        ++garbage;
                    } else if (round % 4 == 2) {
                        Socket s = Socket::connectTcp("127.0.0.1", port, 1);
                        const std::vector<uint8_t> h = frameHeader(FrameType::ChunkRequest, 0xFFFFFFF0u);
                        s.sendAll(h.data(), h.size(), monoSeconds() + 1);
                        ++oversized;
                    } else {
                        Socket s = Socket::connectTcp("127.0.0.1", port, 1);
                        const std::vector<uint8_t> f = encodeRequest(request(FrameType::ChunkRequest, ctx, CodecId::Fp16, 0, 1));
                        s.sendAll(f.data(), f.size(), monoSeconds() + 1);
                        char buf[4096];
                        size_t got = 0;
                        while (got < 20000) got += s.recvSome(buf, sizeof buf, monoSeconds() + 5);
                        ++cut;  // closes mid-reply
                    }
                } catch (const std::exception&) {
                }
                ++round;
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        });

        const double t0 = monoSeconds();
        // After every client has started and the pipes are full; long enough that what sits in socket
        // buffers (a few hundred KiB per connection) is small against each share.
        const double from = t0 + 1.0, to = t0 + 11.0;
        std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(to + 0.2))));
        const long rssPeak = rssKiB();
        stop = true;
        bad.join();
        stuck.clear();
        for (auto& t : threads) t.join();
        for (int c = 0; c < kClients; ++c) QVERIFY2(failures[size_t(c)].empty(), failures[size_t(c)].c_str());

        std::vector<double> got(kClients);
        double sum = 0;
        for (int c = 0; c < kClients; ++c) {
            got[size_t(c)] = bytesAt(progress[size_t(c)], to) - bytesAt(progress[size_t(c)], from);
            sum += got[size_t(c)];
        }
        const double fair = sum / kClients;  // max-min fair share: every good client is backlogged
        double worst = 0;
        for (int c = 0; c < kClients; ++c) {
            const double dev = got[size_t(c)] / fair - 1;
            worst = std::max(worst, std::abs(dev));
            std::printf("LOAD client %2d  %7.3f MB/s  %+6.2f%% of the fair share\n", c, got[size_t(c)] / (to - from) / 1e6,
                        100 * dev);
        }
        const double capacity = kRate * (to - from);
        std::printf("LOAD 16 clients: %.2f MB/s of %.2f MB/s (%.1f%%), worst deviation from the fair share %.2f%%; "
                    "misbehaving peers: %d garbage, %d oversized, %d cut mid-reply, %zu stopped reading; RSS %+ld KiB\n",
                    sum / (to - from) / 1e6, kRate / 1e6, 100 * sum / capacity, 100 * worst, garbage.load(),
                    oversized.load(), cut.load(), size_t(4), rssPeak - rss0);
        QVERIFY2(worst < 0.10, std::to_string(worst).c_str());
        QVERIFY2(sum > 0.85 * capacity, std::to_string(sum / capacity).c_str());  // nobody stalled the link
        QVERIFY(garbage > 5 && oversized > 5 && cut > 5);
        QVERIFY(server->stats().errorFrames >= uint64_t(garbage + oversized));
        QVERIFY2(rssPeak - rss0 < 256 * 1024, std::to_string(rssPeak - rss0).c_str());  // bounded: no growth with time
        QVERIFY(!server->dead());
    }

    // Issue 32: 200 slowloris peers (3 bytes of a frame header, then silence; reconnecting when
    // dropped) and a connect flood (400 plain connections held open, a new one every 10 ms) run
    // while 16 clients each fetch the whole context over and over, every run on a new connection.
    // Default limits but a 2 s frame timeout, so the test sees several generations of slowloris.
    // Every run must get every chunk byte-exact, and 95 % of runs within 2 s: 4.8x the fair-share time of a round
    // (16 x 1 MiB at 40 MB/s = 0.42 s), where before the server refused everyone for 30 s.
    void hostilePeers()
    {
        constexpr int kClients = 16, kSlow = 200, kFlood = 400;
        constexpr double kRate = 40e6, kRunDeadline = 2.0, kAttackFirst = 1.0, kLegitSeconds = 8.0;
        const KvSet kv = syntheticKv(8, 4, 128, 12);  // fp16 chunks of 16 tokens: 8 x 128 KiB
        const std::string file = encode(kv, CodecId::Fp16, 16, path("hostile.kvc"));
        const auto reader = KvcReader::openFile(file);
        const std::string ctx = kvcContextKey(*reader);
        const int chunks = reader->params().numChunks();
        std::vector<std::vector<uint8_t>> expected;
        for (int ch = 0; ch < chunks; ++ch) expected.push_back(reader->readChunk(ch, 1));
        ServerOptions o;
        o.link = LinkSchedule::constant(kRate);
        o.frameTimeout = 2.0;
        QVERIFY(o.maxConnections < kSlow + kFlood + kClients);  // the table overflows: eviction is exercised
        auto server = std::make_unique<ChunkServer>(std::shared_ptr<ChunkStore>(openStore(file)), o);
        server->start();
        const int port = server->port();

        std::atomic<bool> stop{false};
        std::atomic<int> slowConnects{0}, slowTold{0}, floodConnects{0};
        std::thread slowloris([&] {
            std::vector<Socket> peers(kSlow);
            while (!stop) {
                for (Socket& s : peers) {
                    if (stop) break;
                    try {
                        if (!s.valid()) {
                            s = Socket::connectTcp("127.0.0.1", port, 0.5);
                            s.sendAll("KVS", 3, monoSeconds() + 0.5);
                            ++slowConnects;
                        } else if (s.waitReadable(monoSeconds())) {
                            uint8_t h[kFrameHeaderBytes];
                            s.recvAll(h, sizeof h, monoSeconds() + 0.5);  // the error frame's header
                            FrameType t;
                            uint32_t n;
                            std::string why;
                            if (parseFrameHeader(h, &t, &n, &why) && t == FrameType::Error) ++slowTold;
                            s.close();
                        }
                    } catch (const std::exception&) {
                        s.close();
                    }
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        });
        std::thread flood([&] {
            std::deque<Socket> held;
            while (!stop) {
                try {
                    held.push_back(Socket::connectTcp("127.0.0.1", port, 0.5));
                    ++floodConnects;
                    if (held.size() > size_t(kFlood)) held.pop_front();
                } catch (const std::exception&) {
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
        });
        std::this_thread::sleep_for(std::chrono::duration<double>(kAttackFirst));

        std::vector<int> runs(kClients), hits(kClients);
        std::vector<double> worst(kClients);
        std::vector<std::string> failures(kClients);
        std::vector<std::thread> clients;
        const double until = monoSeconds() + kLegitSeconds;
        for (int c = 0; c < kClients; ++c)
            clients.emplace_back([&, c] {
                while (monoSeconds() < until) {
                    const double t0 = monoSeconds();
                    ++runs[size_t(c)];
                    try {
                        ChunkClient client("127.0.0.1", port, ClientOptions{kRunDeadline, kRunDeadline});
                        for (int ch = 0; ch < chunks; ++ch)
                            client.send(request(FrameType::ChunkRequest, ctx, CodecId::Fp16, (ch + c) % chunks, 1));
                        for (int ch = 0; ch < chunks; ++ch) {
                            const Reply r = client.receive(1 << 20, t0 + kRunDeadline);
                            if (r.type != FrameType::Chunk || r.payload != expected[size_t((ch + c) % chunks)])
                                throw Error("chunk " + std::to_string((ch + c) % chunks) + ": bytes differ");
                        }
                        ++hits[size_t(c)];
                        worst[size_t(c)] = std::max(worst[size_t(c)], monoSeconds() - t0);
                    } catch (const NetError& e) {
                        if (e.kind() != NetError::Timeout)
                            failures[size_t(c)] = "client " + std::to_string(c) + " run " +
                                                  std::to_string(runs[size_t(c)]) + ": " + e.what();
                        // a run past its deadline is a miss, counted against the hit rate below
                    } catch (const std::exception& e) {
                        failures[size_t(c)] = "client " + std::to_string(c) + " run " + std::to_string(runs[size_t(c)]) +
                                              ": " + e.what();
                    }
                }
            });
        for (auto& t : clients) t.join();
        const ServerStats during = server->stats();
        stop = true;
        slowloris.join();
        flood.join();

        int allRuns = 0, allHits = 0;
        double slowest = 0;
        for (int c = 0; c < kClients; ++c) {
            allRuns += runs[size_t(c)];
            allHits += hits[size_t(c)];
            slowest = std::max(slowest, worst[size_t(c)]);
        }
        std::printf("HOSTILE 16 clients: %d of %d runs in time (hit %.3f), slowest %.3f s of %.1f s; %d slowloris connects "
                    "(%d told why), %d flood connects; server: %llu evicted, %llu refused, %llu frame timeouts, %llu "
                    "open at the end\n",
                    allHits, allRuns, double(allHits) / allRuns, slowest, kRunDeadline, slowConnects.load(), slowTold.load(),
                    floodConnects.load(), (unsigned long long)during.evicted, (unsigned long long)during.refused,
                    (unsigned long long)during.frameTimeouts, (unsigned long long)during.open);
        for (int c = 0; c < kClients; ++c) QVERIFY2(failures[size_t(c)].empty(), failures[size_t(c)].c_str());
        for (int c = 0; c < kClients; ++c) {
            QVERIFY2(runs[size_t(c)] >= 4, std::to_string(runs[size_t(c)]).c_str());
            // nobody locked out: each client keeps most of its runs in time
            QVERIFY2(hits[size_t(c)] >= 0.75 * runs[size_t(c)],
                     ("client " + std::to_string(c) + ": " + std::to_string(hits[size_t(c)]) + " of " +
                      std::to_string(runs[size_t(c)]))
                         .c_str());
        }
        // The goal: hit >= 0.95 across the 16 clients. Not 1.0: the test runs 600 hostile
        // sockets, 16 clients and the server on the same 2 cores, and on a machine busy with other
        // jobs a run or two in 300 (one in CI, slowest 1.97 s) misses the 2 s deadline by CPU alone.
        QVERIFY2(allHits >= 0.95 * allRuns, (std::to_string(allHits) + " of " + std::to_string(allRuns)).c_str());
        QVERIFY(during.evicted > 0);                          // the flood filled the table
        QVERIFY(during.frameTimeouts >= uint64_t(2 * kSlow));  // every slowloris dropped, more than once
        QVERIFY(slowTold > 0);                                 // with an error frame saying why
        QVERIFY(during.open <= uint64_t(o.maxConnections));
        QVERIFY(!server->dead());
    }

    void redisConcurrent()
    {
        if (!TestRedis::installed()) QSKIP("redis-server is not installed (installer/setup.sh installs it)");
        const TestRedis redis(m_dir.path());
        QVERIFY2(redis.up(), "redis-server did not start");
        const std::string url = redis.url("loadtest");

        // Context 0 is there first; 1..4 are pushed while 8 clients read 0 through a server.
        std::vector<std::string> files;
        for (int k = 0; k < 5; ++k)
            files.push_back(encode(syntheticKv(4, 2, 600, uint64_t(20 + k)), CodecId::CacheGen, 128,
                                   path(("redis" + std::to_string(k) + ".kvc").c_str())));
        pushKvcToRedis(*KvcReader::openFile(files[0]), url);
        std::shared_ptr<ChunkStore> store(openStore(url));
        auto server = std::make_unique<ChunkServer>(store, ServerOptions{});
        server->start();
        const auto r0 = KvcReader::openFile(files[0]);
        const std::string ctx0 = kvcContextKey(*r0);

        std::vector<std::string> failures(12);
        std::atomic<int> reads{0};
        std::vector<std::thread> threads;
        for (int k = 1; k < 5; ++k)
            threads.emplace_back([&, k] {
                try {
                    pushKvcToRedis(*KvcReader::openFile(files[size_t(k)]), url);
                } catch (const std::exception& e) {
                    failures[size_t(k)] = e.what();
                }
            });
        for (int c = 0; c < 8; ++c)
            threads.emplace_back([&, c] {
                try {
                    ChunkClient client("127.0.0.1", server->port());
                    for (int round = 0; round < 3; ++round)
                        for (int ch = 0; ch < r0->params().numChunks(); ++ch) {
                            const int level = 1 + (ch + c + round) % r0->params().numLevels();
                            client.send(request(FrameType::ChunkRequest, ctx0, CodecId::CacheGen, ch, level));
                            const Reply r = client.receive(1 << 24, monoSeconds() + 10);
                            if (r.payload != r0->readChunk(ch, level)) throw Error("chunk bytes differ");
                            ++reads;
                        }
                } catch (const std::exception& e) {
                    failures[size_t(4 + c)] = e.what();
                }
            });
        for (auto& t : threads) t.join();
        for (const std::string& f : failures) QVERIFY2(f.empty(), f.c_str());
        QCOMPARE(reads.load(), 8 * 3 * r0->params().numChunks());
        // Everything pushed concurrently is there, byte for byte.
        QCOMPARE(int(store->contents().size()), 5);
        for (const std::string& f : files) {
            const auto r = KvcReader::openFile(f);
            const std::string ctx = kvcContextKey(*r);
            QVERIFY(store->skeleton(ctx, CodecId::CacheGen) == r->skeleton());
            for (int ch = 0; ch < r->params().numChunks(); ++ch)
                for (int l = 1; l <= r->params().numLevels(); ++l) QVERIFY(store->chunk(ctx, CodecId::CacheGen, ch, l) == r->readChunk(ch, l));
        }
    }
};

KVSCOPE_TEST_MAIN(TestStreamLoad)
#include "tst_stream_load.moc"
