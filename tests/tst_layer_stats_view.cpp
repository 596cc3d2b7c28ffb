// LayerStatsView: what the user sees after setStats(): the plotted points, the pickers, the CSV that
// "Copy data as CSV" puts on the clipboard, and exported image files.
#include "gui/gui_testmain.h"

#include "layer_stats_view.h"

#include <qcustomplot.h>

#include <QClipboard>
#include <QComboBox>
#include <QMenu>
#include <QTemporaryDir>

using kvscope::KvKind;
using kvscope::LayerStatsView;
using kvscope::TensorStats;

namespace {

// Per channel absmax before scaling by (layer + 1); channel 2 of the keys is the outlier.
const float kKeyAbsmax[] = {1.0f, 2.0f, 24.0f, 1.5f};
const float kValueAbsmax[] = {0.5f, 0.25f, 0.75f, 1.0f};

// Values chosen to be exact in binary so the CSV text is predictable.
TensorStats makeTensor(int layer, KvKind kind)
{
    TensorStats s;
    s.layer = layer;
    s.kind = kind;
    const double scale = layer + 1;
    const bool key = kind == KvKind::Key;
    s.varianceRaw = (key ? 4.0 : 2.0) * scale;
    s.varianceDelta = (key ? 0.5 : 1.0) * scale;
    s.entropyBits = key ? 3.5 : 4.0;
    s.entropyBitsDelta = key ? 2.25 : 3.0;
    for (int c = 0; c < 4; ++c) {
        kvscope::ChannelStats ch;
        ch.absmax = (key ? kKeyAbsmax[c] : kValueAbsmax[c]) * float(scale);
        ch.min = -ch.absmax;
        ch.max = ch.absmax / 2;
        ch.mean = 0.125f;
        ch.std = 0.75f;
        s.channels.push_back(ch);
    }
    s.all.absmax = key ? 24.0f * float(scale) : 1.0f * float(scale);
    if (key) s.outlierChannels = {2};
    return s;
}

// Three layers, deliberately out of order: the view must sort by (layer, kind).
std::vector<TensorStats> threeLayers()
{
    return {makeTensor(2, KvKind::Value), makeTensor(0, KvKind::Key),   makeTensor(1, KvKind::Value),
            makeTensor(2, KvKind::Key),   makeTensor(0, KvKind::Value), makeTensor(1, KvKind::Key)};
}

QVector<QPointF> graphPoints(QCustomPlot* plot, const QString& name)
{
    for (int i = 0; i < plot->graphCount(); ++i) {
        if (plot->graph(i)->name() != name) continue;
        QVector<QPointF> points;
        for (const QCPGraphData& d : *plot->graph(i)->data()) points.append(QPointF(d.key, d.value));
        return points;
    }
    return {};
}

QVector<QPointF> barPoints(QCustomPlot* plot, const QString& name)
{
    for (int i = 0; i < plot->plottableCount(); ++i) {
        auto* bars = qobject_cast<QCPBars*>(plot->plottable(i));
        if (!bars || bars->name() != name) continue;
        QVector<QPointF> points;
        for (const QCPBarsData& d : *bars->data()) points.append(QPointF(d.key, d.value));
        return points;
    }
    return {};
}

}  // namespace

class TestLayerStatsView : public QObject {
    Q_OBJECT
private slots:
    void emptyViewShowsNothing();
    void layerPlotHoldsStats_data();
    void layerPlotHoldsStats();
    void layerComboHasOneEntryPerLayer();
    void channelPlotHighlightsOutliers_data();
    void channelPlotHighlightsOutliers();
    void layersCsvHasHeaderAndRows();
    void channelsCsvFollowsSelection();
    void missingKindLeavesCsvFieldsEmpty();
    void contextMenuCopiesCsv();
    void savePlotWritesFile_data();
    void savePlotWritesFile();
    void selectionSurvivesNewStats();
    void logScaleOnlyForPositiveVariance();
    void clickOnLayerPlotPicksLayer();
    void headDimMarksHeadBoundaries();
};

