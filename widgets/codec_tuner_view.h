// CodecTunerView: edit a CacheGen codec profile and see what it costs and what it breaks.
//   left:   chunk size, delta group, quantizers, the level being edited, and its bins per layer
//           for K and V (BinsTableModel; select rows, type bins, Set K / Set V / Set both);
//   right:  live size of the edited level (bits/value, bytes, ratios vs fp16 and int8), its
//           quality (ΔPPL, KL, token agreement, the two answers side by side) and a
//           rate-distortion plot with the current point, the profile's levels, the transform
//           codec's levels (with the stages switched on) and the baselines.
// Quality comes from the held-out continuation, or from a quality suite file (chosen here, scored
// by the app in the background); the transform codec's stages are toggles the app hands over.
// Edits emit settingsChanged() once the user pauses (kDebounceMs); the app's TunerSession runs
// the trial and the quality measurement on workers and hands the figures back as value structs.
#pragma once

#include "view_data.h"

#include "codec/profile.h"
#include "eval/layer_sensitivity.h"
#include "kv/kv_compare.h"
#include "kv_metatypes.h"

#include <QMetaType>
#include <QString>
#include <QWidget>

#include <vector>

class QComboBox;
class QFormLayout;
class QGridLayout;
class QGroupBox;
class QHBoxLayout;
class QCustomPlot;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QPushButton;
class QSpinBox;
class QTableView;
class QTimer;
class QVBoxLayout;

namespace kvscope {

class BinsTableModel;

class CodecTunerView : public QWidget {
    Q_OBJECT
public:
    static constexpr int kDebounceMs = 250;

    explicit CodecTunerView(QWidget* parent = nullptr);
    ~CodecTunerView() override;

    // The profile as edited now (the edited level's bins taken from the table).
    CodecProfile profile() const;
    int currentLevel() const;  // 1-based
    BinsTableModel* binsModel() const { return m_model; }
    QTableView* binsTable() const { return m_table; }
    QCustomPlot* rdPlot() const { return m_rdPlot; }
    QSpinBox* chunkSpin() const { return m_chunk; }
    QSpinBox* deltaSpin() const { return m_delta; }
    QSpinBox* binsSpin() const { return m_setBins; }
    const TrialFigures& trial() const { return m_trial; }
    bool hasTrial() const { return m_hasTrial; }
    const QualityFigures& quality() const { return m_quality; }
    bool hasQuality() const { return m_hasQuality; }
    // Text of a figure label: bits, bytes, fp16, int8, dppl, kl, agreement.
    QString figure(const QString& key) const;
    bool hasRdPoints() const { return !m_rd.empty(); }
    const std::vector<RdPoint>& rdPoints() const { return m_rd; }
    QString qualitySource() const;
    // The rate-distortion points as CSV (codec, label, bits per value, ΔPPL %, KL): exact values.
    QString rdCsv() const;
    QString suitePath() const;
    QString rdSource() const { return m_rdSourceText; }
    QString transformNote() const;
    const std::vector<CodecStage>& stages() const { return m_stages; }

public slots:
    // Shows a profile (its default level selected) for a cache of profile.numLayers layers.
    void setProfile(const kvscope::CodecProfile& profile);
    void setAvailable(bool cache, bool quality, const QString& note);
    // Sets bins on the selected rows (K, V or both). Returns through binsEdited.
    void setBinsOnSelection(bool keys, bool values, int bins);
    void setTrial(const kvscope::TrialFigures& trial);
    void setQuality(const kvscope::QualityFigures& quality);
    void setSensitivity(const std::vector<kvscope::LayerSensitivity>& sensitivity);
    void setRdPoints(const std::vector<kvscope::RdPoint>& points);
    void setStatus(const QString& text);
    void clearRdPoints();
    // Where quality comes from: ids with labels; ids in `disabled` are listed but not selectable
    // (a source that has not landed yet says so).
    void setQualitySources(const QStringList& ids, const QStringList& labels, const QStringList& disabled);
    // The codec's stages as toggles (empty: the box is hidden).
    void setStages(const std::vector<kvscope::CodecStage>& stages);
    // Switches one stage (as a click on its toggle does).
    void setStageOn(const QString& id, bool on);
    void setSuitePath(const QString& path);
    // What the rate-distortion points were scored on ("continuation", "suite mini (...)").
    void setRdSource(const QString& source);
    // Which transform ladder the points show ("calibrated default ladder (7 levels)", "fitted on
    // this cache ...", or that it is being calibrated); cleared with the points.
    void setTransformNote(const QString& note);
    void setQualitySource(const QString& id);

signals:
    void qualitySourceChanged(const QString& id);
    void chooseSuiteRequested();
    void stagesChanged();
    void settingsChanged();  // debounced
    void sensitivityRequested(int bins);
    void evaluateRequested();
    void autoTuneRequested();
    void loadProfileRequested();
    void saveProfileRequested();
    void exportLmcacheRequested();

private:
    void edited();       // restarts the debounce timer
    void storeLevel();   // table -> m_profile.levels[current]
    void showLevel();    // m_profile.levels[current] -> table
    void updateRdPlot();
    void addRdNotes(QVBoxLayout* layout);  // m_rdSource and m_transformNote
    // The constructor's parts, in the order it builds them.
    QFormLayout* buildSettings();
    QHBoxLayout* buildBinsEditor();
    QGridLayout* buildActions();
    void addQualityRows(QFormLayout* settings);  // quality source, suite, distortion axis; m_stageBox
    QWidget* buildResults();

    CodecProfile m_profile;
    int m_level = 0;  // 0-based, edited level
    TrialFigures m_trial;
    QualityFigures m_quality;
    bool m_hasTrial = false, m_hasQuality = false;
    std::vector<RdPoint> m_rd;
    bool m_loading = false;

    BinsTableModel* m_model = nullptr;
    QTableView* m_table = nullptr;
    QComboBox* m_levelCombo = nullptr;
    QSpinBox* m_chunk = nullptr;
    QSpinBox* m_delta = nullptr;
    QComboBox* m_keyQuant = nullptr;
    QComboBox* m_valueQuant = nullptr;
    QSpinBox* m_setBins = nullptr;
    QSpinBox* m_sensBins = nullptr;
    QPushButton* m_sensButton = nullptr;
    QPushButton* m_evalButton = nullptr;
    QPushButton* m_tuneButton = nullptr;
    QLabel* m_status = nullptr;
    QGroupBox* m_figures = nullptr;
    QPlainTextEdit* m_originalAnswer = nullptr;
    QPlainTextEdit* m_answer = nullptr;
    QCustomPlot* m_rdPlot = nullptr;
    QComboBox* m_qualitySource = nullptr;
    QGroupBox* m_stageBox = nullptr;
    QWidget* m_suiteRow = nullptr;
    QLineEdit* m_suitePath = nullptr;
    QString m_suiteFile;  // the full path behind the field's shown one
    QLabel* m_rdSource = nullptr;
    QString m_rdSourceText;
    QLabel* m_transformNote = nullptr;
    std::vector<CodecStage> m_stages;
    bool m_useDeltaPpl = false;
    QTimer* m_debounce = nullptr;
};

}  // namespace kvscope

