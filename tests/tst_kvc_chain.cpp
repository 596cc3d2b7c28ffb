// Chained .kvc files (issue 30: the backward-adaptive basis, "adapt_basis", as a codec path;
// core/codec/container_chain.h): the writer stores, per level, exactly the chain eval codes; the
// reader decodes a level to the bytes eval decodes; every reader refuses a chunk out of its chain
// with a one-line error; KvcChainDecoder decodes chunk by chunk to the whole level's bytes; reset
// points restart the chain (a chunk after one decodes without the chunks before it, and the level
// may change there); verify checks them; bench codec codes the same chain; a chunk server streams
// one level over a real socket to a KvcChainDecoder; the CUDA front end refuses them. Synthetic caches only (links
// kvscope_transport and kvscope_bench, no model).
#include "testmain.h"
#include "stream_cases.h"

#include "bench/bench.h"

#include "codec/container.h"
#include "codec/container_chain.h"
#include "codec/gpu_decode.h"
#include "codec/transform_adapt.h"
#include "codec/verify.h"
#include "codec_cases.h"
#include "common/error.h"
#include "transport/client.h"
#include "transport/server.h"
#include "transport/store.h"

#include <QTemporaryDir>

#include <cstring>
#include <memory>
#include <vector>

using namespace kvscope;

namespace {

constexpr int kTokens = 600, kChunk = 128;  // 5 chunks, the last of 88 tokens

}  // namespace

class TestKvcChain : public QObject {
    Q_OBJECT
private:
    QTemporaryDir m_dir;
    KvSet m_kv;
    CodecParams m_p;      // adapt_basis on (prior 200 tokens, 3 sweeps), 3 levels
    CodecParams m_plain;  // the same calibrated model without it
    AdaptiveSettings m_as;
    std::vector<uint8_t> m_file;
    // Reset points: chunks of 64 tokens (10, the last of 24), the chain restarting every 4 chunks
    // (at chunks 0, 4, 8), and the same without resets.
    CodecParams m_reset, m_noReset, m_plain64;
    AdaptiveSettings m_asReset;
    std::vector<uint8_t> m_resetFile;

    static bool sameTokens(const KvSet& a, const KvSet& b, int t0, int n)
    {
        const KvShape& sh = a.shape();
        const size_t row = size_t(sh.headDim) * dtypeSize(a.dtype());
        for (int l = 0; l < sh.numLayers; ++l)
            for (KvKind k : {KvKind::Key, KvKind::Value})
                for (int h = 0; h < sh.numKvHeads; ++h) {
                    const size_t off = (size_t(h) * sh.numTokens + size_t(t0)) * row;
                    if (std::memcmp(a.data(k, l) + off, b.data(k, l) + off, size_t(n) * row) != 0) return false;
                }
        return true;
    }

    std::string path(const char* name) const { return (m_dir.path() + "/" + name).toStdString(); }

private slots:
    void initTestCase()
    {
        QVERIFY(m_dir.isValid());
        const KvShape shape{2, 2, 16, kTokens};
        const KvSet calib = kvscope_test::transformCache(shape, 1);
        m_kv = kvscope_test::transformCache(shape, 2);
        for (int t = 0; t < kTokens; ++t) m_kv.tokens.push_back(int32_t((t * 7919 + 3) % 49152));
        m_kv.modelFingerprint = "chain-test";
        m_plain = kvscope_test::transformParams(m_kv, TransformSettings{}, {0.08, 0.03, 0.01}, kChunk);
        kvscope_test::calibrateTransform(m_plain, {&calib}, m_kv);
        m_p = m_plain;
        m_p.profile.transform.adaptPriorTokens = m_as.priorTokens = 200;
        m_p.profile.transform.adaptSweeps = m_as.sweeps = 3;
        prepareTransform(m_p, m_kv, "test cache");
        QVERIFY(m_p.chainsChunks() && !m_plain.chainsChunks());
        writeKvc(m_kv, m_p, m_file);

        m_plain64 = m_plain;
        m_plain64.profile.chunkTokens = 64;
        prepareTransform(m_plain64, m_kv, "test cache");
        m_noReset = m_p;
        m_noReset.profile.chunkTokens = 64;
        prepareTransform(m_noReset, m_kv, "test cache");
        m_reset = m_noReset;
        m_reset.profile.transform.adaptResetChunks = 4;
        prepareTransform(m_reset, m_kv, "test cache");
        m_asReset = chainSettings(m_reset);
        QCOMPARE(m_asReset.resetChunks, 4);
        QCOMPARE(m_reset.numChunks(), 10);
        writeKvc(m_kv, m_reset, m_resetFile);
    }

