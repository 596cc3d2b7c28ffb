#include "codec_page.h"

#include "codec_tuner_view.h"
#include "tuner_session.h"

#include "eval/samples.h"
#include "eval/stream_codec.h"

#include <QApplication>
#include <QClipboard>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QSaveFile>
#include <QTimer>

#include <exception>
#include <stdexcept>

namespace kvscope {

CodecPage::CodecPage(QWidget* dialogParent, QObject* parent)
    : QObject(parent), m_dialogParent(dialogParent), m_view(new CodecTunerView), m_session(new TunerSession(this))
{
    m_view->setObjectName(QStringLiteral("codecTunerView"));
    connectSession();
    connectView();
    // Quality from the held-out continuation or a quality suite (core/eval/suite.h); the
    // transform codec's stages (core/codec/transform.h) as toggles.
    m_view->setQualitySources({QStringLiteral("continuation"), QStringLiteral("suite")},
                              {tr("held-out continuation and one answer"), tr("quality suite (file below)")}, {});
    try {
        const QString mini = QString::fromStdString(samplesDir()) + QStringLiteral("/suites/mini.json");
        if (QFileInfo::exists(mini)) m_view->setSuitePath(mini);
    } catch (const std::exception&) {
        // no samples installed: the user names a suite file
    }
    m_view->setStages(TunerSession::transformStages(m_view->profile(), nullptr));
}

CodecProfile CodecPage::profile() const { return m_view->profile(); }

void CodecPage::connectSession()
{
    TunerSession* ts = m_session;
    connect(ts, &TunerSession::trialReady, m_view, &CodecTunerView::setTrial);
    connect(ts, &TunerSession::qualityReady, m_view, &CodecTunerView::setQuality);
    connect(ts, &TunerSession::sensitivityReady, m_view, &CodecTunerView::setSensitivity);
    connect(ts, &TunerSession::evaluated, this, [this](const std::vector<RdPoint>& points, const QString& source) {
        m_view->setRdPoints(points);
        m_view->setRdSource(source);
        m_view->setTransformNote(m_pendingNote);
    });
    connect(ts, &TunerSession::defaultTransformChanged, this, &CodecPage::ladderChanged);
    connect(ts, &TunerSession::tuned, this, [this](const CodecProfile& profile, const QString& summary) {
        m_view->setProfile(profile);
        m_view->setStatus(summary);
        emit levelsChanged(int(profile.levels.size()));
    });
    connect(ts, &TunerSession::phaseChanged, this, &CodecPage::taskStarted);
    connect(ts, &TunerSession::progressChanged, this, &CodecPage::progressChanged);
    connect(ts, &TunerSession::longTaskDone, this, &CodecPage::taskEnded);
    connect(ts, &TunerSession::cancelled, this, [this] { emit taskEnded(tr("Codec tuner: cancelled.")); });
    connect(ts, &TunerSession::failed, this, [this](const QString& message) {
        m_view->setStatus(tr("Error: %1").arg(message));
        emit taskEnded(tr("Codec tuner: %1").arg(message));
        emit failed(message);
    });
}

void CodecPage::connectView()
{
    connect(m_view, &CodecTunerView::settingsChanged, this, [this] {
        if (!m_session->hasCache()) return;
        m_session->requestTrial(m_view->profile(), m_view->currentLevel());
    });
    connect(m_view, &CodecTunerView::sensitivityRequested, this, &CodecPage::measureSensitivity);
    connect(m_view, &CodecTunerView::evaluateRequested, this, &CodecPage::evaluateRateDistortion);
    connect(m_view, &CodecTunerView::autoTuneRequested, this, [this] { m_session->autoTune(m_view->profile()); });
    connect(m_view, &CodecTunerView::loadProfileRequested, this, [this] {
        const QString path = QFileDialog::getOpenFileName(m_dialogParent, tr("Open Codec Profile"), QString(),
                                                          tr("Profiles (*.json);;All files (*)"));
        if (!path.isEmpty()) openProfile(path);
    });
    connect(m_view, &CodecTunerView::saveProfileRequested, this, [this] {
        const QString path = QFileDialog::getSaveFileName(m_dialogParent, tr("Save Codec Profile"),
                                                          QStringLiteral("profile.json"), tr("Profiles (*.json)"));
        if (!path.isEmpty()) saveProfile(path);
    });
    connect(m_view, &CodecTunerView::exportLmcacheRequested, this, [this] {
        const QString path = QFileDialog::getSaveFileName(m_dialogParent, tr("Export LMCache CacheGen configuration"),
                                                          QStringLiteral("cachegen_config.py"),
                                                          tr("Python (*.py);;Text (*.txt)"));
        if (!path.isEmpty()) exportLmcache(path);
    });
    connect(m_view, &CodecTunerView::chooseSuiteRequested, this, [this] {
        const QString path = QFileDialog::getOpenFileName(m_dialogParent, tr("Open Quality Suite"), m_view->suitePath(),
                                                          tr("Suites (*.json);;All files (*)"));
        if (!path.isEmpty()) m_view->setSuitePath(path);
    });
    connect(m_view, &CodecTunerView::stagesChanged, this, &CodecPage::stagesToggled);
}

void CodecPage::stagesToggled()
{
    // A toggle re-evaluates the points once the user pauses (the trial debounce's delay).
    if (!m_stageTimer) {
        m_stageTimer = new QTimer(this);
        m_stageTimer->setSingleShot(true);
        m_stageTimer->setInterval(CodecTunerView::kDebounceMs);
        connect(m_stageTimer, &QTimer::timeout, this, [this] {
            if (m_session->canMeasureQuality() && m_view->hasRdPoints()) evaluateRateDistortion();
        });
    }
    m_stageTimer->start();
}

void CodecPage::setSource(std::shared_ptr<const Model> model, std::shared_ptr<const KvSet> kv, const SampleContext& sample)
{
    m_session->setSource(model, kv, sample);
    m_kv = kv;
    m_cacheLayers = kv ? kv->shape().numLayers : 0;
    m_evaluateWhenReady = false;
    if (kv) {
        CodecProfile profile = m_view->profile();
        if (profile.levels.empty() || profile.numLayers != kv->shape().numLayers)
            profile = defaultProfile(kv->shape().numLayers);
        m_view->setProfile(profile);
        emit levelsChanged(int(profile.levels.size()));
        showStages(true);
    }
    m_view->setAvailable(bool(kv), m_session->canMeasureQuality(), m_session->qualityNote());
    m_view->clearRdPoints();  // the points measured the previous cache
}

void CodecPage::showStages(bool keepToggles)
{
    std::vector<CodecStage> stages = TunerSession::transformStages(transformProfile(), m_kv.get());
    for (CodecStage& st : stages)
        for (const CodecStage& old : m_view->stages())
            if (old.id == st.id && st.enabled && old.enabled && (keepToggles || st.id == QLatin1String("transform")))
                st.on = old.on;
    m_view->setStages(stages);
}

const CodecProfile* CodecPage::ladder() const
{
    return m_view->profile().transformModel.empty() ? m_session->defaultTransform() : nullptr;
}

std::shared_ptr<const CodecProfile> CodecPage::streamTransform() const
{
    const CodecProfile& p = m_view->profile();
    if (p.hasTransform() && !p.transformModel.empty()) return std::make_shared<const CodecProfile>(p);
    if (!ladder() || !m_kv || ownTransformLadder(m_kv->modelFingerprint, nullptr).empty()) return nullptr;
    return std::make_shared<const CodecProfile>(transformProfile());
}

CodecProfile CodecPage::transformProfile() const
{
    CodecProfile p = m_view->profile();
    if (const CodecProfile* l = ladder()) {
        p.transform = l->transform;
        p.transformLevels = l->transformLevels;
        p.transformDefaultLevel = l->transformDefaultLevel;
        p.transformModel = l->transformModel;
    }
    return p;
}

void CodecPage::ladderChanged()
{
    // The ladder's own switches, so that the series shows it as calibrated.
    if (m_kv) showStages(false);
    if (!m_evaluateWhenReady || !m_session->canMeasureQuality()) return;
    if (m_session->isBusy() && !m_session->isEvaluating()) return;  // the user's task goes on; Evaluate later
    m_evaluateWhenReady = false;
    evaluateRateDistortion();
}

void CodecPage::opened()
{
    // Levels and baselines are evaluated in the background the first time the page opens for a
    // cache (cancel in the status bar), once the transform codec's default ladder is there.
    if (!m_session->canMeasureQuality() || m_view->hasRdPoints() || m_session->isBusy()) return;
    if (m_session->isCalibrating()) {
        m_evaluateWhenReady = true;
        m_view->setTransformNote(tr("Transform codec: its calibrated default ladder is being prepared (status bar); the "
                                    "plot fills when it is ready, or now with Evaluate (the transform then fitted on "
                                    "this cache)."));
        return;
    }
    evaluateRateDistortion();
}

void CodecPage::evaluateRateDistortion()
{
    CodecProfile profile = transformProfile();
    const bool fromLadder = ladder() != nullptr;
    QString note;
    const bool transform = TunerSession::applyStages(m_view->stages(), &profile, &note);
    if (!note.isEmpty()) m_view->setStatus(note);
    m_pendingNote = transform ? transformNote(profile, fromLadder, !note.isEmpty()) : QString();
    if (transform && m_session->isCalibrating()) m_evaluateWhenReady = true;  // again with the ladder
    if (m_view->qualitySource() == QLatin1String("suite")) {
        const QString path = m_view->suitePath();
        if (path.isEmpty()) {
            m_view->setStatus(tr("Choose a quality suite file first (Suite: …)."));
            return;
        }
        m_session->evaluateSuite(profile, transform, path);
        return;
    }
    m_session->evaluate(profile, transform);
}

QString CodecPage::transformNote(const CodecProfile& evaluated, bool fromLadder, bool dropped) const
{
    const int levels = int(evaluated.transformLevels.size());
    if (!evaluated.transformModel.empty())
        return fromLadder ? tr("Transform codec: calibrated default ladder (%1 levels).").arg(levels)
                          : tr("Transform codec: the profile's calibrated model (%1 levels).").arg(levels);
    QString why = dropped ? tr("the switches differ from the calibrated settings") : m_session->defaultTransformNote();
    if (why.isEmpty()) why = tr("no calibrated ladder for this cache's model");
    return tr("Transform codec: fitted on this cache (%1 levels, its model bytes counted): %2.").arg(levels).arg(why);
}

void CodecPage::measureSensitivity(int bins)
{
    m_sensitivityBins = bins;
    m_session->measureSensitivity(m_view->profile(), bins);
}

void CodecPage::openProfile(const QString& path)
{
    try {
        const CodecProfile p = loadProfile(QFile::encodeName(path).toStdString());
        if (m_cacheLayers > 0 && p.numLayers != m_cacheLayers)
            throw std::runtime_error(QStringLiteral("%1: the profile is for %2 layers; the open cache has %3")
                                         .arg(path)
                                         .arg(p.numLayers)
                                         .arg(m_cacheLayers)
                                         .toStdString());
        m_view->setProfile(p);
        if (m_kv) showStages(false);  // the profile's own switches (or the default ladder's)
        emit levelsChanged(int(p.levels.size()));
        emit profileOpened();
        emit statusMessage(tr("Opened the profile %1 (%2 levels).").arg(QFileInfo(path).fileName()).arg(p.levels.size()));
    } catch (const std::exception& e) {
        emit errorReported(tr("Could not open the profile"), QString::fromStdString(e.what()));
    }
}

void CodecPage::saveProfile(const QString& path)
{
    try {
        kvscope::saveProfile(m_view->profile(), QFile::encodeName(path).toStdString());
        emit statusMessage(tr("Saved the profile to %1.").arg(path));
    } catch (const std::exception& e) {
        emit errorReported(tr("Could not save the profile"), QString::fromStdString(e.what()));
    }
}

void CodecPage::exportLmcache(const QString& path)
{
    const CodecProfile p = m_view->profile();
    QString text = tr("# LMCache CacheGen configuration, one per level (end_layer exclusive), from kvscope\n");
    for (size_t i = 0; i < p.levels.size(); ++i)
        text += QStringLiteral("# level %1: %2\n%3\n")
                    .arg(i + 1)
                    .arg(QString::fromStdString(p.levels[i].name), QString::fromStdString(lmcacheConfigPython(p.levels[i])));
    QSaveFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Text) || file.write(text.toUtf8()) < 0 || !file.commit()) {
        emit errorReported(tr("Could not export"), tr("%1: %2").arg(path, file.errorString()));
        return;
    }
    QApplication::clipboard()->setText(text);
    emit statusMessage(tr("Exported %1 levels to %2 (also copied to the clipboard).").arg(p.levels.size()).arg(path));
}

}  // namespace kvscope
