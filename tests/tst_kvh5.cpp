// KV files (core/kvio/kv_h5.h): exact round trips, what plain h5py sees, and refusal of bad files.
#include "testmain.h"

#include "common/error.h"
#include "kvio/kv_h5.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

#include <sys/resource.h>

using namespace kvscope;

Q_DECLARE_METATYPE(kvscope::DType)
Q_DECLARE_METATYPE(kvscope::KvShape)

namespace {

// A python3 that can import h5py: $KVSCOPE_PYTHON, then python3 on PATH, then the system one
// (a pyenv or venv python on PATH may lack the Debian python3-h5py module).
QString findH5pyPython()
{
    static const QString found = [] {
        QStringList candidates;
        const QString env = qEnvironmentVariable("KVSCOPE_PYTHON");
        if (!env.isEmpty()) candidates << env;
        candidates << "python3" << "/usr/bin/python3";
        for (const QString& py : candidates) {
            QProcess p;
            p.start(py, {"-c", "import h5py, numpy"});
            if (p.waitForFinished(60000) && p.exitStatus() == QProcess::NormalExit &&
                p.exitCode() == 0)
                return py;
        }
        return QString();
    }();
    return found;
}

// Runs a python script with the file path as sys.argv[1]; returns stdout, or a null string after
// recording the failure (stderr) in `error`.
QString runPython(const QString& script, const QString& path, QString* error)
{
    QProcess p;
    p.start(findH5pyPython(), {"-c", script, path});
    if (!p.waitForFinished(120000) || p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0) {
        *error = QString::fromUtf8(p.readAllStandardError());
        return QString();
    }
    return QString::fromUtf8(p.readAllStandardOutput());
}

// Deterministic contents that exercise signs, subnormal-free magnitudes and every position.
KvSet makeKv(const KvShape& shape, DType dtype)
{
    KvSet kv(shape, dtype);
    for (int l = 0; l < shape.numLayers; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            for (int h = 0; h < shape.numKvHeads; ++h)
                for (int t = 0; t < shape.numTokens; ++t)
                    for (int d = 0; d < shape.headDim; ++d)
                        kv.set(k, l, h, t, d,
                               float(std::sin(0.1 * (l * 7 + int(k) * 3 + h * 11 + t * 0.5 + d)) *
                                     (k == KvKind::Key ? 12.0 : 1.0)));
    kv.modelName = "SmolLM2-135M-Instruct";
    kv.modelFingerprint = "sha256:0123abcd";
    kv.context = "Grüße, 世界 — KV cache\nline two";
    kv.tokens.resize(size_t(shape.numTokens));
    for (int t = 0; t < shape.numTokens; ++t) kv.tokens[size_t(t)] = 1000 + 37 * t;
    return kv;
}

// Files in `dir` other than `keep`, e.g. leftover temporaries.
QStringList strayFiles(const QString& dir, const QStringList& keep)
{
    QStringList out;
    for (const QString& f : QDir(dir).entryList(QDir::Files | QDir::Dirs | QDir::NoDotAndDotDot))
        if (!keep.contains(f)) out << f;
    return out;
}

const KvShape kSmall{2, 2, 8, 12};

}  // namespace

class TestKvH5 : public QObject {
    Q_OBJECT
private slots:
    void roundTrip_data();
    void roundTrip();
    void roundTripWithoutTokens();
    void overwriteReplacesFile();
    void readInfo();
    void h5pySeesOurLayout_data();
    void h5pySeesOurLayout();
    void layerGroupNames_data();
    void layerGroupNames();
    void readsFileWrittenByH5py_data();
    void readsFileWrittenByH5py();
    void refusesBadFile_data();
    void refusesBadFile();
    void refusesBadWriteArguments_data();
    void refusesBadWriteArguments();
    void failedWriteIntoMissingDirectory();
    void failedRenameLeavesNoTemporary();
    void failedWriteKeepsOldFile();
    void concurrentReads();
};

void TestKvH5::roundTrip_data()
{
    QTest::addColumn<DType>("dtype");
    QTest::addColumn<int>("chunkTokens");
    QTest::addColumn<int>("gzip");
    QTest::addColumn<KvShape>("shape");
    QTest::newRow("float16") << DType::F16 << 256 << 0 << kSmall;
    QTest::newRow("bfloat16") << DType::BF16 << 256 << 0 << kSmall;
    QTest::newRow("float32") << DType::F32 << 256 << 0 << kSmall;
    QTest::newRow("float16 gzip 4, chunk 5") << DType::F16 << 5 << 4 << kSmall;
    QTest::newRow("bfloat16 gzip 9, chunk 1") << DType::BF16 << 1 << 9 << kSmall;
    QTest::newRow("float32 gzip 1, odd tokens") << DType::F32 << 64 << 1 << KvShape{3, 1, 6, 131};
    QTest::newRow("one token") << DType::F16 << 256 << 0 << KvShape{1, 1, 4, 1};
    QTest::newRow("all zeros, gzip 9 (largest expansion)") << DType::F16 << 4096 << 9
                                                           << KvShape{1, 1, 128, 4096};
}

void TestKvH5::roundTrip()
{
    QFETCH(DType, dtype);
    QFETCH(int, chunkTokens);
    QFETCH(int, gzip);
    QFETCH(KvShape, shape);
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const std::string path = dir.filePath("kv.h5").toStdString();
    KvSet kv = makeKv(shape, dtype);
    if (QByteArray(QTest::currentDataTag()).startsWith("all zeros"))
        for (int l = 0; l < shape.numLayers; ++l)
            for (KvKind k : {KvKind::Key, KvKind::Value}) std::memset(kv.data(k, l), 0, kv.tensorBytes());
    writeKvH5(kv, path, H5WriteOptions{chunkTokens, gzip});
    QCOMPARE(strayFiles(dir.path(), {"kv.h5"}), QStringList());

    const KvSet back = readKvH5(path);
    QCOMPARE(back.shape(), shape);
    QCOMPARE(back.dtype(), dtype);
    QVERIFY(sameBytes(kv, back));
    QCOMPARE(back.tokens, kv.tokens);
    QCOMPARE(QString::fromStdString(back.context), QString::fromStdString(kv.context));
    QCOMPARE(QString::fromStdString(back.modelName), QString("SmolLM2-135M-Instruct"));
    QCOMPARE(QString::fromStdString(back.modelFingerprint), QString("sha256:0123abcd"));
}

void TestKvH5::roundTripWithoutTokens()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("synthetic.h5").toStdString();
    SyntheticSpec spec;
    spec.shape = KvShape{2, 2, 16, 40};
    const KvSet kv = makeSyntheticKv(spec);
    QVERIFY(kv.tokens.empty() && kv.context.empty());
    writeKvH5(kv, path);
    const KvSet back = readKvH5(path);
    QVERIFY(sameBytes(kv, back));
    QVERIFY(back.tokens.empty());
    QVERIFY(back.context.empty());
    QCOMPARE(back.modelFingerprint, kv.modelFingerprint);
}

