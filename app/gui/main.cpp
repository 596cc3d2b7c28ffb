// kvscope: the desktop app.
//   kvscope [KV.h5]                 open that KV file
//   kvscope --demo                  open the default model and the long_1k sample and capture its KV
//                                   (a synthetic cache, said so in the status bar, when the default
//                                   model is not installed)
//   kvscope ... --screenshot PATH   once the view is populated, save the window as PNG and quit
//                                   (exit 1 when loading fails); used for docs and tests
//   kvscope ... --screenshot DIR    (a path not ending in .png) the same, then a race of four
//                                   streaming policies when a captured cache allows it, the codec's
//                                   rate-distortion evaluation and the layer sensitivity, and every
//                                   page at 1280x800 and 1920x1080 to DIR/<page>-<W>x<H>.png
//                                   (resources/screenshots/ for the README)
#include "main_window.h"
#include "stream_lab_view.h"
#include "stream_session.h"
#include "tuner_session.h"
#include "codec_tuner_view.h"
#include "layer_stats_view.h"
#include "plot_widget.h"

#include <QPushButton>

#include <functional>
#include <memory>

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
            kvscope::flushReplots();
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

// DIR mode: after the data is shown, a race of four policies on a drop-and-recover link (when a
// captured cache allows it), the Codec page's rate-distortion evaluation and the layer
// sensitivity (each waited for at most kSettleMs), then every page at both sizes to DIR.
void arrangeViewScreenshots(kvscope::MainWindow& window, const QString& dir)
{
    constexpr qint64 kSettleMs = 240000;
    auto shoot = [&window, dir] {
        const QStringList files = window.saveScreenshots(dir);
        for (const QString& f : files) std::fprintf(stderr, "kvscope: screenshot %s\n", qPrintable(f));
        QCoreApplication::exit(files.size() >= 10 ? 0 : 1);
    };
    // Waits until done() or kSettleMs, then calls next.
    auto waitFor = [&window](std::function<bool()> done, std::function<void()> next) {
        auto clock = std::make_shared<QElapsedTimer>();
        clock->start();
        auto* poll = new QTimer(&window);
        QObject::connect(poll, &QTimer::timeout, &window, [done, next, clock, poll] {
            if (!done() && clock->elapsed() < kSettleMs) return;
            poll->stop();
            poll->deleteLater();
            next();
        });
        poll->start(200);
    };
    auto afterRace = [&window, waitFor, shoot] {
        kvscope::TunerSession* ts = window.tunerSession();
        window.showPage(kvscope::MainWindow::Page::Codec);  // starts the rate-distortion evaluation
        waitFor([&window, ts] { return !ts->canMeasureQuality() || (window.tunerView()->hasRdPoints() && !ts->isBusy()); },
                [&window, ts, waitFor, shoot] {
                    if (!ts->canMeasureQuality()) {
                        shoot();
                        return;
                    }
                    window.statsView()->sensitivityButton()->click();
                    waitFor([&window, ts] { return !window.statsView()->sensitivity().empty() && !ts->isBusy(); }, shoot);
                });
    };
    QObject::connect(&window, &kvscope::MainWindow::dataShown, &window, [&window, afterRace] {
        // Let the tuner's first trial start, then race.
        QTimer::singleShot(500, &window, [&window, afterRace] {
            kvscope::StreamSession* s = window.streamSession();
            if (!s->isReady()) {
                afterRace();
                return;
            }
            kvscope::StreamConfig c = window.streamView()->config();
            c.link = kvscope::StreamConfig::Steps;
            c.rate = QStringLiteral("40Mbit:0.3,4Mbit:0.4,40Mbit");
            c.sloSeconds = 2.0;
            c.policies = QStringList{QStringLiteral("adaptive"), QStringLiteral("text"), QStringLiteral("int8"),
                                     QStringLiteral("level:1")};
            // Compute modelled at CPU-class rates (the CLI's --target-prefill 400 --target-decode
            // 0.15, as in the README's SLO tables): recomputing the context then costs about as
            // much as sending it at int8, which is where choosing per chunk pays. The policies
            // race at once, each on its own link with the same schedule.
            c.mode = kvscope::StreamConfig::AtOnce;
            c.hardware = QStringLiteral("custom");
            c.prefillTokensPerSecond = 400;
            c.decodeGBps = 0.15;
            c.weightPassSeconds = -1;  // no floor
            window.streamView()->setConfig(c);
            window.showPage(kvscope::MainWindow::Page::Stream);
            QObject::connect(s, &kvscope::StreamSession::raceFinished, &window, afterRace, Qt::SingleShotConnection);
            QObject::connect(s, &kvscope::StreamSession::failed, &window, afterRace, Qt::SingleShotConnection);
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
