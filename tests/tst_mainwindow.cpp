// The kvscope main window as a user meets it: open a KV file (dialog path, drag & drop, recent
// list), see its summary and plots, get a clear error for a bad file, cancel a long load, keep a
// responsive UI while loading, and the --screenshot mode of the executable.
#include "gui/gui_testmain.h"

#include "layer_stats_view.h"
#include "main_window.h"
#include "plot_style.h"

#include "kvio/kv_h5.h"
#include "kv/kv_stats.h"
#include "kvscope/config.h"

#include <qcustomplot.h>

#include <QComboBox>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QElapsedTimer>
#include <QLabel>
#include <QMenu>
#include <QMessageBox>
#include <QMimeData>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSplitter>
#include <QTemporaryDir>

#include <algorithm>
#include <set>

using kvscope::KvKind;
using kvscope::MainWindow;

namespace {

constexpr int kLoadTimeoutMs = 60000;

// Large enough (~130 MB fp16) that loading lasts long enough to cancel it halfway.
kvscope::SyntheticSpec largeSpec()
{
    kvscope::SyntheticSpec spec;
    spec.shape = {16, 8, 128, 4096};
    spec.seed = 3;
    return spec;
}

}  // namespace

class TestMainWindow : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void init();
    void openKvFileShowsSummaryAndPlots();
    void loaderMatchesComputeAllStats();
    void nonHdf5FileReportsError();
    void missingFileReportsError();
    void errorBoxWhenModal();
    void demoTitleSaysSynthetic();
    void dropKvFileOpensIt();
    void dropOtherFileIsRefused();
    void recentFilesPersist();
    void layoutPersists();
    void cancelDuringStatistics();
    void cancelDuringRead();
    void staysResponsiveWhileLoading();
    void aboutNamesVersions();
    void screenshotOption_data();
    void screenshotOption();

private:
    bool waitForData(MainWindow& window);

    QTemporaryDir m_dir;
    QString m_kvPath;     // 3 layers, 2 KV heads, head_dim 16, 100 tokens, fp16
    QString m_bogusPath;  // text with a .h5 name
};

void TestMainWindow::initTestCase()
{
    QVERIFY(m_dir.isValid());
    kvscope::SyntheticSpec spec;
    spec.shape = {3, 2, 16, 100};
    spec.seed = 7;
    const kvscope::KvSet kv = kvscope::makeSyntheticKv(spec);
    m_kvPath = m_dir.filePath(QStringLiteral("small.h5"));
    kvscope::writeKvH5(kv, QFile::encodeName(m_kvPath).toStdString());

    m_bogusPath = m_dir.filePath(QStringLiteral("bogus.h5"));
    QFile bogus(m_bogusPath);
    QVERIFY(bogus.open(QIODevice::WriteOnly));
    bogus.write("this is not an HDF5 file, only its name says so\n");
}

void TestMainWindow::init()
{
    QSettings().clear();  // isolated by QStandardPaths test mode; start every test from nothing
}

bool TestMainWindow::waitForData(MainWindow& window)
{
    QSignalSpy shown(&window, &MainWindow::dataShown);
    return shown.wait(kLoadTimeoutMs) || shown.count() > 0;
}

