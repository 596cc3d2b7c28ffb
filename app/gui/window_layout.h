// WindowLayout: what the window keeps of its layout between sessions (QSettings "layout/..."):
// the page shown, every named splitter's state and named sub-tab's index, and the theme.
// Splitters are restored once the window is shown and laid out (applySplitters from showEvent):
// before that they have no size and would spread the saved sizes anew.
#pragma once

#include <QByteArray>
#include <QHash>
#include <QString>

class QMainWindow;
class QSettings;
class QTabWidget;

namespace kvscope {

class WindowLayout {
public:
    WindowLayout(QMainWindow* window, QTabWidget* pages) : m_window(window), m_pages(pages) {}

    void save(QSettings& settings) const;
    // The sub-tabs and the page now, the splitters later. @return whether the theme saved is dark.
    bool restore(QSettings& settings);
    void applySplitters();

private:
    QMainWindow* m_window;
    QTabWidget* m_pages;
    QHash<QString, QByteArray> m_pendingSplitters;
};

}  // namespace kvscope
