#include "bins_table_model.h"

#include <QBrush>
#include <QColor>

#include <algorithm>
#include <tuple>

namespace kvscope {

BinsTableModel::BinsTableModel(QObject* parent) : QAbstractTableModel(parent) {}

int BinsTableModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : int(m_key.size()); }
int BinsTableModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant BinsTableModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= ColumnCount) return {};
    const size_t r = size_t(index.row());
    const int col = index.column();
    if (role == Qt::TextAlignmentRole) return int(Qt::AlignRight | Qt::AlignVCenter);
    if (role == Qt::BackgroundRole && (col == KeyBinsCol || col == ValueBinsCol)) {
        // Fewer bins, warmer colour: layer groups stand out at a glance.
        const int bins = col == KeyBinsCol ? m_key[r] : m_value[r];
        const int shade = std::clamp(255 - (64 - std::min(bins, 64)) * 2, 130, 255);
        return QBrush(QColor(255, shade, shade));
    }
    if (role != Qt::DisplayRole && role != Qt::EditRole) return {};
    switch (col) {
    case LayerCol: return int(r);
    case KeyBinsCol: return m_key[r];
    case ValueBinsCol: return m_value[r];
    case KeySensCol:
        return m_sens.size() == m_key.size() ? QVariant(QString::number(m_sens[r].keyDeltaPplPct, 'f', 3)) : QVariant();
    case ValueSensCol:
        return m_sens.size() == m_key.size() ? QVariant(QString::number(m_sens[r].valueDeltaPplPct, 'f', 3)) : QVariant();
    case KeyErrorCol:
        return m_errors.size() == m_key.size() ? QVariant(QString::number(m_errors[r].key.rms, 'g', 3)) : QVariant();
    case ValueErrorCol:
        return m_errors.size() == m_key.size() ? QVariant(QString::number(m_errors[r].value.rms, 'g', 3)) : QVariant();
    }
    return {};
}

bool BinsTableModel::setData(const QModelIndex& index, const QVariant& value, int role)
{
    if (role != Qt::EditRole || !index.isValid() || index.row() >= rowCount()) return false;
    const int col = index.column();
    if (col != KeyBinsCol && col != ValueBinsCol) return false;
    bool ok = false;
    const int bins = value.toInt(&ok);
    if (!ok) return false;
    return setBinsForLayers({index.row()}, col == KeyBinsCol, col == ValueBinsCol, bins);
}

QVariant BinsTableModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (role != Qt::DisplayRole) return {};
    if (orientation == Qt::Vertical) return section + 1 <= rowCount() ? QVariant(section) : QVariant();
    static const char* const names[ColumnCount] = {"Layer", "K bins", "V bins", "K sens. ΔPPL %", "V sens. ΔPPL %",
                                                  "K RMS error", "V RMS error"};
    return section >= 0 && section < ColumnCount ? QVariant(tr(names[section])) : QVariant();
}

Qt::ItemFlags BinsTableModel::flags(const QModelIndex& index) const
{
    if (!index.isValid()) return Qt::NoItemFlags;
    Qt::ItemFlags f = Qt::ItemIsEnabled | Qt::ItemIsSelectable;
    if (index.column() == KeyBinsCol || index.column() == ValueBinsCol) f |= Qt::ItemIsEditable;
    return f;
}

void BinsTableModel::setBins(const std::vector<int>& keyBins, const std::vector<int>& valueBins)
{
    beginResetModel();
    if (keyBins.size() != m_key.size()) {
        m_sens.clear();
        m_errors.clear();
    }
    m_key = keyBins;
    m_value = valueBins;
    m_value.resize(m_key.size(), 32);
    endResetModel();
}

bool BinsTableModel::setBinsForLayers(const std::vector<int>& layers, bool keys, bool values, int bins)
{
    if (!validBins(bins)) return false;
    bool changed = false;
    for (int l : layers) {
        if (l < 0 || l >= rowCount()) continue;
        for (auto [on, vec, col] : {std::make_tuple(keys, &m_key, int(KeyBinsCol)), std::make_tuple(values, &m_value, int(ValueBinsCol))}) {
            if (!on || (*vec)[size_t(l)] == bins) continue;
            (*vec)[size_t(l)] = bins;
            changed = true;
            emit dataChanged(index(l, col), index(l, col));
        }
    }
    if (changed) emit binsEdited();
    return true;
}

void BinsTableModel::setSensitivity(const std::vector<LayerSensitivity>& sensitivity)
{
    m_sens = sensitivity.size() == m_key.size() ? sensitivity : std::vector<LayerSensitivity>{};
    if (rowCount()) emit dataChanged(index(0, KeySensCol), index(rowCount() - 1, ValueSensCol));
}

void BinsTableModel::setErrors(const std::vector<LayerError>& errors)
{
    m_errors = errors.size() == m_key.size() ? errors : std::vector<LayerError>{};
    if (rowCount()) emit dataChanged(index(0, KeyErrorCol), index(rowCount() - 1, ValueErrorCol));
}

}  // namespace kvscope