    // Every level of the file is the chain eval codes (encodeAdaptiveChunks), byte for byte, and
    // decodes to the bytes eval decodes (decodeAdaptiveChunks); the header says 2.3 and the
    // transform section carries the chain's prior and sweeps.
    void writesTheChainEvalCodes()
    {
        QCOMPARE(int(m_file[10] | m_file[11] << 8), 3);  // version_minor
        const auto reader = KvcReader::fromBuffer(m_file.data(), m_file.size(), "chain.kvc");
        const CodecParams& rp = reader->params();
        QVERIFY(rp.chainsChunks());
        QCOMPARE(rp.profile.transform.adaptPriorTokens, 200.0);
        QCOMPARE(rp.profile.transform.adaptSweeps, 3);
        QCOMPARE(rp.numChunks(), 5);
        QCOMPARE(rp.numLevels(), 3);
        int differ = 0;
        for (int l = 1; l <= 3; ++l) {
            const auto chain = encodeAdaptiveChunks(m_p, m_kv, l, m_as);
            for (int c = 0; c < 5; ++c) {
                QVERIFY2(reader->readChunk(c, l) == chain[size_t(c)], qPrintable(QString("chunk %1 level %2").arg(c).arg(l)));
                const auto plain = encodeChunk(m_plain, m_kv, c, l, nullptr);
                if (c == 0) QVERIFY(plain == chain[0]);  // chunk 0: the calibrated model
                differ += c > 0 && plain != chain[size_t(c)];
            }
            KvSet evalDecoded(m_kv.shape(), m_kv.dtype());
            decodeAdaptiveChunks(m_p, chain, l, m_as, evalDecoded);
            QVERIFY(sameBytes(reader->decodeAll({l}), evalDecoded));
        }
        QCOMPARE(differ, 12);  // every later chunk is coded in its own basis
        // The same cache without adapt_basis: a 2.1 file, as before this option existed.
        std::vector<uint8_t> plainFile;
        writeKvc(m_kv, m_plain, plainFile);
        QCOMPARE(int(plainFile[10] | plainFile[11] << 8), 1);
        QVERIFY(!KvcReader::fromBuffer(plainFile.data(), plainFile.size(), "plain.kvc")->params().chainsChunks());
    }

    // The transform section's version 3 carries the chain's prior and sweeps (FORMAT.md); a model
    // without the option stays version 1, and a version-3 model out of range is refused.
    void modelVersion3()
    {
        std::vector<uint8_t> b, plain;
        serializeTransformModel(*m_p.transform, b);
        serializeTransformModel(*m_plain.transform, plain);
        QCOMPARE(int(b[4] | b[5] << 8), 3);
        QCOMPARE(int(plain[4] | plain[5] << 8), 1);
        QCOMPARE(b.size(), plain.size() + 12);
        const TransformModel m = parseTransformModel(b.data(), b.size(), m_kv.shape(), "model");
        QCOMPARE(m.settings.adaptPriorTokens, 200.0);
        QCOMPARE(m.settings.adaptSweeps, 3);
        std::memset(b.data() + 28, 0, 4);  // sweeps: after magic, version, 6 switches, sink, recent, prior
        kvscope_test::expectError("model", [&] { parseTransformModel(b.data(), b.size(), m_kv.shape(), "model"); },
                                  "adapt_basis prior_tokens or sweeps out of range");
    }

