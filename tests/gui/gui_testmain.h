// Test main for widget tests: a QApplication on the offscreen platform, settings isolated from the
// user's (QStandardPaths test mode), modal error boxes off unless a test turns them on.
// Use KVSCOPE_GUI_TEST_MAIN(TestClass) instead of QTEST_MAIN.
//
// With KVSCOPE_GUI_PROFILE=<ms> in the environment, every outermost event delivery on the GUI
// thread that takes at least <ms> of the thread's CPU time is printed (receiver class and name,
// event type, CPU and wall milliseconds): the way to find what keeps the event loop from turning.
#pragma once

#include <QApplication>
#include <QMetaEnum>
#include <QStandardPaths>
#include <QtTest/QtTest>

#include <time.h>

// The shared test data (models, tokenizers, traces): $KVSCOPE_SHARED_DIR, else ../shared next to
// the source tree (where the main checkout keeps it).
inline QString kvscopeSharedDir()
{
    const QString env = qEnvironmentVariable("KVSCOPE_SHARED_DIR");
    return env.isEmpty() ? QStringLiteral(KVSCOPE_SOURCE_DIR "/../shared") : env;
}

class KvscopeTestApplication : public QApplication {
public:
    KvscopeTestApplication(int& argc, char** argv)
        : QApplication(argc, argv), m_thresholdMs(qEnvironmentVariableIntValue("KVSCOPE_GUI_PROFILE"))
    {
    }

    bool notify(QObject* receiver, QEvent* event) override
    {
        if (m_thresholdMs <= 0) return QApplication::notify(receiver, event);
        // Read what is printed before delivery: the event may delete the receiver.
        const QByteArray what = QByteArray(receiver->metaObject()->className()) + " '" +
                                receiver->objectName().toUtf8() + "' " +
                                QMetaEnum::fromType<QEvent::Type>().valueToKey(event->type());
        const double cpu0 = cpuMs(), wall0 = wallMs();
        const int depth = m_depth++;
        const int mark = m_nested.size();
        const bool r = QApplication::notify(receiver, event);
        --m_depth;
        const double cpu = cpuMs() - cpu0, wall = wallMs() - wall0;
        if (depth > 0) {
            // Nested deliveries are kept for the outermost one's report (those over a fifth of it).
            if (cpu >= m_thresholdMs / 5.0)
                m_nested.insert(mark, QByteArray(depth * 2, ' ') + what + ": " + QByteArray::number(cpu, 'f', 1) + " ms CPU");
            return r;
        }
        if (cpu >= m_thresholdMs) {
            qInfo("profile: %s: %.1f ms CPU, %.1f ms wall", what.constData(), cpu, wall);
            for (const QByteArray& line : m_nested) qInfo("profile:   %s", line.constData());
        }
        m_nested.clear();
        return r;
    }

private:
    static double cpuMs()
    {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    }
    static double wallMs()
    {
        timespec ts{};
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    }
    int m_thresholdMs;
    int m_depth = 0;
    QList<QByteArray> m_nested;
};

#define KVSCOPE_GUI_TEST_MAIN(TestObject)                                   \
    int main(int argc, char** argv)                                         \
    {                                                                       \
        qputenv("QT_QPA_PLATFORM", "offscreen");                            \
        qputenv("KVSCOPE_NO_MODAL_ERRORS", "1");                            \
        QStandardPaths::setTestModeEnabled(true);                           \
        KvscopeTestApplication app(argc, argv);                             \
        QApplication::setOrganizationName(QStringLiteral("kvscope-tests")); \
        QApplication::setApplicationName(QStringLiteral(#TestObject));      \
        TestObject tc;                                                      \
        QTEST_SET_MAIN_SOURCE_PATH                                          \
        return QTest::qExec(&tc, argc, argv);                               \
    }
