#include "plot_export.h"

#include "qcustomplot.h"

#include <QApplication>
#include <QClipboard>
#include <QCursor>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QMenu>
#include <QSettings>
#include <QToolTip>
#ifdef KVSCOPE_HAVE_QT_SVG
#include <QSvgGenerator>
#endif

#include <algorithm>

namespace kvscope {

namespace {

QString number(double v)
{
    return QString::number(v, 'g', 17);  // round-trips a double
}

// CSV field: quote names that contain a separator or a quote.
QString field(QString s)
{
    if (!s.contains(QLatin1Char(',')) && !s.contains(QLatin1Char('"')) && !s.contains(QLatin1Char('\n'))) return s;
    return QLatin1Char('"') + s.replace(QLatin1Char('"'), QStringLiteral("\"\"")) + QLatin1Char('"');
}

#ifdef KVSCOPE_HAVE_QT_SVG
bool saveSvg(QCustomPlot* plot, const QString& path, int w, int h)
{
    QSvgGenerator svg;
    svg.setFileName(path);
    svg.setSize(QSize(w, h));
    svg.setViewBox(QRect(0, 0, w, h));
    svg.setTitle(QStringLiteral("kvscope"));
    QCPPainter painter;
    if (!painter.begin(&svg)) return false;
    plot->toPainter(&painter, w, h);
    return painter.end() && QFileInfo(path).size() > 0;
}
#endif

}  // namespace

QStringList plotImageSuffixes()
{
    QStringList s{QStringLiteral("png"), QStringLiteral("jpg"), QStringLiteral("jpeg"), QStringLiteral("pdf")};
#ifdef KVSCOPE_HAVE_QT_SVG
    s << QStringLiteral("svg");
#endif
    return s;
}

QString plotImageFilter()
{
    QString f = QObject::tr("PNG image (*.png);;PDF document (*.pdf)");
#ifdef KVSCOPE_HAVE_QT_SVG
    f += QObject::tr(";;SVG image (*.svg)");
#endif
    return f + QObject::tr(";;JPEG image (*.jpg)");
}

bool savePlot(QCustomPlot* plot, const QString& path, QString* error)
{
    const int w = std::max(plot->width(), 800);
    const int h = std::max(plot->height(), 450);
    const QString suffix = QFileInfo(path).suffix().toLower();
    bool ok = false;
    if (suffix == QLatin1String("png"))
        ok = plot->savePng(path, w, h);
    else if (suffix == QLatin1String("jpg") || suffix == QLatin1String("jpeg"))
        ok = plot->saveJpg(path, w, h);
    else if (suffix == QLatin1String("pdf"))
        ok = plot->savePdf(path, w, h, QCP::epNoCosmetic, QStringLiteral("kvscope"));
#ifdef KVSCOPE_HAVE_QT_SVG
    else if (suffix == QLatin1String("svg"))
        ok = saveSvg(plot, path, w, h);
#endif
    else {
        if (error)
            *error = QObject::tr("%1: unknown image format '%2' (use %3)")
                         .arg(path, suffix, plotImageSuffixes().join(QStringLiteral(", ")));
        return false;
    }
    if (!ok && error) *error = QObject::tr("%1: could not write the file").arg(path);
    return ok;
}

QString plotCsv(QCustomPlot* plot)
{
    QString out = QStringLiteral("series,x,y,z\n");
    for (int i = 0; i < plot->plottableCount(); ++i) {
        QCPAbstractPlottable* p = plot->plottable(i);
        const QString name = field(p->name());
        if (auto* graph = qobject_cast<QCPGraph*>(p)) {
            for (const QCPGraphData& d : *graph->data())
                out += name + QLatin1Char(',') + number(d.key) + QLatin1Char(',') + number(d.value) + QStringLiteral(",\n");
        } else if (auto* bars = qobject_cast<QCPBars*>(p)) {
            for (const QCPBarsData& d : *bars->data())
                out += name + QLatin1Char(',') + number(d.key) + QLatin1Char(',') + number(d.value) + QStringLiteral(",\n");
        } else if (auto* curve = qobject_cast<QCPCurve*>(p)) {
            for (const QCPCurveData& d : *curve->data())
                out += name + QLatin1Char(',') + number(d.key) + QLatin1Char(',') + number(d.value) + QStringLiteral(",\n");
        } else if (auto* map = qobject_cast<QCPColorMap*>(p)) {
            QCPColorMapData* data = map->data();
            for (int y = 0; y < data->valueSize(); ++y)
                for (int x = 0; x < data->keySize(); ++x) {
                    double kx = 0, vy = 0;
                    data->cellToCoord(x, y, &kx, &vy);
                    out += name + QLatin1Char(',') + number(kx) + QLatin1Char(',') + number(vy) + QLatin1Char(',') +
                           number(data->cell(x, y)) + QLatin1Char('\n');
                }
        }
    }
    return out;
}

void installPlotMenu(QCustomPlot* plot, const QString& baseName, std::function<QString()> csv)
{
    plot->setContextMenuPolicy(Qt::CustomContextMenu);
    QObject::connect(plot, &QWidget::customContextMenuRequested, plot, [plot, baseName, csv](const QPoint& pos) {
        auto* menu = new QMenu(plot);
        menu->setAttribute(Qt::WA_DeleteOnClose);
        menu->addAction(QObject::tr("Copy data as CSV"), plot, [plot, csv] {
               QApplication::clipboard()->setText(csv ? csv() : plotCsv(plot));
           })->setObjectName(QStringLiteral("copyCsv"));
        menu->addAction(QObject::tr("Save image as…"), plot, [plot, baseName] {
               QSettings settings;
               const QString dir = settings.value(QStringLiteral("export/lastDir")).toString();
               const QString path = QFileDialog::getSaveFileName(
                   plot, QObject::tr("Save plot"), QDir(dir).filePath(baseName + QStringLiteral(".png")),
                   plotImageFilter());
               if (path.isEmpty()) return;
               settings.setValue(QStringLiteral("export/lastDir"), QFileInfo(path).absolutePath());
               QString error;
               if (!savePlot(plot, path, &error)) QToolTip::showText(QCursor::pos(), error, plot);
           })->setObjectName(QStringLiteral("saveImage"));
        menu->addSeparator();
        menu->addAction(QObject::tr("Reset zoom"), plot, [plot] {
               plot->rescaleAxes();
               plot->replot();
           })->setObjectName(QStringLiteral("resetZoom"));
        menu->popup(plot->mapToGlobal(pos));
    });
}

}  // namespace kvscope