void TestKvH5::overwriteReplacesFile()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("kv.h5").toStdString();
    writeKvH5(makeKv(kSmall, DType::F32), path);
    const KvSet second = makeKv(KvShape{1, 1, 4, 3}, DType::BF16);
    writeKvH5(second, path);
    QVERIFY(sameBytes(readKvH5(path), second));
    QCOMPARE(strayFiles(dir.path(), {"kv.h5"}), QStringList());
}

void TestKvH5::readInfo()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("kv.h5").toStdString();
    writeKvH5(makeKv(KvShape{3, 2, 4, 9}, DType::BF16), path);
    const KvFileInfo info = readKvH5Info(path);
    QCOMPARE(info.shape, (KvShape{3, 2, 4, 9}));
    QCOMPARE(info.dtype, DType::BF16);
    QCOMPARE(info.version, kKvFileVersion);
    QCOMPARE(QString::fromStdString(info.modelName), QString("SmolLM2-135M-Instruct"));
    QCOMPARE(QString::fromStdString(info.modelFingerprint), QString("sha256:0123abcd"));
}

void TestKvH5::h5pySeesOurLayout_data()
{
    QTest::addColumn<DType>("dtype");
    QTest::addColumn<QString>("numpyDtype");
    QTest::addColumn<QString>("bitsView");
    QTest::addColumn<int>("gzip");
    QTest::newRow("float16 reads as <f2") << DType::F16 << "float16" << "<u2" << 0;
    QTest::newRow("float16 gzip reads as <f2") << DType::F16 << "float16" << "<u2" << 6;
    QTest::newRow("bfloat16 reads as uint16") << DType::BF16 << "uint16" << "<u2" << 0;
    QTest::newRow("float32 reads as <f4") << DType::F32 << "float32" << "<u4" << 0;
}

