// Shared test main: forces the offscreen platform so GUI tests run without a display.
// Use KVSCOPE_TEST_MAIN(TestClass) instead of QTEST_MAIN / QTEST_APPLESS_MAIN.
#pragma once

#include "common/error.h"

#include <QtTest/QtTest>
#include <cstdlib>
#include <string>

namespace kvscope_test {

// f() must throw kvscope::Error whose message starts with "path: " and contains `needle`
// (the one-line "file: place: reason" form every reader promises).
template <class F>
void expectError(const std::string& path, F&& f, const std::string& needle)
{
    try {
        f();
    } catch (const kvscope::Error& e) {
        const std::string msg = e.what();
        QVERIFY2(msg.rfind(path + ": ", 0) == 0, msg.c_str());
        QVERIFY2(msg.find(needle) != std::string::npos, (msg + "  [wanted: " + needle + "]").c_str());
        return;
    }
    QFAIL(("no kvscope::Error for " + path).c_str());
}

// tok.encode(text, false) must refuse invalid UTF-8 (a stray byte, an overlong form, a surrogate,
// a truncated sequence) with a kvscope::Error that says so. Any tokenizer class with encode().
template <class Tok>
void expectUtf8Refused(const Tok& tok)
{
    for (const char* bad : {"ab\xff", "\xc0\xaf", "\xed\xa0\x80", "x\xe2\x82"}) {
        try {
            tok.encode(bad, false);
            QFAIL("invalid UTF-8 accepted");
        } catch (const kvscope::Error& e) {
            QVERIFY2(std::string(e.what()).find("not valid UTF-8") != std::string::npos, e.what());
        }
    }
}

}  // namespace kvscope_test

#define KVSCOPE_TEST_MAIN(TestObject)                                  \
    int main(int argc, char** argv)                                    \
    {                                                                  \
        qputenv("QT_QPA_PLATFORM", "offscreen");                       \
        QCoreApplication app(argc, argv);                              \
        TestObject tc;                                                 \
        QTEST_SET_MAIN_SOURCE_PATH                                     \
        return QTest::qExec(&tc, argc, argv);                          \
    }
