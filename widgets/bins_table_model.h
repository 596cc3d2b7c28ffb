// BinsTableModel: one codec level's bins per layer for K and V, as an editable table, with the
// per-layer figures measured for it alongside (sensitivity when measured, reconstruction error of
// the latest trial). Columns: Layer | K bins | V bins | K sens. ΔPPL % | V sens. ΔPPL % |
// K RMS error | V RMS error. Bins are even numbers in [4, 256] (profile.h); other edits are refused.
#pragma once

#include "eval/layer_sensitivity.h"
#include "kv/kv_compare.h"

#include <QAbstractTableModel>

#include <vector>

namespace kvscope {

class BinsTableModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { LayerCol, KeyBinsCol, ValueBinsCol, KeySensCol, ValueSensCol, KeyErrorCol, ValueErrorCol, ColumnCount };

    explicit BinsTableModel(QObject* parent = nullptr);

    int rowCount(const QModelIndex& parent = QModelIndex()) const override;
    int columnCount(const QModelIndex& parent = QModelIndex()) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
    Qt::ItemFlags flags(const QModelIndex& index) const override;

    // Replaces the bins (both vectors of one length = layers); clears the measured columns when
    // the layer count changes.
    void setBins(const std::vector<int>& keyBins, const std::vector<int>& valueBins);
    const std::vector<int>& keyBins() const { return m_key; }
    const std::vector<int>& valueBins() const { return m_value; }
    // Sets `bins` on the given layers for K, V or both. @return false (nothing changed) for bins
    // that are not even in [4, 256].
    bool setBinsForLayers(const std::vector<int>& layers, bool keys, bool values, int bins);
    void setSensitivity(const std::vector<kvscope::LayerSensitivity>& sensitivity);
    void setErrors(const std::vector<kvscope::LayerError>& errors);
    static bool validBins(int bins) { return bins >= 4 && bins <= 256 && bins % 2 == 0; }

signals:
    // The user (or setBinsForLayers) changed bins.
    void binsEdited();

private:
    std::vector<int> m_key, m_value;
    std::vector<LayerSensitivity> m_sens;  // empty or (layers)
    std::vector<LayerError> m_errors;      // empty or (layers)
};

}  // namespace kvscope
