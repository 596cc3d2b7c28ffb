#include "stream_page.h"

#include "plot_export.h"
#include "race_file.h"
#include "stream_lab_view.h"
#include "stream_session.h"

#include <QFileDialog>
#include <QFileInfo>

#include <algorithm>
#include <exception>

namespace kvscope {

StreamPage::StreamPage(QWidget* dialogParent, QObject* parent)
    : QObject(parent), m_dialogParent(dialogParent), m_view(new StreamLabView), m_session(new StreamSession(this))
{
    m_view->setObjectName(QStringLiteral("streamLabView"));
    m_view->setHardwarePresets(StreamSession::hardwarePresets());
    StreamSession* ss = m_session;
    connect(m_view, &StreamLabView::stopRequested, ss, &StreamSession::stop);
    connect(ss, &StreamSession::phaseChanged, this, [this](const QString& text, int maximum) {
        emit taskStarted(text, maximum);
        m_view->setStatus(text);
    });
    connect(ss, &StreamSession::progressChanged, this, &StreamPage::progressChanged);
    connect(ss, &StreamSession::raceStarted, m_view, &StreamLabView::raceStarted);
    connect(ss, &StreamSession::laneStarted, m_view, &StreamLabView::laneStarted);
    connect(ss, &StreamSession::chunkArrived, m_view, &StreamLabView::addChunk);
    connect(ss, &StreamSession::runFinished, m_view, &StreamLabView::runFinished);
    connect(ss, &StreamSession::raceFinished, this, [this](const RaceRecord& race) {
        m_view->raceFinished(race);
        QStringList parts;
        for (const StreamRunResult& r : race.results)
            parts << tr("%1 %2 s%3").arg(r.policy).arg(r.ttftSeconds, 0, 'f', 3).arg(r.sloMet ? QString() : tr(" (missed)"));
        emit taskEnded(tr("Stream: TTFT %1 (SLO %2 s).").arg(parts.join(QStringLiteral(", "))).arg(race.config.sloSeconds, 0, 'f', 2));
    });
    connect(ss, &StreamSession::failed, this, [this](const QString& message) {
        m_view->runEnded(tr("Error: %1").arg(message));
        emit taskEnded(tr("Stream: %1").arg(message));
        emit errorReported(tr("Stream"), message);
    });
    connect(ss, &StreamSession::cancelled, this, [this] {
        m_view->runEnded(tr("Stopped; the session is ready for another run."));
        emit taskEnded(tr("Stream: stopped."));
    });
    connect(m_view, &StreamLabView::scheduleEdited, this, &StreamPage::previewSchedule);
    connect(m_view, &StreamLabView::saveRunRequested, this, &StreamPage::showSaveDialog);
    connect(m_view, &StreamLabView::openRunRequested, this, &StreamPage::showOpenDialog);
    connect(m_view, &StreamLabView::exportFigureRequested, this, &StreamPage::showExportDialog);
}

void StreamPage::previewSchedule()
{
    // Parsing a schedule and sampling it is cheap: done here, drawn before any race.
    const StreamConfig c = m_view->config();
    try {
        m_view->setSchedulePreview(StreamSession::availableSeries(c, std::max(2.0 * c.sloSeconds, 1.0)), QString());
    } catch (const std::exception& e) {
        m_view->setSchedulePreview({}, QString::fromStdString(e.what()));
    }
}

void StreamPage::start(const CodecProfile& profile, std::shared_ptr<const CodecProfile> transform)
{
    if (!m_session->isReady() || m_session->isRunning()) return;
    m_session->start(m_view->config(), profile, std::move(transform));
}

void StreamPage::stop() { m_session->stop(); }

bool StreamPage::saveRace(const QString& path)
{
    QString error;
    if (m_view->race().results.empty())
        error = tr("%1: nothing to save: race first").arg(path);
    else
        saveRaceFile(path, m_view->race(), &error);
    if (!error.isEmpty()) {
        emit errorReported(tr("Could not save the run"), error);
        return false;
    }
    emit statusMessage(tr("Saved the run to %1.").arg(path));
    return true;
}

bool StreamPage::openRace(const QString& path)
{
    QString error;
    RaceRecord race;
    if (!loadRaceFile(path, &race, &error)) {
        emit errorReported(tr("Could not open the run"), error);
        return false;
    }
    m_view->showRace(race);
    m_view->setStatus(tr("Opened %1 (%n run(s)).", nullptr, int(race.results.size())).arg(QFileInfo(path).fileName()));
    emit raceOpened();
    emit statusMessage(tr("Opened the run %1.").arg(QFileInfo(path).fileName()));
    return true;
}

bool StreamPage::exportFigure(const QString& path)
{
    QString error;
    if (!m_view->exportFigure(path, &error)) {
        emit errorReported(tr("Could not export the figure"), error);
        return false;
    }
    emit statusMessage(tr("Exported the stream figure to %1.").arg(path));
    return true;
}

void StreamPage::showSaveDialog()
{
    const QString path = QFileDialog::getSaveFileName(m_dialogParent, tr("Save Stream Run"), QStringLiteral("stream-run.json"),
                                                      tr("Stream runs (*.json)"));
    if (!path.isEmpty()) saveRace(path);
}

void StreamPage::showOpenDialog()
{
    const QString path = QFileDialog::getOpenFileName(m_dialogParent, tr("Open Stream Run"), QString(),
                                                      tr("Stream runs (*.json);;All files (*)"));
    if (!path.isEmpty()) openRace(path);
}

void StreamPage::showExportDialog()
{
    const QString path = QFileDialog::getSaveFileName(m_dialogParent, tr("Export Stream Figure"),
                                                      QStringLiteral("stream-race.png"), plotImageFilter());
    if (!path.isEmpty()) exportFigure(path);
}

}  // namespace kvscope
