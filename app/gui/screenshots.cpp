#include "screenshots.h"

#include "main_window.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QApplication>
#include <QDir>
#include <QMainWindow>
#include <QTabWidget>

namespace kvscope {

QStringList saveScreenshots(QMainWindow* window, QTabWidget* pages, const QString& dir)
{
    QStringList written;
    QDir().mkpath(dir);
    auto* distTabs = window->findChild<QTabWidget*>(QStringLiteral("distributionsTabs"));
    const struct {
        MainWindow::Page page;
        int subTab;  // of the Distributions page; -1 none
        const char* name;
    } shots[] = {{MainWindow::Page::ModelContext, -1, "model-context"},
                 {MainWindow::Page::Distributions, 0, "distributions"},
                 {MainWindow::Page::Distributions, 1, "distributions-explore"},
                 {MainWindow::Page::Codec, -1, "codec"},
                 {MainWindow::Page::Stream, -1, "stream"}};
    const QSize before = window->size();
    const int pageBefore = pages->currentIndex();
    const int subBefore = distTabs ? distTabs->currentIndex() : 0;
    for (const QSize sz : {QSize(1280, 800), QSize(1920, 1080)}) {
        window->resize(sz);
        for (const auto& shot : shots) {
            pages->setCurrentIndex(int(shot.page));
            if (distTabs && shot.subTab >= 0) distTabs->setCurrentIndex(shot.subTab);
            // Let layouts settle, then draw every plot at its new size.
            for (int i = 0; i < 3; ++i) QApplication::processEvents();
            flushReplots();
            for (QCustomPlot* plot : window->findChildren<QCustomPlot*>()) plot->replot(QCustomPlot::rpImmediateRefresh);
            const QString path =
                QDir(dir).filePath(QStringLiteral("%1-%2x%3.png").arg(QLatin1String(shot.name)).arg(sz.width()).arg(sz.height()));
            if (window->grab().save(path, "PNG")) written << path;
        }
    }
    window->resize(before);
    pages->setCurrentIndex(pageBefore);
    if (distTabs) distTabs->setCurrentIndex(subBefore);
    return written;
}

}  // namespace kvscope
