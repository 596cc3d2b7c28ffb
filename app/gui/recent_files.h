// RecentFiles: the File ▸ Open Recent list, newest first, at most ten paths, kept in QSettings
// ("recentFiles") when the window uses settings. The menu names each file with &1..&9 as
// accelerators and ends with Clear List; choosing an entry asks the window to open it.
#pragma once

#include <QObject>
#include <QStringList>

class QMenu;

namespace kvscope {

class RecentFiles : public QObject {
    Q_OBJECT
public:
    // menu: filled and kept up to date; useSettings false: neither read nor written.
    RecentFiles(QMenu* menu, bool useSettings, QObject* parent = nullptr);

    QStringList paths() const { return m_paths; }
    void restore();  // from the settings
    void add(const QString& path);
    void clear();

signals:
    void openRequested(const QString& path);

private:
    void rebuildMenu();

    QMenu* m_menu;
    const bool m_useSettings;
    QStringList m_paths;
};

}  // namespace kvscope