void TestKvH5::h5pySeesOurLayout()
{
    QFETCH(DType, dtype);
    QFETCH(QString, numpyDtype);
    QFETCH(QString, bitsView);
    QFETCH(int, gzip);
    if (findH5pyPython().isEmpty()) QSKIP("no python3 with h5py and numpy (apt install python3-h5py)");
    QTemporaryDir dir;
    const QString path = dir.filePath("kv.h5");
    const KvSet kv = makeKv(kSmall, dtype);
    writeKvH5(kv, path.toStdString(), H5WriteOptions{4, gzip});

    // One element per tensor at (h=1, t=7, d=5) as raw bits and as a float, plus the metadata.
    const QString script = QStringLiteral(R"(
import sys, json, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
k = f['layers/01/key']
v = f['layers/00/value']
out = {
  'dtype': str(k.dtype), 'is_f2': k.dtype == np.dtype('<f2'), 'shape': list(k.shape),
  'chunks': list(k.chunks), 'tensor_attrs': {a: str(k.attrs[a]) for a in k.attrs},
  'key_bits': int(k[1, 7, 5:6].view('%1')[0]), 'value_bits': int(v[1, 7, 5:6].view('%1')[0]),
  'key_float': float(k[1, 7, 5]) if k.dtype.kind == 'f' else None,
  'attrs': {a: (f.attrs[a].item() if hasattr(f.attrs[a], 'item') else f.attrs[a]) for a in f.attrs},
  'tokens_dtype': str(f['tokens'].dtype), 'tokens': f['tokens'][:].tolist(),
  'context': f['context'].asstr()[()], 'layers': sorted(f['layers'].keys()),
}
print(json.dumps(out))
)").arg(bitsView);
    QString error;
    const QString stdoutText = runPython(script, path, &error);
    QVERIFY2(!stdoutText.isNull(), qPrintable(error));
    const QJsonObject o = QJsonDocument::fromJson(stdoutText.toUtf8()).object();
    QVERIFY2(!o.isEmpty(), qPrintable(stdoutText));

    QCOMPARE(o["dtype"].toString(), numpyDtype);
    QCOMPARE(o["is_f2"].toBool(), dtype == DType::F16);
    QCOMPARE(o["shape"].toArray(), QJsonArray({2, 12, 8}));
    QCOMPARE(o["chunks"].toArray(), QJsonArray({1, 4, 8}));
    const QJsonObject tattrs = o["tensor_attrs"].toObject();
    if (dtype == DType::BF16)
        QCOMPARE(tattrs["dtype"].toString(), QString("bfloat16"));
    else
        QVERIFY(tattrs.isEmpty());

    // exact bits of the stored elements
    const size_t idx = (size_t(1) * 12 + 7) * 8 + 5;
    const size_t es = dtypeSize(dtype);
    uint32_t keyBits = 0, valueBits = 0;
    std::memcpy(&keyBits, kv.data(KvKind::Key, 1) + es * idx, es);
    std::memcpy(&valueBits, kv.data(KvKind::Value, 0) + es * idx, es);
    QCOMPARE(qint64(o["key_bits"].toDouble()), qint64(keyBits));
    QCOMPARE(qint64(o["value_bits"].toDouble()), qint64(valueBits));
    if (dtype != DType::BF16) {
        // python's repr of a float round-trips exactly through JSON
        QVERIFY(o["key_float"].toDouble() == double(kv.at(KvKind::Key, 1, 1, 7, 5)));
    }

    const QJsonObject a = o["attrs"].toObject();
    QCOMPARE(a["format"].toString(), QString("kvscope-kv"));
    QCOMPARE(a["version"].toInt(), kKvFileVersion);
    QCOMPARE(a["num_layers"].toInt(), 2);
    QCOMPARE(a["num_kv_heads"].toInt(), 2);
    QCOMPARE(a["head_dim"].toInt(), 8);
    QCOMPARE(a["num_tokens"].toInt(), 12);
    QCOMPARE(a["dtype"].toString(), QString(dtypeName(dtype)));
    QCOMPARE(a["model_name"].toString(), QString("SmolLM2-135M-Instruct"));
    QCOMPARE(a["model_fingerprint"].toString(), QString("sha256:0123abcd"));
    QCOMPARE(o["tokens_dtype"].toString(), QString("int32"));
    const QJsonArray tokens = o["tokens"].toArray();
    QCOMPARE(tokens.size(), 12);
    QCOMPARE(tokens[0].toInt(), 1000);
    QCOMPARE(tokens[11].toInt(), 1000 + 37 * 11);
    QCOMPARE(o["context"].toString(), QString::fromStdString(kv.context));
    QCOMPARE(o["layers"].toArray(), QJsonArray({"00", "01"}));
}

