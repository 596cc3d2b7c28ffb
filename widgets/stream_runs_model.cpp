#include "stream_runs_model.h"

#include "plot_style.h"

#include <QColor>

#include <algorithm>

namespace kvscope {

namespace {

QString seconds(double s) { return QString::number(s, 'f', 3); }

}  // namespace

int StreamRunsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : int(m_runs.size()); }
int StreamRunsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant StreamRunsModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= ColumnCount) return {};
    const StreamRunResult& r = m_runs[size_t(index.row())];
    if (role == Qt::ForegroundRole && index.column() == MetCol) return QColor(r.sloMet ? Qt::darkGreen : Qt::red);
    if (role == Qt::DecorationRole && index.column() == PolicyCol) return style::policyColor(r.policy, 8);
    if (role == Qt::ToolTipRole) return r.log.join(QLatin1Char('\n'));
    if (role != Qt::DisplayRole) return {};
    switch (index.column()) {
    case RunCol: return r.run;
    case PolicyCol: return r.policy;
    case LinkCol: return r.link;
    case SloCol: return seconds(r.sloSeconds);
    case TtftCol: return seconds(r.ttftSeconds);
    case MetCol: return r.sloMet ? tr("yes") : tr("no");
    case TransferCol: return seconds(r.parts[0]);
    case DecodeCol: return seconds(r.parts[1]);
    case RecomputeCol: return seconds(r.parts[2]);
    case PrefillCol: return seconds(r.parts[4]);
    case TextChunksCol: {
        const auto text = std::count_if(r.chunks.begin(), r.chunks.end(), [](const StreamChunkPoint& c) { return c.level == 0; });
        return QStringLiteral("%1 / %2").arg(text).arg(r.chunks.size());
    }
    case AgreementCol: return QString::number(r.tokenAgreement, 'f', 2);
    case KlCol: return r.hasQuality ? QString::number(r.kl, 'g', 3) : QStringLiteral("–");
    case DeltaPplCol: return r.hasQuality ? QString::number(r.deltaPplPct, 'f', 2) : QStringLiteral("–");
    case HardwareCol: return r.hardware;
    case ModelledCol: {
        QStringList parts;
        for (int i = 0; i < StreamRunResult::kParts; ++i)
            if (r.partModelled[i]) parts << QLatin1String(StreamRunResult::partName(i));
        return parts.isEmpty() ? tr("none") : parts.join(QStringLiteral(", "));
    }
    }
    return {};
}

QVariant StreamRunsModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (role != Qt::DisplayRole || orientation != Qt::Horizontal) return {};
    static const char* const names[ColumnCount] = {"Run",       "Policy",    "Link",        "SLO s",     "TTFT s",
                                                  "SLO met",   "Transfer s", "Decode s",   "Recompute s", "Prefill s",
                                                  "Text chunks", "Agreement", "KL",          "ΔPPL %",
                                                  "Compute",     "Modelled parts"};
    return section >= 0 && section < ColumnCount ? QVariant(tr(names[section])) : QVariant();
}

void StreamRunsModel::addRun(const StreamRunResult& run)
{
    beginInsertRows(QModelIndex(), rowCount(), rowCount());
    m_runs.push_back(run);
    endInsertRows();
}

void StreamRunsModel::clear()
{
    if (m_runs.empty()) return;
    beginResetModel();
    m_runs.clear();
    endResetModel();
}

}  // namespace kvscope
