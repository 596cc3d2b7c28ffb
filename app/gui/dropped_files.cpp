#include "dropped_files.h"

#include "race_file.h"

#include <QFileInfo>
#include <QMimeData>
#include <QUrl>

namespace kvscope {

QString droppedPath(const QMimeData* mime)
{
    if (!mime || !mime->hasUrls()) return {};
    for (const QUrl& url : mime->urls()) {
        if (!url.isLocalFile()) continue;
        const QString path = url.toLocalFile();
        const QFileInfo info(path);
        const QString suffix = info.suffix().toLower();
        static const QStringList accepted = {QStringLiteral("gguf"), QStringLiteral("json"), QStringLiteral("txt"),
                                             QStringLiteral("down"), QStringLiteral("up"), QStringLiteral("kvc")};
        if (kvFileSuffixes().contains(suffix) || accepted.contains(suffix) ||
            (info.isDir() && QFileInfo::exists(info.filePath() + QStringLiteral("/config.json"))))
            return path;
    }
    return {};
}

QStringList kvFileSuffixes()
{
    return {QStringLiteral("h5"), QStringLiteral("hdf5")};
}

DroppedFile droppedFile(const QMimeData* mime)
{
    DroppedFile out;
    out.path = droppedPath(mime);
    if (out.path.isEmpty()) return out;
    const QFileInfo info(out.path);
    const QString suffix = info.suffix().toLower();
    if (info.isDir() || suffix == QLatin1String("gguf"))
        out.kind = DroppedFile::Model;
    else if (suffix == QLatin1String("json"))
        out.kind = isRaceFile(out.path) ? DroppedFile::Race : DroppedFile::Profile;
    else if (suffix == QLatin1String("txt"))
        out.kind = DroppedFile::Context;
    else if (suffix == QLatin1String("down") || suffix == QLatin1String("up"))
        out.kind = DroppedFile::Trace;
    else if (suffix == QLatin1String("kvc"))
        out.kind = DroppedFile::Store;
    else
        out.kind = DroppedFile::KvFile;
    return out;
}

}  // namespace kvscope