void TestKvH5::layerGroupNames_data()
{
    QTest::addColumn<int>("layers");
    QTest::addColumn<QString>("first");
    QTest::addColumn<QString>("last");
    QTest::newRow("1 layer") << 1 << "00" << "00";
    QTest::newRow("100 layers: two digits") << 100 << "00" << "99";
    QTest::newRow("101 layers: three digits") << 101 << "000" << "100";
}

void TestKvH5::layerGroupNames()
{
    QFETCH(int, layers);
    QFETCH(QString, first);
    QFETCH(QString, last);
    if (findH5pyPython().isEmpty()) QSKIP("no python3 with h5py and numpy (apt install python3-h5py)");
    QTemporaryDir dir;
    const QString path = dir.filePath("kv.h5");
    const KvSet kv = makeKv(KvShape{layers, 1, 2, 3}, DType::F16);
    writeKvH5(kv, path.toStdString());
    QString error;
    const QString out = runPython(
        "import sys, h5py; k = sorted(h5py.File(sys.argv[1], 'r')['layers'].keys()); "
        "print(len(k), k[0], k[-1])",
        path, &error);
    QVERIFY2(!out.isNull(), qPrintable(error));
    QCOMPARE(out.trimmed(), QString("%1 %2 %3").arg(layers).arg(first, last));
    QVERIFY(sameBytes(readKvH5(path.toStdString()), kv));
}

// A researcher builds a KV file in Python with plain numpy types (int64 attributes, float16
// arrays, no tokens of our writer's making); we read exactly what they stored.
// The metadata walk that runs before libhdf5 (kv_h5_bounds.h) must take both of h5py's layouts:
// the default one (old-style groups, version 1 object headers) and libver='latest' (version 2
// object headers; with 12 layers and 10 root attributes, /layers and the root's attributes are in
// dense storage, a fractal heap indexed by a v2 B-tree, one attribute a huge heap object).
void TestKvH5::readsFileWrittenByH5py_data()
{
    QTest::addColumn<QString>("libver");
    QTest::addColumn<int>("layers");
    QTest::newRow("default format") << "earliest" << 3;
    QTest::newRow("libver latest, dense groups and attributes") << "latest" << 12;
}

