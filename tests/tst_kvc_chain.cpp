// Chained .kvc files (issue 30: the backward-adaptive basis, "adapt_basis", as a codec path;
// core/codec/container_chain.h): the writer stores, per level, exactly the chain eval codes; the
// reader decodes a level to the bytes eval decodes; every reader refuses a chunk out of its chain
// with a one-line error; verify checks them; a chunk server streams one level over a real socket
// to a KvcChainDecoder; the CUDA front end refuses them. Synthetic caches only (links
// kvscope_transport, no model).
#include "testmain.h"
#include "stream_cases.h"

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

        KvcChainDecoder chain(*reader, 2);
        const auto c0 = reader->readChunk(0, 2), c1 = reader->readChunk(1, 2), c1l1 = reader->readChunk(1, 1);
        kvscope_test::expectError("chain.kvc", [&] { chain.add(1, 2, c1.data(), c1.size(), out); }, "(expected chunk 0)");
        QVERIFY(!chain.add(0, 2, c0.data(), c0.size(), out));
        kvscope_test::expectError("chain.kvc", [&] { chain.add(1, 1, c1l1.data(), c1l1.size(), out); },
                                  "this chain decodes level 2");
        std::vector<uint8_t> bad = c1;
        bad[bad.size() / 2] ^= 4;
        kvscope_test::expectError("chain.kvc", [&] { chain.add(1, 2, bad.data(), bad.size(), out); }, "CRC mismatch");
        QCOMPARE(chain.next(), 1);

        std::vector<uint8_t> plainFile;
        writeKvc(m_kv, m_plain, plainFile);
        const auto plain = KvcReader::fromBuffer(plainFile.data(), plainFile.size(), "plain.kvc");
        kvscope_test::expectError("plain.kvc", [&] { KvcChainDecoder(*plain, 1); }, "do not chain");
    }

    // A consumer that gives up the rest of a level (a stream falling back to text) decodes the
    // chunks it holds: the same tokens as the whole level's decode; the chain then takes no more.
    void decodesTheHeldPrefix()
    {
        const auto reader = KvcReader::fromBuffer(m_file.data(), m_file.size(), "chain.kvc");
        const KvSet whole = reader->decodeAll({2});
        KvcChainDecoder chain(*reader, 2);
        KvSet out(m_kv.shape(), m_kv.dtype());
        for (int c = 0; c < 3; ++c) {
            const auto b = reader->readChunk(c, 2);
            QVERIFY(!chain.add(c, 2, b.data(), b.size(), out));
        }
        chain.decodeHeld(out);
        QVERIFY(chain.closed());
        const KvShape& sh = m_kv.shape();
        const size_t row = size_t(sh.headDim) * dtypeSize(m_kv.dtype());
        for (int l = 0; l < sh.numLayers; ++l)
            for (KvKind k : {KvKind::Key, KvKind::Value})
                for (int h = 0; h < sh.numKvHeads; ++h) {
                    const size_t off = size_t(h) * sh.numTokens * row;
                    QVERIFY(std::memcmp(out.data(k, l) + off, whole.data(k, l) + off, 3 * kChunk * row) == 0);
                    // chunk 3 was not decoded: still zero
                    std::vector<uint8_t> zero(row, 0);
                    QVERIFY(std::memcmp(out.data(k, l) + off + 3 * kChunk * row, zero.data(), row) == 0);
                }
        const auto b3 = reader->readChunk(3, 2);
        kvscope_test::expectError("chain.kvc", [&] { chain.add(3, 2, b3.data(), b3.size(), out); }, "decoded already");
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
            KvcChainDecoder chain(*remote, level);
            KvSet assembled(m_kv.shape(), m_kv.dtype());
            bool complete = false;
            for (int c = 0; c < remote->params().numChunks(); ++c) {
                const Reply r = client.request(kvscope_test::request(FrameType::ChunkRequest, ctx, CodecId::Transform, c, level),
                                               remote->chunkBytes(c, level), monoSeconds() + 10);
                QCOMPARE(int(r.type), int(FrameType::Chunk));
                complete = chain.add(c, level, r.payload.data(), r.payload.size(), assembled);
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