void TestLayerStatsView::emptyViewShowsNothing()
{
    LayerStatsView view;
    QCOMPARE(view.layerCombo()->count(), 0);
    QCOMPARE(view.selectedLayer(), -1);
    QCOMPARE(view.layerPlot()->graphCount(), 4);
    for (int i = 0; i < 4; ++i) QCOMPARE(view.layerPlot()->graph(i)->data()->size(), 0);
    QVERIFY(barPoints(view.channelPlot(), QStringLiteral("channels")).isEmpty());
    QCOMPARE(view.layersCsv(),
             QStringLiteral("layer,k_variance_raw,k_variance_delta,v_variance_raw,v_variance_delta,"
                            "k_entropy_bits,k_entropy_bits_delta,v_entropy_bits,v_entropy_bits_delta,"
                            "k_outlier_channels,v_outlier_channels\n"));
    QCOMPARE(view.channelsCsv(), QStringLiteral("channel,min,max,mean,std,absmax,outlier\n"));
}

void TestLayerStatsView::layerPlotHoldsStats_data()
{
    QTest::addColumn<int>("metric");
    QTest::addColumn<QString>("graph");
    QTest::addColumn<QVector<double>>("expected");  // value at layers 0, 1, 2

    const int variance = int(LayerStatsView::LayerMetric::Variance);
    const int entropy = int(LayerStatsView::LayerMetric::Entropy);
    QTest::newRow("variance K raw") << variance << "K raw" << QVector<double>{4, 8, 12};
    QTest::newRow("variance K delta") << variance << "K delta" << QVector<double>{0.5, 1, 1.5};
    QTest::newRow("variance V raw") << variance << "V raw" << QVector<double>{2, 4, 6};
    QTest::newRow("variance V delta") << variance << "V delta" << QVector<double>{1, 2, 3};
    QTest::newRow("entropy K raw") << entropy << "K raw" << QVector<double>{3.5, 3.5, 3.5};
    QTest::newRow("entropy K delta") << entropy << "K delta" << QVector<double>{2.25, 2.25, 2.25};
    QTest::newRow("entropy V raw") << entropy << "V raw" << QVector<double>{4, 4, 4};
    QTest::newRow("entropy V delta") << entropy << "V delta" << QVector<double>{3, 3, 3};
}

void TestLayerStatsView::layerPlotHoldsStats()
{
    QFETCH(int, metric);
    QFETCH(QString, graph);
    QFETCH(QVector<double>, expected);

    LayerStatsView view;
    view.setStats(threeLayers());
    view.setLayerMetric(LayerStatsView::LayerMetric(metric));
    const QVector<QPointF> points = graphPoints(view.layerPlot(), graph);
    QCOMPARE(points.size(), expected.size());
    for (int layer = 0; layer < expected.size(); ++layer) {
        QCOMPARE(points[layer].x(), double(layer));
        QCOMPARE(points[layer].y(), expected[layer]);
    }
}

void TestLayerStatsView::layerComboHasOneEntryPerLayer()
{
    LayerStatsView view;
    view.setStats(threeLayers());
    QCOMPARE(view.layerCombo()->count(), 3);
    for (int i = 0; i < 3; ++i) {
        QCOMPARE(view.layerCombo()->itemData(i).toInt(), i);
        QCOMPARE(view.layerCombo()->itemText(i), QStringLiteral("layer %1").arg(i));
    }
    QCOMPARE(view.selectedLayer(), 0);
    QCOMPARE(view.kindCombo()->count(), 2);

    // A different model replaces the list, it does not append to it.
    std::vector<TensorStats> five;
    for (int layer = 0; layer < 5; ++layer) five.push_back(makeTensor(layer, KvKind::Key));
    view.setStats(five);
    QCOMPARE(view.layerCombo()->count(), 5);
}

void TestLayerStatsView::channelPlotHighlightsOutliers_data()
{
    QTest::addColumn<int>("layer");
    QTest::addColumn<bool>("keys");
    QTest::newRow("layer 0 keys") << 0 << true;
    QTest::newRow("layer 1 values") << 1 << false;
    QTest::newRow("layer 2 keys") << 2 << true;
}

