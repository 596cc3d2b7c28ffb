// What a file dropped on the window opens as: a KV file (.h5, .hdf5), a model (GGUF, or a
// Hugging Face folder with config.json), a saved stream race or else a codec profile (.json), a
// text context (.txt), a Mahimahi trace (.down, .up) or a .kvc store for the Stream page. The
// first dropped local path of one of these kinds counts; anything else is refused.
#pragma once

#include <QString>
#include <QStringList>

class QMimeData;

namespace kvscope {

struct DroppedFile {
    enum Kind { None, KvFile, Model, Race, Profile, Context, Trace, Store } kind = None;
    QString path;
};

QStringList kvFileSuffixes();  // what drag & drop and the open dialog offer
// The first path kvscope can open ("" = none; what drag-enter asks, without reading a file).
QString droppedPath(const QMimeData* mime);
// That path and what it opens as; reads a .json file to tell a race from a profile.
DroppedFile droppedFile(const QMimeData* mime);

}  // namespace kvscope