void TestKvH5::readsFileWrittenByH5py()
{
    QFETCH(QString, libver);
    QFETCH(int, layers);
    if (findH5pyPython().isEmpty()) QSKIP("no python3 with h5py and numpy (apt install python3-h5py)");
    QTemporaryDir dir;
    const QString path = dir.filePath("from_python.h5");
    QString error;
    const QString out = runPython(QStringLiteral(R"(
import sys, h5py, numpy as np
L, H, T, D = @LAYERS@, 2, 10, 4
libver = '@LIBVER@'
if libver == 'latest' and int(h5py.version.hdf5_version.split('.')[0]) >= 2:
    libver = ('v114', 'v114')  # HDF5 1.14's newest: 2.0's own is refused (tests/data/bad/kv_h5/hdf5-2.0-*)
with h5py.File(sys.argv[1], 'w', libver=libver) as f:
    f.attrs.update(format='kvscope-kv', version=1, model_name='py', num_layers=L,
                   num_kv_heads=H, head_dim=D, num_tokens=T, dtype='float16')
    if L > 8:
        f.attrs['note'] = 'a ninth attribute'
        f.attrs['table'] = np.arange(9000, dtype=np.int64)  # 72 KB
    f['tokens'] = np.arange(T, dtype=np.int64) * 3
    f['context'] = 'from python'
    for l in range(L):
        base = np.arange(H * T * D, dtype=np.float64).reshape(H, T, D)
        f.create_dataset('layers/%02d/key' % l, data=(base * 0.25 - 20 + l).astype('<f2'),
                         chunks=(1, 5, D), compression='gzip', shuffle=True)
        f['layers/%02d/value' % l] = (-base / 64 + l).astype('>f2')  # big-endian on purpose
print('ok')
)").replace("@LAYERS@", QString::number(layers)).replace("@LIBVER@", libver),
                                  path, &error);
    QVERIFY2(out.trimmed() == "ok", qPrintable(error));

    const KvSet kv = readKvH5(path.toStdString());
    QCOMPARE(kv.shape(), (KvShape{layers, 2, 4, 10}));
    QCOMPARE(kv.dtype(), DType::F16);
    QCOMPARE(QString::fromStdString(kv.modelName), QString("py"));
    QCOMPARE(QString::fromStdString(kv.modelFingerprint), QString());
    QCOMPARE(QString::fromStdString(kv.context), QString("from python"));
    QCOMPARE(kv.tokens.size(), size_t(10));
    QCOMPARE(kv.tokens[9], 27);
    for (int l = 0; l < layers; ++l)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 10; ++t)
                for (int d = 0; d < 4; ++d) {
                    const double base = (h * 10 + t) * 4 + d;  // all exact in fp16
                    QCOMPARE(double(kv.at(KvKind::Key, l, h, t, d)), base * 0.25 - 20 + l);
                    QCOMPARE(double(kv.at(KvKind::Value, l, h, t, d)), -base / 64 + l);
                }
}

