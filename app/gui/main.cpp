// kvscope: the desktop app.
//   kvscope [KV.h5]                 open that KV file
//   kvscope --demo                  open the default model and the long_1k sample and capture its KV
//                                   (a synthetic cache, said so in the status bar, when the default
//                                   model is not installed)
//   kvscope ... --screenshot PATH   once the view is populated, save the window as PNG and quit
//                                   (exit 1 when loading fails); used for docs and tests
#include "main_window.h"

#include "kvscope/config.h"

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
        QStringLiteral("Once the view is populated, save the window to <path> as PNG and quit."),
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
        arrangeScreenshot(window, parser.value(screenshotOption), demo || !files.isEmpty());
    }
    window.show();

    if (demo)
        window.openDemo();
    else if (!files.isEmpty())
        window.openFile(files.first());
    return app.exec();
}
