// Shared test main: forces the offscreen platform so GUI tests run without a display.
// Use KVSCOPE_TEST_MAIN(TestClass) instead of QTEST_MAIN / QTEST_APPLESS_MAIN.
#pragma once

#include <QtTest/QtTest>
#include <cstdlib>

#define KVSCOPE_TEST_MAIN(TestObject)                                  \
    int main(int argc, char** argv)                                    \
    {                                                                  \
        qputenv("QT_QPA_PLATFORM", "offscreen");                       \
        QCoreApplication app(argc, argv);                              \
        TestObject tc;                                                 \
        QTEST_SET_MAIN_SOURCE_PATH                                     \
        return QTest::qExec(&tc, argc, argv);                          \
    }