void TestLayerStatsView::channelPlotHighlightsOutliers()
{
    QFETCH(int, layer);
    QFETCH(bool, keys);
    const KvKind kind = keys ? KvKind::Key : KvKind::Value;

    LayerStatsView view;
    view.setStats(threeLayers());
    QSignalSpy changed(&view, &LayerStatsView::channelSelectionChanged);
    view.selectChannels(layer, kind);
    QCOMPARE(view.selectedLayer(), layer);
    QCOMPARE(view.selectedKind(), kind);
    if (layer != 0 || !keys) QCOMPARE(changed.count(), 1);

    const float* base = keys ? kKeyAbsmax : kValueAbsmax;
    QVector<QPointF> normal, outliers;
    for (int c = 0; c < 4; ++c) {
        const QPointF p(c, double(base[c] * float(layer + 1)));
        (keys && c == 2 ? outliers : normal).append(p);
    }
    QCOMPARE(barPoints(view.channelPlot(), QStringLiteral("channels")), normal);
    QCOMPARE(barPoints(view.channelPlot(), QStringLiteral("outliers")), outliers);
    QCOMPARE(view.channelPlot()->xAxis->range().lower, -0.5);
    QCOMPARE(view.channelPlot()->xAxis->range().upper, 3.5);
}

void TestLayerStatsView::layersCsvHasHeaderAndRows()
{
    LayerStatsView view;
    view.setStats(threeLayers());
    const QString expected = QStringLiteral(
        "layer,k_variance_raw,k_variance_delta,v_variance_raw,v_variance_delta,"
        "k_entropy_bits,k_entropy_bits_delta,v_entropy_bits,v_entropy_bits_delta,"
        "k_outlier_channels,v_outlier_channels\n"
        "0,4,0.5,2,1,3.5,2.25,4,3,1,0\n"
        "1,8,1,4,2,3.5,2.25,4,3,1,0\n"
        "2,12,1.5,6,3,3.5,2.25,4,3,1,0\n");
    QCOMPARE(view.layersCsv(), expected);
}

void TestLayerStatsView::channelsCsvFollowsSelection()
{
    LayerStatsView view;
    view.setStats(threeLayers());
    view.selectChannels(1, KvKind::Key);
    QCOMPARE(view.channelsCsv(), QStringLiteral("channel,min,max,mean,std,absmax,outlier\n"
                                                "0,-2,1,0.125,0.75,2,0\n"
                                                "1,-4,2,0.125,0.75,4,0\n"
                                                "2,-48,24,0.125,0.75,48,1\n"
                                                "3,-3,1.5,0.125,0.75,3,0\n"));
    view.selectChannels(0, KvKind::Value);
    QCOMPARE(view.channelsCsv(), QStringLiteral("channel,min,max,mean,std,absmax,outlier\n"
                                                "0,-0.5,0.25,0.125,0.75,0.5,0\n"
                                                "1,-0.25,0.125,0.125,0.75,0.25,0\n"
                                                "2,-0.75,0.375,0.125,0.75,0.75,0\n"
                                                "3,-1,0.5,0.125,0.75,1,0\n"));
}

void TestLayerStatsView::missingKindLeavesCsvFieldsEmpty()
{
    LayerStatsView view;
    view.setStats({makeTensor(3, KvKind::Key)});
    QCOMPARE(view.layersCsv().section(QLatin1Char('\n'), 1, 1), QStringLiteral("3,16,2,,,3.5,2.25,,,1,"));
    view.selectChannels(3, KvKind::Value);
    QCOMPARE(view.channelsCsv(), QStringLiteral("channel,min,max,mean,std,absmax,outlier\n"));
    QVERIFY(barPoints(view.channelPlot(), QStringLiteral("channels")).isEmpty());
}

void TestLayerStatsView::contextMenuCopiesCsv()
{
    LayerStatsView view;
    view.resize(900, 700);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.setStats(threeLayers());
    QApplication::clipboard()->clear();

    emit view.layerPlot()->customContextMenuRequested(QPoint(50, 50));
    QMenu* menu = nullptr;
    QTRY_VERIFY((menu = view.findChild<QMenu*>()) != nullptr && menu->isVisible());
    auto* copy = menu->findChild<QAction*>(QStringLiteral("copyCsv"));
    QVERIFY(copy);
    QVERIFY(copy->isEnabled());
    copy->trigger();
    menu->close();
    QCOMPARE(QApplication::clipboard()->text(), view.layersCsv());

    view.selectChannels(2, KvKind::Key);
    view.copyCsv(LayerStatsView::Plot::Channels);
    QCOMPARE(QApplication::clipboard()->text(), view.channelsCsv());
}

