// Meta-type declarations of core value types that widgets pass through signals, in one place:
// a header that declares one after another header's moc code has used it does not compile.
// (std::vector<T> needs none: Qt 6 declares its containers itself.)
#pragma once

#include "codec/profile.h"
#include "kv/kv_set.h"

#include <QMetaType>

Q_DECLARE_METATYPE(kvscope::KvKind)
Q_DECLARE_METATYPE(kvscope::CodecProfile)