void TestKvH5::refusesBadFile_data()
{
    // `python` edits a good float16 file (2 layers, shape kSmall) in place; the special names
    // "missing", "empty", "text", "truncated" build the file without python.
    QTest::addColumn<QString>("python");
    QTest::addColumn<QString>("reason");
    QTest::addColumn<bool>("infoFails");  // readKvH5Info sees it too (root attributes)
    QTest::newRow("missing file") << "missing" << "cannot open: No such file" << true;
    QTest::newRow("empty file") << "empty" << "empty file" << true;
    QTest::newRow("text file") << "text" << "not an HDF5 file" << true;
    QTest::newRow("truncated to half") << "truncated" << "truncated" << true;
    QTest::newRow("plain h5py file without our attributes")
        << "f.close(); f = h5py.File(p, 'w'); f['x'] = np.arange(3)"
        << "not a kvscope KV file" << true;
    QTest::newRow("other format") << "f.attrs['format'] = 'other'"
                                  << "attribute format: is \"other\", expected \"kvscope-kv\""
                                  << true;
    QTest::newRow("format with a line break") << "f.attrs['format'] = 'kv\\nscope'"
                                              << "attribute format: is \"kv\\x0ascope\"" << true;
    QTest::newRow("format not a string") << "f.attrs['format'] = 7"
                                         << "attribute format: expected a string" << true;
    QTest::newRow("newer version") << "f.attrs['version'] = 2"
                                   << "attribute version: file version 2 is newer" << true;
    QTest::newRow("version zero") << "f.attrs['version'] = 0" << "not a valid version" << true;
    QTest::newRow("version as text") << "f.attrs['version'] = '1'"
                                     << "attribute version: expected an integer" << true;
    QTest::newRow("missing head_dim") << "del f.attrs['head_dim']" << "attribute head_dim: missing"
                                      << true;
    QTest::newRow("absurd num_layers") << "f.attrs['num_layers'] = 100000" << "above the limit"
                                       << true;
    QTest::newRow("num_tokens beyond int") << "f.attrs['num_tokens'] = 2**40"
                                           << "attribute num_tokens: 1099511627776 is out of range"
                                           << true;
    QTest::newRow("negative num_tokens") << "f.attrs['num_tokens'] = -5" << "must be positive"
                                         << true;
    QTest::newRow("unknown dtype") << "f.attrs['dtype'] = 'int8'"
                                   << "attribute dtype: \"int8\" is not one of" << true;
    QTest::newRow("dtype disagrees with datasets")
        << "f.attrs['dtype'] = 'float32'"
        << "/layers/00/key: element type float16 does not match the file's dtype float32" << false;
    QTest::newRow("dims mismatch")
        << "del f['layers/01/value']; f.create_dataset('layers/01/value', (2, 13, 8), '<f2')"
        << "/layers/01/value: shape (2, 13, 8) does not match the attributes (2, 12, 8)" << false;
    QTest::newRow("rank mismatch")
        << "del f['layers/00/value']; f.create_dataset('layers/00/value', (2, 96), '<f2')"
        << "/layers/00/value: rank 2, expected 3" << false;
    QTest::newRow("num_layers larger than the file") << "f.attrs['num_layers'] = 3"
                                                     << "/layers/02: missing" << false;
    QTest::newRow("missing layer group") << "del f['layers/01']" << "/layers/01: missing" << false;
    QTest::newRow("missing value tensor") << "del f['layers/01/value']"
                                          << "/layers/01/value: missing" << false;
    QTest::newRow("tensor is a group")
        << "del f['layers/00/key']; f.create_group('layers/00/key')"
        << "/layers/00/key: cannot open as a dataset" << false;
    QTest::newRow("float64 tensor")
        << "x = f['layers/00/key'][()]; del f['layers/00/key']; f['layers/00/key'] = x.astype('f8')"
        << "/layers/00/key: element type float64 is not" << false;
    QTest::newRow("uint16 without bfloat16 tag")
        << "f.attrs['dtype'] = 'bfloat16'\n"
           "for l in ('00', '01'):\n"
           "  for k in ('key', 'value'):\n"
           "    n = 'layers/%s/%s' % (l, k); x = f[n][()].view('<u2'); del f[n]; f[n] = x"
        << "/layers/00/key: uint16 dataset without the attribute dtype=\"bfloat16\"" << false;
    QTest::newRow("filter only h5py has (lzf)")
        << "x = f['layers/00/key'][()]; del f['layers/00/key']\n"
           "f.create_dataset('layers/00/key', data=x, compression='lzf')"
        << "/layers/00/key: compressed with HDF5 filter 32000" << false;
    QTest::newRow("tensor never written")
        << "del f['layers/00/key']; f.create_dataset('layers/00/key', (2, 12, 8), '<f2')"
        << "/layers/00/key: no data stored" << false;
    QTest::newRow("tensor only partly written")
        << "del f['layers/01/key']\n"
           "d = f.create_dataset('layers/01/key', (2, 12, 8), '<f2', chunks=(1, 4, 8))\n"
           "d[0, :4] = 1"
        << "/layers/01/key: only 64 bytes stored for 384 bytes of values" << false;
    QTest::newRow("tokens of the wrong length")
        << "del f['tokens']; f['tokens'] = np.arange(3, dtype=np.int32)"
        << "/tokens: length 3 does not match num_tokens 12" << false;
    QTest::newRow("tokens as floats")
        << "del f['tokens']; f['tokens'] = np.zeros(12)"
        << "/tokens: element type float64, expected int32" << false;
    QTest::newRow("missing tokens") << "del f['tokens']" << "/tokens: missing" << false;
    QTest::newRow("context not a string") << "del f['context']; f['context'] = 5"
                                          << "/context: expected a string" << false;
}