void TestMainWindow::openKvFileShowsSummaryAndPlots()
{
    MainWindow window(false);
    window.show();
    QSignalSpy shown(&window, &MainWindow::dataShown);
    window.openFile(m_kvPath);
    QVERIFY(window.isLoading());
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, kLoadTimeoutMs);
    QVERIFY(!window.isLoading());

    QCOMPARE(window.summaryField(QStringLiteral("tokens")), QStringLiteral("100"));
    QCOMPARE(window.summaryField(QStringLiteral("layers")), QStringLiteral("3"));
    QCOMPARE(window.summaryField(QStringLiteral("kv_heads")), QStringLiteral("2"));
    QCOMPARE(window.summaryField(QStringLiteral("head_dim")), QStringLiteral("16"));
    QCOMPARE(window.summaryField(QStringLiteral("channels")), QStringLiteral("32"));
    QCOMPARE(window.summaryField(QStringLiteral("dtype")), QStringLiteral("float16"));
    QCOMPARE(window.summaryField(QStringLiteral("model")), QStringLiteral("synthetic"));
    // K and V, 3 layers, 2 heads x 100 tokens x 16 dims, 2 bytes each
    QVERIFY2(window.summaryField(QStringLiteral("kv_bytes")).endsWith(QLatin1String("(38400 bytes)")),
             qPrintable(window.summaryField(QStringLiteral("kv_bytes"))));
    QVERIFY(window.summaryField(QStringLiteral("file_bytes"))
                .contains(QStringLiteral("(%1 bytes)").arg(QFileInfo(m_kvPath).size())));
    // A file outside the samples' tree shows by its name: no machine paths on screen.
    QCOMPARE(window.summaryField(QStringLiteral("source")), QFileInfo(m_kvPath).fileName());
    QVERIFY(window.windowTitle().contains(QLatin1String("small.h5")));

    kvscope::LayerStatsView* view = window.statsView();
    QCOMPARE(view->layerCombo()->count(), 3);
    for (int i = 0; i < view->layerPlot()->graphCount(); ++i)
        QCOMPARE(view->layerPlot()->graph(i)->data()->size(), 3);
    QCOMPARE(view->channelPlot()->plottableCount(), 2);
    const int bars = view->channelPlot()->plottable(0)->interface1D()->dataCount() +
                     view->channelPlot()->plottable(1)->interface1D()->dataCount();
    QCOMPARE(bars, 32);  // every channel of layer 0's keys, outlier or not
}

void TestMainWindow::loaderMatchesComputeAllStats()
{
    // The loader computes one tensor per task (for progress and cancel); it must give exactly
    // what computeAllStats gives.
    MainWindow window(false);
    window.openFile(m_kvPath);
    QVERIFY(waitForData(window));
    const std::vector<kvscope::TensorStats> expected =
        kvscope::computeAllStats(kvscope::readKvH5(QFile::encodeName(m_kvPath).toStdString()));
    const std::vector<kvscope::TensorStats>& shown = window.statsView()->stats();
    QCOMPARE(shown.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
        QCOMPARE(shown[i].layer, expected[i].layer);
        QCOMPARE(int(shown[i].kind), int(expected[i].kind));
        QCOMPARE(shown[i].varianceRaw, expected[i].varianceRaw);
        QCOMPARE(shown[i].varianceDelta, expected[i].varianceDelta);
        QCOMPARE(shown[i].entropyBits, expected[i].entropyBits);
        QCOMPARE(shown[i].outlierChannels, expected[i].outlierChannels);
        QCOMPARE(shown[i].channels.size(), expected[i].channels.size());
        for (size_t c = 0; c < expected[i].channels.size(); ++c)
            QCOMPARE(shown[i].channels[c].absmax, expected[i].channels[c].absmax);
    }
}

void TestMainWindow::nonHdf5FileReportsError()
{
    MainWindow window(false);
    window.setModalErrors(false);
    window.show();
    QSignalSpy errors(&window, &MainWindow::errorOccurred);
    QSignalSpy shown(&window, &MainWindow::dataShown);
    window.openFile(m_bogusPath);
    QTRY_COMPARE_WITH_TIMEOUT(errors.count(), 1, kLoadTimeoutMs);
    const QString message = errors.at(0).at(0).toString();
    QVERIFY2(message.contains(QLatin1String("bogus.h5")), qPrintable(message));
    QVERIFY2(!message.contains(QLatin1Char('\n')), qPrintable(message));
    QCOMPARE(shown.count(), 0);
    QVERIFY(!window.hasData());
    QVERIFY(!window.isLoading());
    QVERIFY(window.findChild<QMessageBox*>() == nullptr);
    QVERIFY(window.findChild<QLabel*>(QStringLiteral("phaseLabel"))->text().contains(message));

    // Still usable: the next, good file loads.
    window.openFile(m_kvPath);
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, kLoadTimeoutMs);
    QCOMPARE(window.summaryField(QStringLiteral("tokens")), QStringLiteral("100"));
    QCOMPARE(errors.count(), 1);
}

