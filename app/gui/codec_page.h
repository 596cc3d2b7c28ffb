// CodecPage: the Codec page's controller. It owns the codec tuner (CodecTunerView) and its
// session (TunerSession: trials, quality, sensitivity, rate-distortion points and auto-tuning on
// workers), evaluates the rate-distortion plot when the page opens for a cache and again after
// the transform stages are toggled, and opens, saves and exports codec profiles. What the window
// shows of it (status bar, progress, errors) leaves as signals.
// The transform codec's series shows the open model's calibrated default ladder
// (TunerSession::defaultTransform) unless the user's profile carries a calibrated model of its
// own; the first evaluation waits while that ladder is read or calibrated, and a note on the page
// says which ladder the points show.
#pragma once

#include "codec/profile.h"
#include "eval/samples.h"
#include "kv/kv_set.h"

#include <QObject>
#include <QString>

#include <memory>

class QTimer;
class QWidget;

namespace kvscope {

class CodecTunerView;
class Model;
class TunerSession;

class CodecPage : public QObject {
    Q_OBJECT
public:
    // dialogParent: the window the file dialogs belong to.
    explicit CodecPage(QWidget* dialogParent, QObject* parent = nullptr);

    CodecTunerView* view() const { return m_view; }
    TunerSession* session() const { return m_session; }
    CodecProfile profile() const;
    int sensitivityBins() const { return m_sensitivityBins; }  // of the last sensitivity asked for

    // A new cache (and the model and sample it came from): a profile for its layers, the stages
    // it can feed, what can be measured; the previous cache's points are dropped.
    void setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv, const SampleContext& sample);
    // The page came to the front: its rate-distortion plot fills itself (in the background) the
    // first time for a cache.
    void opened();
    void evaluateRateDistortion();
    void measureSensitivity(int bins);
    // A profile for the cache of setSource (as many layers): errors go to errorReported.
    void openProfile(const QString& path);
    void saveProfile(const QString& path);
    void exportLmcache(const QString& path);

    // What the Stream page's race streams, as `kvscope-cli stream` without --codec
    // (eval/stream_codec.h): the profile's own calibrated transform, else the open model's
    // calibrated ladder when the model has a ladder of its own; null: CacheGen's levels.
    std::shared_ptr<const CodecProfile> streamTransform() const;

signals:
    void taskStarted(const QString& text, int maximum);
    void progressChanged(int value);
    void taskEnded(const QString& text);
    void statusMessage(const QString& text);
    void errorReported(const QString& title, const QString& message);
    void failed(const QString& message);  // a session task failed (shown on the page, no box)
    void levelsChanged(int levels);       // the profile now has this many levels
    void profileOpened();                 // the window shows the page

private:
    void connectSession();
    void connectView();
    void stagesToggled();
    void ladderChanged();
    // The stages for the shown profile and cache; keepToggles: the user's toggles stay where they
    // can (else only the transform codec's own on/off).
    void showStages(bool keepToggles);
    // The calibrated default ladder the transform series uses now, or null (the profile has a
    // calibrated model of its own, or there is none for this cache).
    const CodecProfile* ladder() const;
    CodecProfile transformProfile() const;  // the edited profile, with ladder()'s transform parts
    QString transformNote(const CodecProfile& evaluated, bool fromLadder, bool dropped) const;

    QWidget* m_dialogParent;
    CodecTunerView* m_view;
    TunerSession* m_session;
    QTimer* m_stageTimer = nullptr;  // re-evaluates after stage toggles
    int m_sensitivityBins = 4;
    int m_cacheLayers = 0;  // of the cache of setSource; 0 = none
    std::shared_ptr<const KvSet> m_kv;
    bool m_evaluateWhenReady = false;  // evaluate once the default ladder settles
    QString m_pendingNote;             // transformNote of the evaluation in flight
};

}  // namespace kvscope