void TestKvH5::refusesBadFile()
{
    QFETCH(QString, python);
    QFETCH(QString, reason);
    QFETCH(bool, infoFails);
    QTemporaryDir dir;
    const QString path = dir.filePath("bad.h5");
    if (python == "missing") {
        // nothing written
    } else if (python == "empty") {
        QFile f(path);
        QVERIFY(f.open(QIODevice::WriteOnly));
    } else if (python == "text") {
        QFile f(path);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write("layer,head,token,value\n0,0,0,1.5\n");
    } else if (python == "truncated") {
        writeKvH5(makeKv(kSmall, DType::F16), path.toStdString());
        QFile f(path);
        QVERIFY(f.resize(f.size() / 2));
    } else {
        if (findH5pyPython().isEmpty())
            QSKIP("no python3 with h5py and numpy (apt install python3-h5py)");
        writeKvH5(makeKv(kSmall, DType::F16), path.toStdString());
        QString error;
        const QString out = runPython(
            "import sys, h5py, numpy as np\np = sys.argv[1]\nf = h5py.File(p, 'r+')\n" + python +
                "\nf.close()\nprint('edited')",
            path, &error);
        QVERIFY2(out.trimmed() == "edited", qPrintable(error));
    }

    const std::string p = path.toStdString();
    try {
        readKvH5(p);
        QFAIL("readKvH5 accepted the file");
    } catch (const Error& e) {
        const QString msg = QString::fromUtf8(e.what());
        QVERIFY2(msg.startsWith(path + ": "), qPrintable(msg));
        QVERIFY2(msg.contains(reason), qPrintable(msg));
        QVERIFY2(!msg.contains('\n'), qPrintable(msg));
    }
    bool infoThrew = false;
    try {
        readKvH5Info(p);
    } catch (const Error& e) {
        infoThrew = true;
        QVERIFY2(QString::fromUtf8(e.what()).startsWith(path + ": "), e.what());
    }
    QCOMPARE(infoThrew, infoFails);
}

void TestKvH5::refusesBadWriteArguments_data()
{
    QTest::addColumn<int>("chunkTokens");
    QTest::addColumn<int>("gzip");
    QTest::addColumn<int>("numTokenIds");
    QTest::addColumn<QString>("reason");
    QTest::newRow("chunkTokens 0") << 0 << 0 << 12 << "chunkTokens 0 must be >= 1";
    QTest::newRow("gzip 10") << 256 << 10 << 12 << "gzipLevel 10 is outside 0-9";
    QTest::newRow("gzip -1") << 256 << -1 << 12 << "gzipLevel -1";
    QTest::newRow("token ids for a different length") << 256 << 0 << 5 << "5 token ids for 12 tokens";
}

void TestKvH5::refusesBadWriteArguments()
{
    QFETCH(int, chunkTokens);
    QFETCH(int, gzip);
    QFETCH(int, numTokenIds);
    QFETCH(QString, reason);
    QTemporaryDir dir;
    const QString path = dir.filePath("kv.h5");
    KvSet kv = makeKv(kSmall, DType::F16);
    kv.tokens.resize(size_t(numTokenIds));
    try {
        writeKvH5(kv, path.toStdString(), H5WriteOptions{chunkTokens, gzip});
        QFAIL("no exception");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(path + ": "), e.what());
        QVERIFY2(QString(e.what()).contains(reason), e.what());
    }
    QCOMPARE(strayFiles(dir.path(), {}), QStringList());
    // an empty set is refused too
    QVERIFY_THROWS_EXCEPTION(Error, writeKvH5(KvSet(), path.toStdString()));
}

