// StreamRunsModel: the Stream page's table of runs, one row per finished run of a race (policy,
// link, SLO, TTFT and its parts, text chunks, token agreement, KL and ΔPPL, compute, which parts
// were modelled); the run's log as the tooltip.
#pragma once

#include "view_data.h"

#include <QAbstractTableModel>

#include <vector>

namespace kvscope {

class StreamRunsModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { RunCol, PolicyCol, LinkCol, SloCol, TtftCol, MetCol, TransferCol, DecodeCol, RecomputeCol,
                  PrefillCol, TextChunksCol, AgreementCol, KlCol, DeltaPplCol, HardwareCol, ModelledCol, ColumnCount };
    using QAbstractTableModel::QAbstractTableModel;
    int rowCount(const QModelIndex& parent = QModelIndex()) const override;
    int columnCount(const QModelIndex& parent = QModelIndex()) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
    void addRun(const StreamRunResult& run);
    void clear();
    const std::vector<StreamRunResult>& runs() const { return m_runs; }

private:
    std::vector<StreamRunResult> m_runs;
};

}  // namespace kvscope
