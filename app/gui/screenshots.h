// Screenshots of the window for the docs and the --screenshot run: each page in front (both tabs
// of the Distributions page) at 1280x800 and 1920x1080, every plot drawn at its size first.
#pragma once

#include <QString>
#include <QStringList>

class QMainWindow;
class QTabWidget;

namespace kvscope {

// PNG files "<page>-<w>x<h>.png" into dir; the window's size and pages as they were after.
// @return the files written.
QStringList saveScreenshots(QMainWindow* window, QTabWidget* pages, const QString& dir);

}  // namespace kvscope