void TestLayerStatsView::savePlotWritesFile_data()
{
    QTest::addColumn<int>("plot");
    QTest::addColumn<QString>("fileName");
    QTest::addColumn<QByteArray>("magic");
    const int layers = int(LayerStatsView::Plot::Layers);
    const int channels = int(LayerStatsView::Plot::Channels);
    QTest::newRow("layers png") << layers << "layers.png" << QByteArray("\x89PNG\r\n\x1a\n", 8);
    QTest::newRow("layers pdf") << layers << "layers.pdf" << QByteArray("%PDF-");
    QTest::newRow("channels png") << channels << "channels.PNG" << QByteArray("\x89PNG\r\n\x1a\n", 8);
    QTest::newRow("channels jpg") << channels << "channels.jpg" << QByteArray("\xff\xd8\xff", 3);
}

void TestLayerStatsView::savePlotWritesFile()
{
    QFETCH(int, plot);
    QFETCH(QString, fileName);
    QFETCH(QByteArray, magic);

    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    LayerStatsView view;
    view.setStats(threeLayers());
    const QString path = dir.filePath(fileName);
    QVERIFY2(view.savePlot(LayerStatsView::Plot(plot), path), qPrintable(view.errorString()));
    QFile file(path);
    QVERIFY(file.open(QIODevice::ReadOnly));
    QVERIFY(file.size() > 1000);
    QCOMPARE(file.read(magic.size()), magic);
    if (!fileName.endsWith(QLatin1String("pdf"))) {
        const QImage image(path);
        QVERIFY(!image.isNull());
        QVERIFY(image.width() >= 800 && image.height() >= 450);
    }
}

void TestLayerStatsView::selectionSurvivesNewStats()
{
    LayerStatsView view;
    view.setStats(threeLayers());
    view.selectChannels(2, KvKind::Value);
    view.setStats(threeLayers());  // e.g. the same file reloaded with other options
    QCOMPARE(view.selectedLayer(), 2);
    QCOMPARE(view.selectedKind(), KvKind::Value);

    view.setStats({makeTensor(0, KvKind::Key)});  // layer 2 gone: fall back to the first layer
    QCOMPARE(view.selectedLayer(), 0);

    QVERIFY(!view.savePlot(LayerStatsView::Plot::Layers, QStringLiteral("plot.bmpx")));
    QVERIFY(view.errorString().contains(QLatin1String("bmpx")));
}

void TestLayerStatsView::logScaleOnlyForPositiveVariance()
{
    LayerStatsView view;
    view.setStats(threeLayers());
    QCOMPARE(view.layerPlot()->yAxis->scaleType(), QCPAxis::stLogarithmic);

    // A constant tensor has zero delta variance: a log axis cannot show it.
    std::vector<TensorStats> stats = threeLayers();
    stats[0].varianceDelta = 0;
    view.setStats(stats);
    QCOMPARE(view.layerPlot()->yAxis->scaleType(), QCPAxis::stLinear);
    QCOMPARE(view.layerPlot()->yAxis->range().lower, 0.0);

    view.setStats(threeLayers());
    view.setLayerMetric(LayerStatsView::LayerMetric::Entropy);
    QCOMPARE(view.layerPlot()->yAxis->scaleType(), QCPAxis::stLinear);
}

void TestLayerStatsView::clickOnLayerPlotPicksLayer()
{
    LayerStatsView view;
    view.resize(900, 700);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.setStats(threeLayers());
    QCustomPlot* plot = view.layerPlot();
    plot->replot();  // lays out the axis rect at the shown size

    const QPoint at(int(plot->xAxis->coordToPixel(2.0)), plot->axisRect()->center().y());
    QTest::mouseClick(plot, Qt::LeftButton, Qt::NoModifier, at);
    QCOMPARE(view.selectedLayer(), 2);
    QCOMPARE(barPoints(view.channelPlot(), QStringLiteral("outliers")).value(0), QPointF(2, 72));
}

void TestLayerStatsView::headDimMarksHeadBoundaries()
{
    // 2 heads of 2 dims: the separator between heads is drawn at channel 1.5.
    LayerStatsView view;
    view.setStats(threeLayers());
    view.setHeadDim(2);
    QCustomPlot* plot = view.channelPlot();
    QCOMPARE(plot->itemCount(), 1);
    auto* line = qobject_cast<QCPItemStraightLine*>(plot->item(0));
    QVERIFY(line);
    QCOMPARE(line->point1->coords().x(), 1.5);
    view.setHeadDim(0);
    QCOMPARE(plot->itemCount(), 0);
}

KVSCOPE_GUI_TEST_MAIN(TestLayerStatsView)
#include "tst_layer_stats_view.moc"
