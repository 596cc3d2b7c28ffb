// One export path for every plot in kvscope: save as PNG, JPEG, SVG or PDF, copy the data as CSV,
// and the right-click menu that offers both. Views call installPlotMenu() once per plot.
#pragma once

#include <QString>
#include <QStringList>

#include <functional>

class QCustomPlot;

namespace kvscope {

// Suffixes savePlot() accepts, lower case ("png", "jpg", "jpeg", "pdf", and "svg" when built with
// Qt SVG).
QStringList plotImageSuffixes();
// The file-dialog filter for those suffixes, PNG first.
QString plotImageFilter();

// Saves `plot` at its size, at least 800 x 450 (a hidden widget would give a postage stamp); the
// format follows the suffix. @return false with *error naming the file and the reason for an
// unknown suffix or a failed write.
bool savePlot(QCustomPlot* plot, const QString& path, QString* error);

// Every plottable's data as CSV ("\n" line ends): header "series,x,y,z", then one row per point
// of each graph, curve and bar set (z empty), and one per cell of each colour map (x, y = cell
// key and value coordinates, z = cell data). Series are named by their plottable's name.
QString plotCsv(QCustomPlot* plot);

// Right-click menu on `plot`: Copy data as CSV (csv(), or plotCsv when csv is empty), Save image
// as… (a file dialog offering `baseName`), Reset zoom (rescale axes, replot). The menu pops up
// without a nested event loop. Actions carry object names copyCsv, saveImage, resetZoom.
void installPlotMenu(QCustomPlot* plot, const QString& baseName, std::function<QString()> csv = {});

}  // namespace kvscope