    // A reader that gets chunk n > 0 without chunks 0..n-1 of its level refuses it in one line.
    void refusesChunksOutsideTheirChain()
    {
        const auto reader = KvcReader::fromBuffer(m_file.data(), m_file.size(), "chain.kvc");
        KvSet out(m_kv.shape(), m_kv.dtype());
        reader->decodeChunkInto(0, 2, out);  // chunk 0 needs nothing before it
        kvscope_test::expectError("chain.kvc", [&] { reader->decodeChunkInto(3, 2, out); },
                                  "chunk 3 of an adaptive-basis file (transform.adapt_basis) decodes only after chunks 0..2 at level 2");
        const auto payload = reader->readChunk(1, 1);
        kvscope_test::expectError("chain.kvc", [&] { reader->decodePayloadInto(1, 1, payload.data(), payload.size(), out); },
                                  "decodes only after chunks 0..0 at level 1");
        kvscope_test::expectError("chain.kvc", [&] { reader->decodeAll({1, 1, 2, 1, 1}); }, "chain at one level");
        kvscope_test::expectError("x", [&] { decodeChunk(m_p, payload.data(), payload.size(), 1, 1, nullptr, out, "x"); },
                                  "decodes only after");
        kvscope_test::expectError("transform.adapt_basis", [&] { encodeChunk(m_p, m_kv, 2, 1, nullptr); }, "encode whole levels");

        KvcChainDecoder chain(*reader);
        const auto c0 = reader->readChunk(0, 2), c1 = reader->readChunk(1, 2), c1l1 = reader->readChunk(1, 1);
        kvscope_test::expectError("chain.kvc", [&] { chain.push(1, 2, c1.data(), c1.size(), out); }, "(expected chunk 0)");
        kvscope_test::expectError("chain.kvc", [&] { chain.push(0, 4, c0.data(), c0.size(), out); }, "no such level");
        QVERIFY(!chain.push(0, 2, c0.data(), c0.size(), out));
        QCOMPARE(chain.level(), 2);
        kvscope_test::expectError("chain.kvc", [&] { chain.push(1, 1, c1l1.data(), c1l1.size(), out); },
                                  "this chain decodes level 2");
        std::vector<uint8_t> bad = c1;
        bad[bad.size() / 2] ^= 4;
        kvscope_test::expectError("chain.kvc", [&] { chain.push(1, 2, bad.data(), bad.size(), out); }, "CRC mismatch");
        QCOMPARE(chain.next(), 1);

        std::vector<uint8_t> plainFile;
        writeKvc(m_kv, m_plain, plainFile);
        const auto plain = KvcReader::fromBuffer(plainFile.data(), plainFile.size(), "plain.kvc");
        kvscope_test::expectError("plain.kvc", [&] { KvcChainDecoder{*plain}; }, "do not chain");
    }

