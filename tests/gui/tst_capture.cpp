// GUI tests of the Model & context dock and of capture through the worker: the
// architecture of a real llama2.c checkpoint, a capture that fills the distributions view and can
// be saved, cancel, and the longest gap between event-loop ticks while a capture runs.
#include "gui_testmain.h"
#include "event_loop_ticks.h"

#include "kvio/kv_h5.h"
#include "layer_stats_view.h"
#include "main_window.h"
#include "model/model.h"
#include "model_context_view.h"

#include <QComboBox>
#include <QElapsedTimer>
#include <QFile>
#include <QMessageBox>
#include <QPushButton>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTimer>

using kvscope::MainWindow;

namespace {

// Long enough for a capture with the default model on a loaded shared machine (40 s alone).
constexpr int kTimeoutMs = 300000;
const QString kShortContext = QStringLiteral("Once upon a time, there was a little girl named Lily. She liked to play.");

}  // namespace

class TestCapture : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void modelViewShowsArchitecture();
    void captureFillsDistributions();
    void cancelDropsTheCapture();
    void eventLoopStaysResponsive();
    void aboutNamesLibraries();

private:
    bool openTinyModel(MainWindow& window);
    QString m_model, m_tokenizer;
    QTemporaryDir m_dir;
};

void TestCapture::initTestCase()
{
    const QString modelDir = kvscopeSharedDir() + QStringLiteral("/models/aidreams260K");
    m_model = modelDir + QStringLiteral("/aidreams260K.bin");
    m_tokenizer = modelDir + QStringLiteral("/tok512.bin");
    QVERIFY(m_dir.isValid());
}

bool TestCapture::openTinyModel(MainWindow& window)
{
    QSignalSpy shown(&window, &MainWindow::modelShown);
    QSignalSpy errors(&window, &MainWindow::errorOccurred);
    window.openModel(m_model, m_tokenizer);
    for (QElapsedTimer t; !t.isValid() || t.elapsed() < kTimeoutMs;) {
        if (!t.isValid()) t.start();
        if (shown.count() || errors.count()) break;
        QTest::qWait(20);
    }
    if (errors.count()) qWarning("%s", qPrintable(errors.at(0).at(0).toString()));
    return shown.count() == 1;
}

void TestCapture::modelViewShowsArchitecture()
{
    if (!QFile::exists(m_model) || !QFile::exists(m_tokenizer)) QSKIP("aidreams260K test checkpoint absent");
    MainWindow window(false);
    window.show();
    QVERIFY(openTinyModel(window));
    kvscope::ModelContextView* view = window.contextView();
    QCOMPARE(view->modelField(QStringLiteral("format")), QStringLiteral("llama2.c"));
    QCOMPARE(view->modelField(QStringLiteral("layers")), QStringLiteral("4"));
    QCOMPARE(view->modelField(QStringLiteral("heads")), QStringLiteral("4"));
    QCOMPARE(view->modelField(QStringLiteral("kv_heads")), QStringLiteral("4"));
    QCOMPARE(view->modelField(QStringLiteral("head_dim")), QStringLiteral("16"));
    QCOMPARE(view->modelField(QStringLiteral("hidden")), QStringLiteral("64 / 172"));
    QCOMPARE(view->modelField(QStringLiteral("vocab")), QStringLiteral("512"));
    QVERIFY2(view->modelField(QStringLiteral("parameters")).startsWith(QLatin1String("230976 (")),
             qPrintable(view->modelField(QStringLiteral("parameters"))));
    QVERIFY2(view->modelField(QStringLiteral("tokenizer")).contains(QLatin1String("tokenizer.bin")),
             qPrintable(view->modelField(QStringLiteral("tokenizer"))));
    QVERIFY(!view->modelField(QStringLiteral("fingerprint")).isEmpty());

    // Token count and boundaries match the tokenizer, template (BOS) included.
    const auto model = kvscope::Model::open(QFile::encodeName(m_model).toStdString(),
                                            QFile::encodeName(m_tokenizer).toStdString());
    const std::vector<int32_t> ids = model->contextTokens(kShortContext.toStdString());
    QString pieces;
    for (int32_t id : ids) pieces += QString::fromStdString(model->tokenizer().decode({id}, false));
    view->setContext(kShortContext, QStringLiteral("test"));
    QTRY_COMPARE_WITH_TIMEOUT(view->tokenCount(), int(ids.size()), kTimeoutMs);
    QCOMPARE(view->tokenViewText(), pieces);
}