void TestMainWindow::missingFileReportsError()
{
    MainWindow window(false);
    window.setModalErrors(false);
    QSignalSpy errors(&window, &MainWindow::errorOccurred);
    const QString missing = m_dir.filePath(QStringLiteral("no-such-file.h5"));
    window.openFile(missing);
    QTRY_COMPARE_WITH_TIMEOUT(errors.count(), 1, kLoadTimeoutMs);
    QVERIFY2(errors.at(0).at(0).toString().contains(QLatin1String("no-such-file.h5")),
             qPrintable(errors.at(0).at(0).toString()));
    QVERIFY(window.recentFiles().isEmpty());  // failures do not enter the recent list
}

void TestMainWindow::errorBoxWhenModal()
{
    MainWindow window(false);
    window.setModalErrors(true);
    window.show();
    QSignalSpy errors(&window, &MainWindow::errorOccurred);
    window.openFile(m_bogusPath);
    QTRY_COMPARE_WITH_TIMEOUT(errors.count(), 1, kLoadTimeoutMs);
    QMessageBox* box = nullptr;
    QTRY_VERIFY((box = window.findChild<QMessageBox*>(QStringLiteral("errorBox"))) != nullptr &&
                box->isVisible());
    QCOMPARE(box->text(), errors.at(0).at(0).toString());
    QCOMPARE(box->icon(), QMessageBox::Critical);
    box->close();
}

void TestMainWindow::demoTitleSaysSynthetic()
{
    MainWindow window(false);
    kvscope::SyntheticSpec spec;
    spec.shape = {4, 2, 32, 256};
    window.openSynthetic(spec);
    QVERIFY(waitForData(window));
    QVERIFY2(window.windowTitle().contains(QLatin1String("synthetic KV")),
             qPrintable(window.windowTitle()));
    QCOMPARE(window.summaryField(QStringLiteral("tokens")), QStringLiteral("256"));
    QVERIFY(window.summaryField(QStringLiteral("source")).startsWith(QLatin1String("synthetic")));
    QCOMPARE(window.summaryField(QStringLiteral("file_bytes")), QStringLiteral("–"));
    QCOMPARE(window.statsView()->layerCombo()->count(), 4);
    QVERIFY(window.recentFiles().isEmpty());
}

void TestMainWindow::dropKvFileOpensIt()
{
    MainWindow window(false);
    window.show();
    QVERIFY(QTest::qWaitForWindowExposed(&window));
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(m_kvPath)});
    QDragEnterEvent enter(QPoint(200, 200), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QCoreApplication::sendEvent(&window, &enter);
    QVERIFY(enter.isAccepted());

    QSignalSpy shown(&window, &MainWindow::dataShown);
    QDropEvent drop(QPointF(200, 200), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QCoreApplication::sendEvent(&window, &drop);
    QVERIFY(drop.isAccepted());
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, kLoadTimeoutMs);
    QCOMPARE(window.summaryField(QStringLiteral("layers")), QStringLiteral("3"));
}

void TestMainWindow::dropOtherFileIsRefused()
{
    MainWindow window(false);
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(m_dir.filePath(QStringLiteral("notes.xyz")))});
    QDragEnterEvent enter(QPoint(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    enter.setAccepted(false);
    QCoreApplication::sendEvent(&window, &enter);
    QVERIFY(!enter.isAccepted());
}

void TestMainWindow::recentFilesPersist()
{
    {
        MainWindow window(true);
        window.openFile(m_kvPath);
        QVERIFY(waitForData(window));
        QCOMPARE(window.recentFiles(), QStringList{QFileInfo(m_kvPath).absoluteFilePath()});
        window.close();  // saves geometry and dock layout
    }
    QSettings settings;
    QCOMPARE(settings.value(QStringLiteral("recentFiles")).toStringList(),
             QStringList{QFileInfo(m_kvPath).absoluteFilePath()});
    QVERIFY(!settings.value(QStringLiteral("window/geometry")).toByteArray().isEmpty());

    MainWindow again(true);
    auto* recent = again.findChild<QMenu*>(QStringLiteral("recentMenu"));
    QVERIFY(recent);
    QVERIFY(recent->isEnabled());
    QVERIFY(recent->actions().first()->text().contains(QLatin1String("small.h5")));
    QSignalSpy shown(&again, &MainWindow::dataShown);
    recent->actions().first()->trigger();  // reopens it
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, kLoadTimeoutMs);

    again.clearRecentFiles();
    QVERIFY(!recent->isEnabled());
    QVERIFY(QSettings().value(QStringLiteral("recentFiles")).toStringList().isEmpty());
}

