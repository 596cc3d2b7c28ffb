// StreamRaceFigure: the Stream page's figure, a title over four plots side by side, one lane per
// policy in its policy colour:
//   timeline   per lane, one bar per chunk from request to arrival coloured by level (the
//              sequential level scale; text in the text colour), its decode or recompute job
//              after it, the SLO as a line;
//   TTFT       one bar per lane stacked by part, against the SLO, with the answer's token
//              agreement and the cache's KL and ΔPPL on top;
//   bandwidth  the link's available rate vs the rate each lane's chunks got (graph 0 is the
//              available rate; the link editor draws its grid there);
//   levels     the level each lane chose per chunk.
// It draws what it is given and renders itself as one image (exportTo).
#pragma once

#include "view_data.h"

#include <QString>
#include <QWidget>

#include <vector>

class QCustomPlot;
class QLabel;

namespace kvscope {

class StreamRaceFigure : public QWidget {
    Q_OBJECT
public:
    using LaneChunks = std::vector<std::vector<StreamChunkPoint>>;  // (lane, chunk)

    explicit StreamRaceFigure(QWidget* parent = nullptr);

    QCustomPlot* bandwidthPlot() const { return m_bandwidthPlot; }
    QCustomPlot* timelinePlot() const { return m_timelinePlot; }
    QCustomPlot* levelsPlot() const { return m_levelsPlot; }
    QCustomPlot* ttftPlot() const { return m_ttftPlot; }

    void setTitle(const QString& html);
    // Timeline, bandwidth and levels of the chunks shown so far (by lane), on the race's schedule
    // and SLO; `levels` sets the level scale.
    void drawLive(const RaceRecord& race, const LaneChunks& chunks, int levels);
    // The TTFT bars of the finished runs of the race.
    void drawTtft(const RaceRecord& race);
    // The figure as one image, PNG, JPEG, SVG or PDF by suffix, at a readable size even when
    // hidden or small. @return false with *error "path: reason".
    bool exportTo(const QString& path, QString* error);

private:
    void drawTimeline(const RaceRecord& race, const LaneChunks& chunks, int levels, double tMax, int maxChunks);
    void drawBandwidth(const RaceRecord& race, const LaneChunks& chunks, int levels, double tMax);
    void drawLevels(const RaceRecord& race, const LaneChunks& chunks, int levels, int maxChunks);

    QLabel* m_title = nullptr;
    QCustomPlot* m_bandwidthPlot = nullptr;
    QCustomPlot* m_timelinePlot = nullptr;
    QCustomPlot* m_levelsPlot = nullptr;
    QCustomPlot* m_ttftPlot = nullptr;
};

}  // namespace kvscope
