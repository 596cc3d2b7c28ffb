// One palette and one plot style for every plot in kvscope, so a colour means the same thing on
// every page:
//   K and V        one colour each (blue, orange), solid for raw values, dashed for deltas;
//   levels         a sequential scale (light = few bits, dark = many), the same in the codec's
//                  rate-distortion plot, the stream timelines and the race legend;
//   baselines      fixed colours per codec (fp16, int8, KIVI, zstd, text/recompute);
//   policies       adaptive in the accent colour, fixed levels in their level colour, text and
//                  int8 in their baseline colour;
//   TTFT parts     one colour per part (recompute shares the text colour: it is text's cost).
// applyPlotStyle() gives a plot the theme's background, axes, grid, fonts and legend; series
// colours do not depend on the theme (they are chosen to read on light and dark backgrounds).
#pragma once

#include "kv/kv_set.h"

#include <QColor>
#include <QObject>
#include <QString>

class QCustomPlot;
class QCPColorGradient;
class QWidget;

namespace kvscope::style {

enum class Theme { Light, Dark };

Theme theme();
// Sets the theme for plots styled from now on and restyles every plot under `root` (the
// application palette too, when root is null or a top-level window).
void setTheme(Theme theme, QWidget* root = nullptr);

QColor kindColor(KvKind kind);  // K blue, V orange
inline QColor keyColor() { return kindColor(KvKind::Key); }
inline QColor valueColor() { return kindColor(KvKind::Value); }
QColor outlierColor();          // outlier channels
QColor accentColor();           // the user's own point: the edited level, the adaptive policy
QColor sloColor();              // deadlines and budgets
QColor neutralColor();          // available bandwidth, jobs, reference marks

// Level `level` (1-based) of `levels`: a sequential scale; 0 = text (the text baseline colour).
QColor levelColor(int level, int levels);
// "fp16", "int8", "kivi2", "kivi4", "zstd", "text"; other names a neutral grey.
QColor baselineColor(const QString& codec);
// The transform codec's levels (one family next to CacheGen's sequential levels).
QColor transformColor();
// "adaptive", "text", "int8", "level:N".
QColor policyColor(const QString& policy, int levels);
// TTFT parts in StreamRunResult order: transfer, decode, recompute, kv load, prefill, first token.
QColor partColor(int part);

// The sequential gradient for heat maps (magnitudes) and the diverging one for signed values.
QCPColorGradient sequentialGradient();
QCPColorGradient divergingGradient();

// Background, axes, grid, tick labels, legend, fonts: the theme's. Call once per plot after
// creating it (setTheme restyles existing plots).
void applyPlotStyle(QCustomPlot* plot);

// The legend in a row of its own above the axis rect (columns per line, 0 = all in one), so it
// never hides the data; call after applyPlotStyle.
void putLegendAbove(QCustomPlot* plot, int columns = 0);

// Emits changed() after setTheme, for views that redraw theme-dependent items.
class Notifier : public QObject {
    Q_OBJECT
public:
    static Notifier* instance();
signals:
    void changed();
};

}  // namespace kvscope::style