    // Issue 30, stepwise decoding: each chunk pushed decodes at once, to the tokens the whole
    // level's decode gives, byte for byte, and touches no token of a later chunk. A consumer that
    // gives up a chunk (a stream recomputing it from text) keeps the chunks before it; without
    // reset points the chain then takes no more.
    void decodesChunkByChunk()
    {
        const auto reader = KvcReader::fromBuffer(m_file.data(), m_file.size(), "chain.kvc");
        for (int level : {1, 2, 3}) {
            const KvSet whole = reader->decodeAll({level});
            KvcChainDecoder chain(*reader);
            KvSet out(m_kv.shape(), m_kv.dtype());
            const KvSet zero(m_kv.shape(), m_kv.dtype());
            for (int c = 0; c < 5; ++c) {
                const auto b = reader->readChunk(c, level);
                QCOMPARE(chain.push(c, level, b.data(), b.size(), out), c == 4);
                const int t0 = c * kChunk, n = m_p.chunkLength(c);
                QVERIFY2(sameTokens(out, whole, t0, n), qPrintable(QString("chunk %1 level %2").arg(c).arg(level)));
                if (c < 4) QVERIFY(sameTokens(out, zero, t0 + n, kTokens - t0 - n));
            }
            QVERIFY(sameBytes(out, whole));
        }
        KvcChainDecoder chain(*reader);
        KvSet out(m_kv.shape(), m_kv.dtype());
        for (int c = 0; c < 3; ++c) {
            const auto b = reader->readChunk(c, 2);
            chain.push(c, 2, b.data(), b.size(), out);
        }
        QCOMPARE(chain.giveUp(3), 5);
        QVERIFY(chain.done());
        const auto b3 = reader->readChunk(3, 2);
        kvscope_test::expectError("chain.kvc", [&] { chain.push(3, 2, b3.data(), b3.size(), out); }, "decoded its last chunk");
    }