void TestMainWindow::layoutPersists()
{
    QList<int> sizes;
    {
        MainWindow window(true);
        window.resize(1500, 900);
        window.show();
        window.setDarkTheme(true);
        auto* splitter = window.findChild<QSplitter*>(QStringLiteral("modelPageSplitter"));
        QVERIFY(splitter);
        splitter->setSizes({900, 500});
        QApplication::processEvents();
        sizes = splitter->sizes();
        window.showPage(MainWindow::Page::Stream);
        window.close();  // saves geometry, page, splitters and theme
    }
    MainWindow again(true);
    again.show();
    QApplication::processEvents();
    QCOMPARE(again.currentPage(), MainWindow::Page::Stream);
    QCOMPARE(again.size(), QSize(1500, 900));
    again.showPage(MainWindow::Page::ModelContext);
    QApplication::processEvents();
    QCOMPARE(again.findChild<QSplitter*>(QStringLiteral("modelPageSplitter"))->sizes(), sizes);
    QCOMPARE(kvscope::style::theme(), kvscope::style::Theme::Dark);
    again.setDarkTheme(false);
    again.close();
    // Without settings (screenshots), nothing is restored.
    MainWindow plain(false);
    QCOMPARE(plain.currentPage(), MainWindow::Page::ModelContext);
}

void TestMainWindow::cancelDuringStatistics()
{
    MainWindow window(false);
    window.show();
    auto* progress = window.findChild<QProgressBar*>(QStringLiteral("loadProgress"));
    auto* cancel = window.findChild<QPushButton*>(QStringLiteral("cancelButton"));
    QVERIFY(progress && cancel);
    QSignalSpy shown(&window, &MainWindow::dataShown);
    QSignalSpy cancelled(&window, &MainWindow::loadCancelled);

    window.openSynthetic(largeSpec());
    QVERIFY(cancel->isVisible());
    // The statistics phase counts tensors: K and V of 16 layers.
    QTRY_COMPARE_WITH_TIMEOUT(progress->maximum(), 32, kLoadTimeoutMs);
    QTest::mouseClick(cancel, Qt::LeftButton);
    QCOMPARE(cancelled.count(), 1);
    QVERIFY(!window.isLoading());
    QVERIFY(!cancel->isVisible());
    QTest::qWait(1000);  // tensors already running finish; their results must be dropped
    QCOMPARE(shown.count(), 0);
    QVERIFY(!window.hasData());
    QCOMPARE(window.statsView()->layerCombo()->count(), 0);
}

void TestMainWindow::cancelDuringRead()
{
    MainWindow window(false);
    QSignalSpy shown(&window, &MainWindow::dataShown);
    QSignalSpy cancelled(&window, &MainWindow::loadCancelled);
    window.openSynthetic(largeSpec());
    window.cancelLoad();  // still generating: that step cannot stop, its result is dropped
    QCOMPARE(cancelled.count(), 1);

    // A new load right after the cancelled one shows only the new cache.
    window.openFile(m_kvPath);
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, kLoadTimeoutMs);
    QTest::qWait(500);
    QCOMPARE(shown.count(), 1);
    QCOMPARE(window.summaryField(QStringLiteral("tokens")), QStringLiteral("100"));
}