void TestKvH5::failedWriteIntoMissingDirectory()
{
    QTemporaryDir dir;
    const QString path = dir.filePath("no/such/dir/kv.h5");
    try {
        writeKvH5(makeKv(kSmall, DType::F16), path.toStdString());
        QFAIL("no exception");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(path + ": "), e.what());
        QVERIFY2(QString(e.what()).contains("No such file or directory"), e.what());
    }
    QCOMPARE(strayFiles(dir.path(), {}), QStringList());
}

// The whole file is written, then the rename fails (the target is a directory): the temporary
// goes away and the directory keeps its contents.
void TestKvH5::failedRenameLeavesNoTemporary()
{
    QTemporaryDir dir;
    QVERIFY(QDir(dir.path()).mkdir("target"));
    QFile keep(dir.filePath("target/keep.txt"));
    QVERIFY(keep.open(QIODevice::WriteOnly));
    keep.write("precious");
    keep.close();
    const QString path = dir.filePath("target");
    try {
        writeKvH5(makeKv(kSmall, DType::F32), path.toStdString());
        QFAIL("no exception");
    } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith(path + ": cannot replace"), e.what());
    }
    QCOMPARE(strayFiles(dir.path(), {"target"}), QStringList());
    QCOMPARE(strayFiles(path, {"keep.txt"}), QStringList());
    QVERIFY(keep.open(QIODevice::ReadOnly));
    QCOMPARE(keep.readAll(), QByteArray("precious"));
}

// The disk "fills up" halfway through the new file (RLIMIT_FSIZE): the write throws, no
// temporary remains, and the good file that was there reads back unchanged.
void TestKvH5::failedWriteKeepsOldFile()
{
    QTemporaryDir dir;
    const QString path = dir.filePath("kv.h5");
    const KvSet good = makeKv(kSmall, DType::F16);
    writeKvH5(good, path.toStdString());
    const qint64 goodSize = QFileInfo(path).size();

    SyntheticSpec spec;
    spec.shape = KvShape{4, 4, 64, 512};  // 2 MiB per tensor kind, well past the limit below
    const KvSet big = makeSyntheticKv(spec);

    struct rlimit old {};
    QCOMPARE(getrlimit(RLIMIT_FSIZE, &old), 0);
    auto oldHandler = std::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
    struct rlimit small = old;
    small.rlim_cur = 256 * 1024;
    QCOMPARE(setrlimit(RLIMIT_FSIZE, &small), 0);
    QString message;
    try {
        writeKvH5(big, path.toStdString());
    } catch (const Error& e) {
        message = QString::fromUtf8(e.what());
    }
    setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, oldHandler);

    QVERIFY2(!message.isEmpty(), "the write past the file size limit did not fail");
    QVERIFY2(message.startsWith(path + ": "), qPrintable(message));
    QVERIFY2(message.contains("File too large"), qPrintable(message));
    QVERIFY2(!message.contains('\n'), qPrintable(message));
    QCOMPARE(strayFiles(dir.path(), {"kv.h5"}), QStringList());
    QCOMPARE(QFileInfo(path).size(), goodSize);
    QVERIFY(sameBytes(readKvH5(path.toStdString()), good));
}

// Reads from several threads at once (a GUI worker next to a CLI pipeline) all succeed.
void TestKvH5::concurrentReads()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("kv.h5").toStdString();
    const KvSet kv = makeKv(KvShape{4, 2, 16, 64}, DType::BF16);
    writeKvH5(kv, path, H5WriteOptions{16, 1});
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
        threads.emplace_back([&] {
            for (int r = 0; r < 5; ++r) {
                try {
                    if (sameBytes(readKvH5(path), kv)) ++ok;
                } catch (const Error&) {
                }
            }
        });
    for (auto& t : threads) t.join();
    QCOMPARE(ok.load(), 20);
}

KVSCOPE_TEST_MAIN(TestKvH5)
#include "tst_kvh5.moc"
