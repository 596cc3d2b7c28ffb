#include "view_data.h"

#include <QDir>
#include <QFileInfo>

namespace kvscope {

namespace {
QString& shownRoot()
{
    static QString root;
    return root;
}
}  // namespace

const char* StreamRunResult::partName(int part)
{
    static const char* const names[kParts] = {"transfer", "decode", "recompute", "KV load", "prefill", "first token"};
    return part >= 0 && part < kParts ? names[part] : "";
}

void setShownPathRoot(const QString& root)
{
    shownRoot() = root.isEmpty() ? QString() : QDir::cleanPath(QFileInfo(root).absoluteFilePath());
}

QString shownPath(const QString& path)
{
    if (path.isEmpty()) return path;
    const QFileInfo info(path);
    if (info.isRelative() && !path.contains(QLatin1String(".."))) return QDir::cleanPath(path);
    const QString full = QDir::cleanPath(info.absoluteFilePath());
    const QString& root = shownRoot();
    if (!root.isEmpty() && full.startsWith(root + QLatin1Char('/'))) return full.mid(root.size() + 1);
    return info.fileName();
}

}  // namespace kvscope
