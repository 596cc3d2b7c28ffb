// Test main for widget tests: a QApplication on the offscreen platform, settings isolated from the
// user's (QStandardPaths test mode), modal error boxes off unless a test turns them on.
// Use KVSCOPE_GUI_TEST_MAIN(TestClass) instead of QTEST_MAIN.
#pragma once

#include <QApplication>
#include <QStandardPaths>
#include <QtTest/QtTest>

// The shared test data (models, tokenizers, traces): $KVSCOPE_SHARED_DIR, else ../shared next to
// the source tree (where the main checkout keeps it).
inline QString kvscopeSharedDir()
{
    const QString env = qEnvironmentVariable("KVSCOPE_SHARED_DIR");
    return env.isEmpty() ? QStringLiteral(KVSCOPE_SOURCE_DIR "/../shared") : env;
}

#define KVSCOPE_GUI_TEST_MAIN(TestObject)                                   \
    int main(int argc, char** argv)                                         \
    {                                                                       \
        qputenv("QT_QPA_PLATFORM", "offscreen");                            \
        qputenv("KVSCOPE_NO_MODAL_ERRORS", "1");                            \
        QStandardPaths::setTestModeEnabled(true);                           \
        QApplication app(argc, argv);                                       \
        QApplication::setOrganizationName(QStringLiteral("kvscope-tests")); \
        QApplication::setApplicationName(QStringLiteral(#TestObject));      \
        TestObject tc;                                                      \
        QTEST_SET_MAIN_SOURCE_PATH                                          \
        return QTest::qExec(&tc, argc, argv);                               \
    }