void TestMainWindow::staysResponsiveWhileLoading()
{
    MainWindow window(false);
    window.show();
    QVERIFY(QTest::qWaitForWindowExposed(&window));

    // A 5 ms timer ticks as long as the event loop turns; the longest gap between ticks is how
    // long the UI froze.
    QElapsedTimer clock;
    qint64 last = -1, maxGap = 0, ticks = 0;
    QTimer ticker;
    ticker.setInterval(5);
    ticker.setTimerType(Qt::PreciseTimer);
    connect(&ticker, &QTimer::timeout, this, [&] {
        const qint64 now = clock.elapsed();
        if (last >= 0) maxGap = std::max(maxGap, now - last);
        last = now;
        ++ticks;
    });

    QSignalSpy shown(&window, &MainWindow::dataShown);
    clock.start();
    ticker.start();
    window.openSynthetic(largeSpec());
    QTRY_COMPARE_WITH_TIMEOUT(shown.count(), 1, 120000);
    QTest::qWait(50);  // include the first repaint of the populated plots
    ticker.stop();

    const kvscope::KvSummary& s = window.summary();
    qInfo(
        "load of %d layers x %d heads x %d tokens x %d dims: %.2f s generate + %.2f s statistics; "
        "longest event-loop gap %lld ms over %lld ticks",
        s.shape.numLayers, s.shape.numKvHeads, s.shape.numTokens, s.shape.headDim, s.readSeconds,
        s.statsSeconds, maxGap, ticks);
    QVERIFY2(maxGap < 200, qPrintable(QStringLiteral("UI froze for %1 ms").arg(maxGap)));
}

void TestMainWindow::aboutNamesVersions()
{
    MainWindow window(false);
    window.show();
    QString text;
    // QMessageBox::about is modal: read and close it from inside its event loop.
    QTimer::singleShot(0, this, [&text] {
        QTRY_VERIFY(qobject_cast<QMessageBox*>(QApplication::activeModalWidget()) != nullptr);
        auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget());
        text = box->text();
        box->accept();
    });
    window.showAbout();
    QVERIFY2(text.contains(QLatin1String("kvscope " KVSCOPE_VERSION)), qPrintable(text));
    QVERIFY2(text.contains(QLatin1String(qVersion())), qPrintable(text));
}

void TestMainWindow::screenshotOption_data()
{
    QTest::addColumn<QStringList>("arguments");
    QTest::addColumn<int>("exitCode");
    QTest::newRow("demo") << QStringList{QStringLiteral("--demo")} << 0;
    QTest::newRow("kv file") << QStringList{QStringLiteral("@kv")} << 0;
    QTest::newRow("bad file") << QStringList{QStringLiteral("@bogus")} << 1;
}

void TestMainWindow::screenshotOption()
{
    QFETCH(QStringList, arguments);
    QFETCH(int, exitCode);
    arguments.replaceInStrings(QStringLiteral("@kv"), m_kvPath);
    arguments.replaceInStrings(QStringLiteral("@bogus"), m_bogusPath);
    const QString png =
        m_dir.filePath(QStringLiteral("shot-%1.png").arg(QTest::currentDataTag()).replace(' ', '-'));
    arguments << QStringLiteral("--screenshot") << png;

    QProcess process;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    process.setProcessEnvironment(env);
    process.start(QStringLiteral(KVSCOPE_GUI_EXE), arguments);
    // --demo captures the default model's KV first: minutes on a loaded 2-core machine.
    QVERIFY(process.waitForFinished(10 * kLoadTimeoutMs));
    const QString err = QString::fromLocal8Bit(process.readAllStandardError());
    QCOMPARE(process.exitStatus(), QProcess::NormalExit);
    QVERIFY2(process.exitCode() == exitCode, qPrintable(err));
    if (exitCode != 0) {
        QVERIFY2(err.contains(QLatin1String("error:")) && err.contains(QLatin1String("bogus.h5")),
                 qPrintable(err));
        QVERIFY(!QFile::exists(png));
        return;
    }
    const QImage image(png);
    QVERIFY(!image.isNull());
    QCOMPARE(image.size(), QSize(1280, 800));
    // A populated window has plots in many colours, not a blank or single-colour frame.
    std::set<QRgb> colours;
    for (int y = 0; y < image.height(); y += 4)
        for (int x = 0; x < image.width(); x += 4) colours.insert(image.pixel(x, y));
    QVERIFY2(colours.size() > 50, qPrintable(QString::number(colours.size())));
}

KVSCOPE_GUI_TEST_MAIN(TestMainWindow)
#include "tst_mainwindow.moc"
