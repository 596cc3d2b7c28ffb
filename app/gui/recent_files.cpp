#include "recent_files.h"

#include <QAction>
#include <QFileInfo>
#include <QMenu>
#include <QSettings>

namespace kvscope {

namespace {

constexpr int kMaxRecentFiles = 10;
const char* const kSettingsRecent = "recentFiles";

}  // namespace

RecentFiles::RecentFiles(QMenu* menu, bool useSettings, QObject* parent)
    : QObject(parent), m_menu(menu), m_useSettings(useSettings)
{
}

void RecentFiles::restore()
{
    if (m_useSettings) m_paths = QSettings().value(QLatin1String(kSettingsRecent)).toStringList();
    rebuildMenu();
}

void RecentFiles::add(const QString& path)
{
    m_paths.removeAll(path);
    m_paths.prepend(path);
    while (m_paths.size() > kMaxRecentFiles) m_paths.removeLast();
    if (m_useSettings) QSettings().setValue(QLatin1String(kSettingsRecent), m_paths);
    rebuildMenu();
}

void RecentFiles::clear()
{
    m_paths.clear();
    if (m_useSettings) QSettings().remove(QLatin1String(kSettingsRecent));
    rebuildMenu();
}

void RecentFiles::rebuildMenu()
{
    m_menu->clear();
    for (int i = 0; i < m_paths.size(); ++i) {
        const QString path = m_paths.at(i);
        // &1..&9 as keyboard accelerators; '&' in names must not become one.
        QString name = QFileInfo(path).fileName().replace(QLatin1Char('&'), QStringLiteral("&&"));
        QAction* action = m_menu->addAction(i < 9 ? QStringLiteral("&%1 %2").arg(i + 1).arg(name) : name, this,
                                            [this, path] { emit openRequested(path); });
        action->setToolTip(path);
        action->setStatusTip(path);
    }
    if (!m_paths.isEmpty()) {
        m_menu->addSeparator();
        m_menu->addAction(tr("Clear List"), this, &RecentFiles::clear);
    }
    m_menu->setEnabled(!m_paths.isEmpty());
}

}  // namespace kvscope
