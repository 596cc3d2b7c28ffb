#include "plot_style.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QApplication>
#include <QPalette>
#include <QStyleFactory>
#include <QWidget>

#include <algorithm>
#include <cmath>

namespace kvscope::style {

namespace {

Theme g_theme = Theme::Light;

// Colour-blind-safe hues (Okabe & Ito) for the qualitative roles.
const QColor kBlue(0, 114, 178), kOrange(230, 159, 0), kSky(86, 180, 233), kGreen(0, 158, 115),
    kYellow(240, 228, 66), kVermillion(213, 94, 0), kPurple(204, 121, 167);

// Stops of the sequential scale (viridis-like, reversed so that more bits read darker on white).
const QColor kSequential[] = {QColor(253, 231, 37), QColor(122, 209, 81), QColor(34, 168, 132),
                              QColor(42, 120, 142), QColor(65, 68, 135), QColor(68, 1, 84)};
constexpr int kSequentialStops = int(sizeof(kSequential) / sizeof(kSequential[0]));

QColor mix(const QColor& a, const QColor& b, double t)
{
    return QColor::fromRgbF(float(a.redF() + (b.redF() - a.redF()) * t), float(a.greenF() + (b.greenF() - a.greenF()) * t),
                            float(a.blueF() + (b.blueF() - a.blueF()) * t));
}

QColor sequentialAt(double t)
{
    t = std::clamp(t, 0.0, 1.0) * (kSequentialStops - 1);
    const int i = std::min(int(t), kSequentialStops - 2);
    return mix(kSequential[i], kSequential[i + 1], t - i);
}

struct Chrome {
    QColor background, foreground, grid, subGrid, legendBrush;
};

Chrome chrome()
{
    if (g_theme == Theme::Dark)
        return {QColor(32, 33, 36), QColor(222, 222, 222), QColor(72, 74, 80), QColor(52, 54, 58),
                QColor(32, 33, 36, 200)};
    return {QColor(255, 255, 255), QColor(40, 40, 40), QColor(215, 215, 215), QColor(238, 238, 238),
            QColor(255, 255, 255, 210)};
}

void styleAxis(QCPAxis* axis, const Chrome& c)
{
    const QPen pen(c.foreground, 1);
    axis->setBasePen(pen);
    axis->setTickPen(pen);
    axis->setSubTickPen(pen);
    axis->setTickLabelColor(c.foreground);
    axis->setLabelColor(c.foreground);
    axis->grid()->setPen(QPen(c.grid, 1, Qt::DotLine));
    axis->grid()->setSubGridPen(QPen(c.subGrid, 1, Qt::DotLine));
    axis->grid()->setZeroLinePen(QPen(c.grid, 1));
}

QPalette darkPalette()
{
    QPalette p;
    const QColor window(45, 46, 50), base(32, 33, 36), text(222, 222, 222), disabled(130, 130, 130);
    p.setColor(QPalette::Window, window);
    p.setColor(QPalette::WindowText, text);
    p.setColor(QPalette::Base, base);
    p.setColor(QPalette::AlternateBase, window);
    p.setColor(QPalette::ToolTipBase, base);
    p.setColor(QPalette::ToolTipText, text);
    p.setColor(QPalette::Text, text);
    p.setColor(QPalette::Button, window);
    p.setColor(QPalette::ButtonText, text);
    p.setColor(QPalette::BrightText, QColor(255, 80, 80));
    p.setColor(QPalette::Highlight, kBlue);
    p.setColor(QPalette::HighlightedText, Qt::white);
    p.setColor(QPalette::Link, kSky);
    p.setColor(QPalette::PlaceholderText, disabled);
    p.setColor(QPalette::Disabled, QPalette::Text, disabled);
    p.setColor(QPalette::Disabled, QPalette::ButtonText, disabled);
    p.setColor(QPalette::Disabled, QPalette::WindowText, disabled);
    return p;
}

}  // namespace

Theme theme()
{
    return g_theme;
}

void setTheme(Theme t, QWidget* root)
{
    g_theme = t;
    if (!root || root->isWindow()) {
        if (auto* app = qobject_cast<QApplication*>(QCoreApplication::instance())) {
            // Fusion follows the palette on every platform; native styles may not.
            if (t == Theme::Dark) {
                app->setStyle(QStyleFactory::create(QStringLiteral("Fusion")));
                app->setPalette(darkPalette());
            } else {
                app->setPalette(app->style()->standardPalette());
            }
        }
    }
    QList<QCustomPlot*> plots;
    if (root)
        plots = root->findChildren<QCustomPlot*>();
    else
        for (QWidget* w : QApplication::topLevelWidgets()) plots += w->findChildren<QCustomPlot*>();
    for (QCustomPlot* plot : plots) {
        applyPlotStyle(plot);
        replotSoon(plot);
    }
    emit Notifier::instance()->changed();
}

QColor kindColor(KvKind kind)
{
    return kind == KvKind::Key ? kBlue : kOrange;
}

QColor outlierColor()
{
    return kVermillion;
}

QColor accentColor()
{
    return QColor(204, 0, 102);
}

QColor sloColor()
{
    return QColor(200, 30, 30);
}

QColor neutralColor()
{
    return g_theme == Theme::Dark ? QColor(150, 150, 150) : QColor(120, 120, 120);
}

QColor levelColor(int level, int levels)
{
    if (level <= 0) return baselineColor(QStringLiteral("text"));
    // Skip the palest stop: it does not read on white.
    const double lo = 0.15;
    const double t = levels <= 1 ? 1.0 : lo + (1.0 - lo) * double(level - 1) / double(levels - 1);
    return sequentialAt(t);
}

QColor baselineColor(const QString& codec)
{
    if (codec == QLatin1String("fp16")) return g_theme == Theme::Dark ? QColor(200, 200, 200) : QColor(60, 60, 60);
    if (codec == QLatin1String("int8")) return kGreen;
    if (codec == QLatin1String("kivi2")) return kPurple;
    if (codec == QLatin1String("kivi4")) return QColor(150, 80, 130);
    if (codec == QLatin1String("zstd") || codec == QLatin1String("lossless")) return kSky;
    if (codec == QLatin1String("text")) return kVermillion;
    return neutralColor();
}

QColor transformColor() { return g_theme == Theme::Dark ? QColor(64, 200, 190) : QColor(0, 128, 128); }

QColor policyColor(const QString& policy, int levels)
{
    if (policy == QLatin1String("adaptive")) return accentColor();
    if (policy == QLatin1String("text") || policy == QLatin1String("int8")) return baselineColor(policy);
    if (policy.startsWith(QLatin1String("level:"))) return levelColor(policy.mid(6).toInt(), levels);
    return neutralColor();
}

QColor partColor(int part)
{
    static const QColor parts[] = {kSky, kGreen, kVermillion, QColor(170, 170, 170), kYellow, QColor(117, 112, 179)};
    return parts[std::clamp(part, 0, 5)];
}

QCPColorGradient sequentialGradient()
{
    QCPColorGradient g;
    g.clearColorStops();
    // Dark = small, bright = large on a heat map (the reverse of the level scale reads better
    // there: hot spots stand out).
    for (int i = 0; i < kSequentialStops; ++i)
        g.setColorStopAt(double(i) / (kSequentialStops - 1), kSequential[kSequentialStops - 1 - i]);
    g.setColorInterpolation(QCPColorGradient::ciRGB);
    return g;
}

QCPColorGradient divergingGradient()
{
    QCPColorGradient g;
    g.clearColorStops();
    g.setColorStopAt(0.0, QColor(33, 102, 172));
    g.setColorStopAt(0.5, QColor(247, 247, 247));
    g.setColorStopAt(1.0, QColor(178, 24, 43));
    g.setColorInterpolation(QCPColorGradient::ciRGB);
    return g;
}

void applyPlotStyle(QCustomPlot* plot)
{
    const Chrome c = chrome();
    plot->setBackground(c.background);
    for (QCPAxisRect* rect : plot->axisRects()) {
        rect->setBackground(c.background);
        for (QCPAxis* axis : rect->axes()) styleAxis(axis, c);
    }
    // A legend inside the axis rect gets a box that hides what is under it; one above it
    // (putLegendAbove) none.
    const bool inside = plot->axisRect() && plot->legend->layout() == plot->axisRect()->insetLayout();
    plot->legend->setBrush(inside ? QBrush(c.legendBrush) : QBrush(Qt::NoBrush));
    plot->legend->setBorderPen(inside ? QPen(c.grid) : QPen(Qt::NoPen));
    plot->legend->setTextColor(c.foreground);
    QFont legendFont = plot->font();
    legendFont.setPointSizeF(std::max(7.0, legendFont.pointSizeF() - 1));
    plot->legend->setFont(legendFont);
    for (int i = 0; i < plot->plotLayout()->elementCount(); ++i)
        if (auto* title = qobject_cast<QCPTextElement*>(plot->plotLayout()->elementAt(i))) title->setTextColor(c.foreground);
    plot->setAntialiasedElements(QCP::aePlottables | QCP::aeItems);
}

void putLegendAbove(QCustomPlot* plot, int columns)
{
    plot->legend->setVisible(true);
    if (columns > 0) plot->legend->setWrap(columns);
    plot->legend->setFillOrder(QCPLegend::foColumnsFirst, true);  // rearranges items already there
    // Take it out of the axis rect's inset layout, into a row of its own above the axis rect.
    if (plot->axisRect() && plot->legend->layout() == plot->axisRect()->insetLayout())
        plot->axisRect()->insetLayout()->take(plot->legend);
    plot->plotLayout()->insertRow(0);
    plot->plotLayout()->addElement(0, 0, plot->legend);
    plot->plotLayout()->setRowStretchFactor(0, 0.001);
    applyPlotStyle(plot);
}

Notifier* Notifier::instance()
{
    static Notifier notifier;
    return &notifier;
}

}  // namespace kvscope::style
