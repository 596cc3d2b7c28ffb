// kvscope: the desktop app.
//   kvscope [KV.h5]                 open that KV file
//   kvscope --demo                  open the default model and the long_1k sample and capture its KV
//                                   (a synthetic cache, said so in the status bar, when the default
//                                   model is not installed)
//   kvscope ... --screenshot PATH   once the view is populated, save the window as PNG and quit
//                                   (exit 1 when loading fails); used for docs and tests
//   kvscope ... --screenshot DIR    (a path not ending in .png) the same, then one stream lab run
//                                   when a captured cache allows it, the tuner's quality, and each
//                                   view rendered to DIR/*.png (resources/screenshots/ for the README)
#include "main_window.h"
#include "stream_lab_view.h"
#include "stream_session.h"
#include "tuner_session.h"
#include "codec_tuner_view.h"

#include "kvscope/config.h"

#include <QElapsedTimer>

#include <QApplication>
#include <QCommandLineParser>
#include <QIcon>
#include <QPixmap>
#include <QTimer>

#include <cstdio>

namespace {

// Saves the window once it shows data (or right away when nothing is being loaded), then quits.
void arrangeScreenshot(kvscope::MainWindow& window, const QString& path, bool waitForData)
{
    auto grabAndQuit = [&window, path] {
        // Let layouts settle and QCustomPlot finish its queued replots after the resize.
        QTimer::singleShot(300, &window, [&window, path] {
            const QPixmap pixmap = window.grab();
            if (!pixmap.save(path, "PNG")) {
                std::fprintf(stderr, "error: %s: could not write the screenshot\n", qPrintable(path));
                QCoreApplication::exit(1);
                return;
            }
            std::fprintf(stderr, "kvscope: screenshot %dx%d written to %s\n", pixmap.width(), pixmap.height(),
                         qPrintable(path));
            QCoreApplication::exit(0);
        });
    };
    if (!waitForData) {
        grabAndQuit();
        return;
    }
    QObject::connect(&window, &kvscope::MainWindow::dataShown, &window, grabAndQuit);
    QObject::connect(&window, &kvscope::MainWindow::errorOccurred, &window, [](const QString& message) {
        std::fprintf(stderr, "error: %s\n", qPrintable(message));
        QCoreApplication::exit(1);
    });
}

// DIR mode: after the data is shown, one stream run (when possible), then wait for the tuner's
// figures (at most kSettleMs), then every view to DIR.
void arrangeViewScreenshots(kvscope::MainWindow& window, const QString& dir)
{
    constexpr qint64 kSettleMs = 120000;
    auto finish = [&window, dir] {
        auto clock = std::make_shared<QElapsedTimer>();
        clock->start();
        auto* poll = new QTimer(&window);
        QObject::connect(poll, &QTimer::timeout, &window, [&window, dir, clock, poll] {
            const bool settled = !window.tunerSession()->canMeasureQuality() || window.tunerView()->hasQuality();
            if (!settled && clock->elapsed() < kSettleMs) return;
            poll->stop();
            const QStringList files = window.saveScreenshots(dir);
            for (const QString& f : files) std::fprintf(stderr, "kvscope: screenshot %s\n", qPrintable(f));
            QCoreApplication::exit(files.size() >= 5 ? 0 : 1);
        });
        poll->start(200);
    };
    QObject::connect(&window, &kvscope::MainWindow::dataShown, &window, [&window, finish] {
        // Let the tuner's first trial start, then stream once.
        QTimer::singleShot(500, &window, [&window, finish] {
            kvscope::StreamSession* s = window.streamSession();
            if (!s->isReady()) {
                finish();
                return;
            }
            QObject::connect(s, &kvscope::StreamSession::runFinished, &window, finish, Qt::SingleShotConnection);
            QObject::connect(s, &kvscope::StreamSession::failed, &window, finish, Qt::SingleShotConnection);
            window.startStream();
        });
    });
    QObject::connect(&window, &kvscope::MainWindow::errorOccurred, &window, [](const QString& message) {
        std::fprintf(stderr, "error: %s\n", qPrintable(message));
    });
}

}  // namespace

int main(int argc, char** argv)
{
    QApplication app(argc, argv);
    QApplication::setOrganizationName(QStringLiteral("kvscope"));
    QApplication::setApplicationName(QStringLiteral("kvscope"));
    QApplication::setApplicationVersion(QStringLiteral(KVSCOPE_VERSION));
    QApplication::setDesktopFileName(QStringLiteral("kvscope"));  // matches kvscope.desktop
    QApplication::setWindowIcon(QIcon(QStringLiteral(":/kvscope/kvscope.png")));

    QCommandLineParser parser;
    parser.setApplicationDescription(
        QStringLiteral("Inspect and tune KV-cache compression (CacheGen-style)."));
    parser.addHelpOption();
    parser.addVersionOption();
    parser.addPositionalArgument(QStringLiteral("file"), QStringLiteral("KV file (.h5) to open."),
                                 QStringLiteral("[KV.h5]"));
    const QCommandLineOption demoOption(
        QStringLiteral("demo"),
        QStringLiteral("Open the default model and the long_1k sample context, capture its KV and show it."));
    const QCommandLineOption screenshotOption(
        QStringLiteral("screenshot"),
        QStringLiteral("Once the view is populated, save the window to <path> as PNG and quit; when <path> does not "
                       "end in .png, render each view into that folder instead."),
        QStringLiteral("path"));
    parser.addOption(demoOption);
    parser.addOption(screenshotOption);
    parser.process(app);

    const QStringList files = parser.positionalArguments();
    const bool demo = parser.isSet(demoOption);
    if (files.size() > 1 || (demo && !files.isEmpty())) {
        std::fprintf(stderr, "error: give one KV file or --demo, not both\n");
        return 2;
    }

    // A screenshot must not depend on the user's saved layout, nor change it.
    const bool screenshot = parser.isSet(screenshotOption);
    kvscope::MainWindow window(/*useSettings=*/!screenshot);
    if (screenshot) {
        window.setModalErrors(false);
        window.resize(1280, 800);
        const QString target = parser.value(screenshotOption);
        if (target.endsWith(QLatin1String(".png"), Qt::CaseInsensitive))
            arrangeScreenshot(window, target, demo || !files.isEmpty());
        else
            arrangeViewScreenshots(window, target);
    }
    window.show();

    if (demo)
        window.openDemo();
    else if (!files.isEmpty())
        window.openFile(files.first());
    return app.exec();
}
