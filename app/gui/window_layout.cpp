#include "window_layout.h"

#include "plot_style.h"

#include <QLayout>
#include <QMainWindow>
#include <QSettings>
#include <QSplitter>
#include <QTabWidget>

namespace kvscope {

namespace {

const char* const kSettingsPage = "layout/page";
const char* const kSettingsTheme = "layout/theme";

}  // namespace

void WindowLayout::save(QSettings& settings) const
{
    settings.setValue(QLatin1String(kSettingsPage), m_pages->currentIndex());
    for (QSplitter* splitter : m_window->findChildren<QSplitter*>())
        if (!splitter->objectName().isEmpty())
            settings.setValue(QStringLiteral("layout/splitters/") + splitter->objectName(), splitter->saveState());
    for (QTabWidget* tabs : m_window->findChildren<QTabWidget*>())
        if (!tabs->objectName().isEmpty() && tabs != m_pages)
            settings.setValue(QStringLiteral("layout/tabs/") + tabs->objectName(), tabs->currentIndex());
    settings.setValue(QLatin1String(kSettingsTheme), style::theme() == style::Theme::Dark ? "dark" : "light");
}

bool WindowLayout::restore(QSettings& settings)
{
    for (QSplitter* splitter : m_window->findChildren<QSplitter*>()) {
        const QVariant v = settings.value(QStringLiteral("layout/splitters/") + splitter->objectName());
        if (v.isValid()) m_pendingSplitters.insert(splitter->objectName(), v.toByteArray());
    }
    for (QTabWidget* tabs : m_window->findChildren<QTabWidget*>()) {
        const QVariant v = settings.value(QStringLiteral("layout/tabs/") + tabs->objectName());
        if (v.isValid() && tabs != m_pages) tabs->setCurrentIndex(v.toInt());
    }
    const int page = settings.value(QLatin1String(kSettingsPage), 0).toInt();
    if (page >= 0 && page < m_pages->count()) m_pages->setCurrentIndex(page);
    return settings.value(QLatin1String(kSettingsTheme)).toString() == QLatin1String("dark");
}

void WindowLayout::applySplitters()
{
    if (m_pendingSplitters.isEmpty()) return;
    if (auto* c = m_window->centralWidget(); c && c->layout()) c->layout()->activate();
    for (QSplitter* splitter : m_window->findChildren<QSplitter*>())
        if (m_pendingSplitters.contains(splitter->objectName()))
            splitter->restoreState(m_pendingSplitters.value(splitter->objectName()));
    m_pendingSplitters.clear();
}

}  // namespace kvscope