    // Issue 30, reset points ("reset_chunks": 4): every level of the file is eval's chain with the
    // same resets, byte for byte, and decodes to its bytes; a reset chunk is the calibrated
    // codec's chunk and decodes alone; a chunk after a reset decodes without the chunks before the
    // reset; the level may change at a reset and only there.
    void resetPoints()
    {
        QCOMPARE(int(m_resetFile[10] | m_resetFile[11] << 8), 3);
        const auto reader = KvcReader::fromBuffer(m_resetFile.data(), m_resetFile.size(), "reset.kvc");
        QCOMPARE(reader->params().profile.transform.adaptResetChunks, 4);
        const AdaptiveSettings noReset = chainSettings(m_noReset);
        for (int l = 1; l <= 3; ++l) {
            const auto eval = encodeAdaptiveChunks(m_reset, m_kv, l, m_asReset);
            const auto unbroken = encodeAdaptiveChunks(m_noReset, m_kv, l, noReset);
            for (int c = 0; c < 10; ++c) {
                QVERIFY2(reader->readChunk(c, l) == eval[size_t(c)], qPrintable(QString("chunk %1 level %2").arg(c).arg(l)));
                const bool start = c % 4 == 0;
                QCOMPARE(eval[size_t(c)] == encodeChunk(m_plain64, m_kv, c, l, nullptr), start);  // resets: calibrated
                QCOMPARE(eval[size_t(c)] == unbroken[size_t(c)], c < 4);  // the first segment is the unbroken chain
            }
            KvSet evalDecoded(m_kv.shape(), m_kv.dtype());
            decodeAdaptiveChunks(m_reset, eval, l, m_asReset, evalDecoded);
            QVERIFY(sameBytes(reader->decodeAll({l}), evalDecoded));
        }
        // Chunk 4 decodes alone; chunk 5 only after chunk 4.
        const KvSet whole2 = reader->decodeAll({2});
        KvSet out(m_kv.shape(), m_kv.dtype());
        reader->decodeChunkInto(4, 2, out);
        QVERIFY(sameTokens(out, whole2, 4 * 64, 64));
        kvscope_test::expectError("reset.kvc", [&] { reader->decodeChunkInto(5, 2, out); },
                                  "chunk 5 of an adaptive-basis file (transform.adapt_basis) decodes only after chunks 4..4 at level 2");
        // A chain decoder that gave up chunks 0..3 resumes at chunk 4 and changes level at chunk 8.
        const std::vector<int> mix = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3};
        const KvSet mixed = reader->decodeAll(mix);
        KvcChainDecoder chain(*reader);
        QCOMPARE(chain.giveUp(1), 4);
        KvSet stepped(m_kv.shape(), m_kv.dtype());
        for (int c = 4; c < 10; ++c) {
            const auto b = reader->readChunk(c, mix[size_t(c)]);
            if (c == 6) {
                const auto other = reader->readChunk(c, 3);
                kvscope_test::expectError("reset.kvc", [&] { chain.push(c, 3, other.data(), other.size(), stepped); },
                                          "may change at reset points (every 4 chunks)");
            }
            chain.push(c, mix[size_t(c)], b.data(), b.size(), stepped);
            QVERIFY2(sameTokens(stepped, mixed, c * 64, m_reset.chunkLength(c)), qPrintable(QString("chunk %1").arg(c)));
        }
        QVERIFY(chain.done());
        QVERIFY(sameTokens(mixed, whole2, 4 * 64, 4 * 64));  // chunks 4..7 at level 2: as in the level-2 decode
        kvscope_test::expectError("reset.kvc", [&] { reader->decodeAll({1, 1, 1, 1, 2, 2, 3, 3, 3, 3}); },
                                  "chunk 6 at level 3 after chunk 5 at level 2");
        QVERIFY(verifyKvc(*reader).ok());
    }

    // The transform section's version 4 carries reset_chunks after the sweeps (a chain without
    // resets stays version 3); out of range is refused.
    void modelVersion4()
    {
        std::vector<uint8_t> b, v3;
        serializeTransformModel(*m_reset.transform, b);
        serializeTransformModel(*m_noReset.transform, v3);
        QCOMPARE(int(b[4] | b[5] << 8), 4);
        QCOMPARE(int(v3[4] | v3[5] << 8), 3);
        QCOMPARE(b.size(), v3.size() + 4);
        QCOMPARE(parseTransformModel(b.data(), b.size(), m_kv.shape(), "model").settings.adaptResetChunks, 4);
        QCOMPARE(parseTransformModel(v3.data(), v3.size(), m_kv.shape(), "model").settings.adaptResetChunks, 0);
        std::memset(b.data() + 32, 0, 4);  // reset_chunks: after magic, version, 6 switches, sink, recent, prior, sweeps
        kvscope_test::expectError("model", [&] { parseTransformModel(b.data(), b.size(), m_kv.shape(), "model"); },
                                  "adapt_basis reset_chunks 0 out of range");
    }

    // bench codec on an adapt_basis profile codes the chain the file holds (with and without
    // resets), and its calibrated peer (withoutChain) the calibrated codec's chunks.
    void benchCodesTheChain()
    {
        BenchOptions b;
        b.repeats = 1;
        b.threads = 1;
        for (const auto& [params, file] : {std::make_pair(&m_p, &m_file), std::make_pair(&m_reset, &m_resetFile)}) {
            const auto reader = KvcReader::fromBuffer(file->data(), file->size(), "chain.kvc");
            const CodecBenchResult chain = benchCodec(m_kv, *params, 2, b);
            uint64_t inFile = 0;
            for (int c = 0; c < params->numChunks(); ++c) inFile += reader->chunkBytes(c, 2);
            QCOMPARE(chain.bytes, inFile);
            QVERIFY(chain.encodeMBps > 0 && chain.decodeMBps > 0);
            const CodecParams cal = withoutChain(*params);
            QVERIFY(!cal.chainsChunks() && params->chainsChunks());
            uint64_t calibrated = 0;
            for (int c = 0; c < params->numChunks(); ++c)
                calibrated += encodeChunk(params == &m_p ? m_plain : m_plain64, m_kv, c, 2, nullptr).size();
            QCOMPARE(benchCodec(m_kv, cal, 2, b).bytes, calibrated);
        }
    }

    // The CUDA front end refuses a chained file before touching a device (no GPU needed).
    void cudaDecoderRefusesChains()
    {
        const auto reader = KvcReader::fromBuffer(m_file.data(), m_file.size(), "chain.kvc");
        kvscope_test::expectError("GPU decode", [&] { gpuCodec(reader->params(), nullptr); }, "decodes on the CPU");
    }

    // verify decodes every level's chain; a damaged chunk is reported at its place, its level's
    // later chunks checked by CRC only, the other levels still decoded.
    void verifyChecksEveryChain()
    {
        const auto reader = KvcReader::fromBuffer(m_file.data(), m_file.size(), "chain.kvc");
        const KvcVerifyReport ok = verifyKvc(*reader);
        QVERIFY(ok.ok());
        QCOMPARE(ok.checked, 15);
        std::vector<uint8_t> damaged = m_file;
        const uint64_t at = [&] {  // chunk 2 level 1's payload: after chunks 0, 1 at every level and chunk 2's none
            uint64_t off = kKvcHeaderSize;
            for (int c = 0; c < 2; ++c)
                for (int l = 1; l <= 3; ++l) off += reader->chunkBytes(c, l);
            return off;
        }();
        damaged[size_t(at + reader->chunkBytes(2, 1) / 2)] ^= 1;
        const auto bad = KvcReader::fromBuffer(damaged.data(), damaged.size(), "bad.kvc");
        const KvcVerifyReport r = verifyKvc(*bad);
        QCOMPARE(int(r.damaged.size()), 1);
        QCOMPARE(r.damaged[0].chunk, 2);
        QCOMPARE(r.damaged[0].level, 1);
        QVERIFY2(r.damaged[0].reason.find("bad.kvc: chunk 2 level 1: CRC mismatch") == 0, r.damaged[0].reason.c_str());
        QCOMPARE(r.checked, 15);
        QVERIFY(sameBytes(bad->decodeAll({2}), reader->decodeAll({2})));
    }

    // The chunk server serves a chained file; a client that fetches its skeleton and then every
    // chunk of one level in order over a real socket decodes the bytes the file decodes to.
    void streamsOneLevelThroughTheServer()
    {
        const std::string file = path("chain.kvc");
        writeKvc(m_kv, m_p, file);
        auto server = std::make_unique<ChunkServer>(std::shared_ptr<ChunkStore>(openStore(file)), ServerOptions{});
        server->start();
        const auto reader = KvcReader::openFile(file);
        const std::string ctx = kvcContextKey(*reader);
        ChunkClient client("127.0.0.1", server->port());
        const Reply sk = client.request(kvscope_test::request(FrameType::SkeletonRequest, ctx, CodecId::Transform), 1 << 22,
                                        monoSeconds() + 10);
        QCOMPARE(int(sk.type), int(FrameType::Skeleton));
        const auto remote = KvcReader::fromSkeleton(sk.payload, "remote");
        QVERIFY(remote->params().chainsChunks());
        for (int level : {1, 3}) {
            KvcChainDecoder chain(*remote);
            KvSet assembled(m_kv.shape(), m_kv.dtype());
            bool complete = false;
            for (int c = 0; c < remote->params().numChunks(); ++c) {
                const Reply r = client.request(kvscope_test::request(FrameType::ChunkRequest, ctx, CodecId::Transform, c, level),
                                               remote->chunkBytes(c, level), monoSeconds() + 10);
                QCOMPARE(int(r.type), int(FrameType::Chunk));
                complete = chain.push(c, level, r.payload.data(), r.payload.size(), assembled);
                QCOMPARE(complete, c + 1 == remote->params().numChunks());
            }
            QVERIFY(complete);
            QVERIFY(sameBytes(assembled, reader->decodeAll({level})));
        }
        // Random access stays refused on the client's side too.
        const Reply r2 = client.request(kvscope_test::request(FrameType::ChunkRequest, ctx, CodecId::Transform, 2, 1),
                                        remote->chunkBytes(2, 1), monoSeconds() + 10);
        KvSet out(m_kv.shape(), m_kv.dtype());
        kvscope_test::expectError("remote", [&] { remote->decodePayloadInto(2, 1, r2.payload.data(), r2.payload.size(), out); },
                                  "decodes only after chunks 0..1 at level 1");
    }
};

KVSCOPE_TEST_MAIN(TestKvcChain)
#include "tst_kvc_chain.moc"
