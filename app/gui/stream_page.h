// StreamPage: the Stream page's controller. It owns the page's view (StreamLabView) and its
// session (StreamSession: races on a worker), feeds the session's chunks and results to the view,
// previews the link schedule being edited, and saves, opens and exports races (race_file.h).
// What the window shows of it (status bar, progress, errors) leaves as signals.
#pragma once

#include "codec/profile.h"

#include <QObject>
#include <QString>

#include <memory>

class QWidget;

namespace kvscope {

class StreamLabView;
class StreamSession;

class StreamPage : public QObject {
    Q_OBJECT
public:
    // dialogParent: the window the file dialogs belong to.
    explicit StreamPage(QWidget* dialogParent, QObject* parent = nullptr);

    StreamLabView* view() const { return m_view; }
    StreamSession* session() const { return m_session; }

    // A race of the view's settings with `profile` (CacheGen's levels), or with `transform`'s
    // calibrated transform ladder when given; nothing when no cache is ready or one runs.
    void start(const CodecProfile& profile, std::shared_ptr<const CodecProfile> transform = nullptr);
    void stop();
    // @return false after reporting the error (errorReported).
    bool saveRace(const QString& path);
    bool openRace(const QString& path);  // shows it in the view
    bool exportFigure(const QString& path);
    void showSaveDialog();
    void showOpenDialog();
    void showExportDialog();

signals:
    void taskStarted(const QString& text, int maximum);
    void progressChanged(int value);
    void taskEnded(const QString& text);
    void statusMessage(const QString& text);
    void errorReported(const QString& title, const QString& message);
    void raceOpened();  // the window shows the page

private:
    void previewSchedule();

    QWidget* m_dialogParent;
    StreamLabView* m_view;
    StreamSession* m_session;
};

}  // namespace kvscope