void TestCapture::captureFillsDistributions()
{
    if (!QFile::exists(m_model) || !QFile::exists(m_tokenizer)) QSKIP("aidreams260K test checkpoint absent");
    MainWindow window(false);
    window.show();
    QVERIFY(openTinyModel(window));
    window.contextView()->setContext(kShortContext, QStringLiteral("test"));
    QTRY_VERIFY_WITH_TIMEOUT(window.contextView()->tokenCount() > 0, kTimeoutMs);
    const int tokens = window.contextView()->tokenCount();
    QVERIFY(window.contextView()->captureButton()->isEnabled());

    QSignalSpy shown(&window, &MainWindow::dataShown);
    QSignalSpy errors(&window, &MainWindow::errorOccurred);
    QTest::mouseClick(window.contextView()->captureButton(), Qt::LeftButton);
    QVERIFY(window.isLoading());
    QTRY_COMPARE_WITH_TIMEOUT(shown.count() + errors.count(), 1, kTimeoutMs);
    QCOMPARE(errors.count(), 0);
    QCOMPARE(window.statsView()->layerCombo()->count(), 4);
    QCOMPARE(int(window.statsView()->stats().size()), 8);  // K and V of 4 layers
    QCOMPARE(window.summaryField(QStringLiteral("tokens")), QString::number(tokens));
    QCOMPARE(window.summaryField(QStringLiteral("head_dim")), QStringLiteral("16"));
    QCOMPARE(window.summaryField(QStringLiteral("model")), QStringLiteral("aidreams260K"));
    QVERIFY2(window.windowTitle().startsWith(QLatin1String("test on aidreams260K")), qPrintable(window.windowTitle()));

    // Save the captured cache and read it back.
    const QString path = m_dir.filePath(QStringLiteral("captured.h5"));
    QSignalSpy saved(&window, &MainWindow::kvSaved);
    window.saveKv(path);
    QTRY_COMPARE_WITH_TIMEOUT(saved.count() + errors.count(), 1, kTimeoutMs);
    QCOMPARE(errors.count(), 0);
    const kvscope::KvSet kv = kvscope::readKvH5(QFile::encodeName(path).toStdString());
    QCOMPARE(kv.shape().numLayers, 4);
    QCOMPARE(kv.shape().numTokens, tokens);
    QCOMPARE(int(kv.tokens.size()), tokens);
    QCOMPARE(QString::fromStdString(kv.context), kShortContext);
}

void TestCapture::cancelDropsTheCapture()
{
    if (!QFile::exists(m_model) || !QFile::exists(m_tokenizer)) QSKIP("aidreams260K test checkpoint absent");
    MainWindow window(false);
    window.show();
    QVERIFY(openTinyModel(window));
    window.contextView()->setContext(kShortContext, QStringLiteral("test"));
    QSignalSpy shown(&window, &MainWindow::dataShown);
    QSignalSpy cancelled(&window, &MainWindow::loadCancelled);
    window.captureContext();
    QVERIFY(window.isLoading());
    window.cancelLoad();
    // Cancel is immediate for the UI: the worker's result, whenever it comes, is dropped.
    QCOMPARE(cancelled.count(), 1);
    QVERIFY(!window.isLoading());
    QTest::qWait(1000);
    QCOMPARE(shown.count(), 0);
    QVERIFY(!window.hasData());
    QVERIFY(window.contextView()->captureButton()->isEnabled());

    // The session stays usable.
    window.captureContext();
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, kTimeoutMs);
    QCOMPARE(window.statsView()->layerCombo()->count(), 4);
}

void TestCapture::eventLoopStaysResponsive()
{
    // The default model when installed (a real prefill of a few seconds), else the tiny one.
    const bool useDefault = QFile::exists(QFile::decodeName(kvscope::defaultModelPath().c_str()));
    if (!useDefault && (!QFile::exists(m_model) || !QFile::exists(m_tokenizer)))
        QSKIP("neither the default model (kvscope-cli fetch-model) nor the aidreams260K checkpoint is present");
    MainWindow window(false);
    window.show();
    QSignalSpy modelShown(&window, &MainWindow::modelShown);
    if (useDefault) {
        window.openModel(QString());
        QTRY_COMPARE_WITH_TIMEOUT(modelShown.count(), 1, kTimeoutMs);
        window.openContext(QStringLiteral("long_1k"));
        // About 300 tokens: long enough to span many progress ticks, short enough for CI.
        window.contextView()->setContext(window.contextView()->contextText().left(1500), QStringLiteral("long_1k"));
    } else {
        QVERIFY(openTinyModel(window));
        window.contextView()->setContext(kShortContext, QStringLiteral("test"));
    }
    QTRY_VERIFY_WITH_TIMEOUT(window.contextView()->tokenCount() > 0, kTimeoutMs);

    QSignalSpy shown(&window, &MainWindow::dataShown);
    EventLoopTicks ticks;
    QElapsedTimer wall;
    wall.start();
    window.captureContext();
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, kTimeoutMs);
    const qint64 elapsed = wall.elapsed();
    qInfo("event loop during capture+statistics of %d tokens (%s, %lld ms, %d ticks; busy limit %lld ms, gap limit %lld ms): %s",
          window.contextView()->tokenCount(), useDefault ? "default model" : "aidreams260K", elapsed, ticks.ticks,
          kMaxBusyMs, kMaxGapMs, qPrintable(ticks.summary()));
    QVERIFY2(ticks.maxBusy <= kMaxBusyMs, qPrintable(ticks.summary()));
    QVERIFY2(ticks.maxGap <= kMaxGapMs, qPrintable(ticks.summary()));
}

void TestCapture::aboutNamesLibraries()
{
    MainWindow window(false);
    QString text;
    // The About box is modal; read it once it shows, then close it.
    QTimer::singleShot(0, &window, [&text] {
        for (QWidget* w : QApplication::topLevelWidgets())
            if (auto* box = qobject_cast<QMessageBox*>(w)) {
                text = box->text();
                box->accept();
            }
    });
    window.showAbout();
    for (const char* needle : {"Qt ", "libtorch 1.", "HDF5 1.", "CUDA decode library: "})
        QVERIFY2(text.contains(QLatin1String(needle)), qPrintable(text));
}

KVSCOPE_GUI_TEST_MAIN(TestCapture)
#include "tst_capture.moc"
