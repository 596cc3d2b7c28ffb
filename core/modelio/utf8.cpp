#include "modelio/utf8.h"

namespace kvscope {

size_t utf8SeqLen(const std::string& s, size_t i)
{
    const auto b = [&](size_t k) { return uint8_t(s[k]); };
    const size_t n = s.size();
    const uint8_t c = b(i);
    if (c < 0x80) return 1;
    const auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (!cont(i + 1) || !cont(i + 2)) return 0;
        if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
        if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // surrogate
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
        if (c == 0xF0 && b(i + 1) < 0x90) return 0;   // overlong
        if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // > U+10FFFF
        return 4;
    }
    return 0;
}

size_t utf8FirstInvalid(const std::string& s)
{
    for (size_t i = 0; i < s.size();) {
        const size_t len = utf8SeqLen(s, i);
        if (!len) return i;
        i += len;
    }
    return std::string::npos;
}

uint32_t utf8DecodeAt(const std::string& s, size_t i, size_t len)
{
    const auto b = [&](size_t k) { return uint32_t(uint8_t(s[k])); };
    switch (len) {
    case 1: return b(i);
    case 2: return ((b(i) & 0x1F) << 6) | (b(i + 1) & 0x3F);
    case 3: return ((b(i) & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    default:
        return ((b(i) & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
               (b(i + 3) & 0x3F);
    }
}

void utf8Append(std::string& out, uint32_t cp)
{
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

std::string utf8Lossy(const std::string& s)
{
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const size_t len = utf8SeqLen(s, i);
        if (len) {
            out.append(s, i, len);
            i += len;
            continue;
        }
        // Skip the lead byte and the continuation bytes that still form a valid prefix.
        const uint8_t c = uint8_t(s[i]);
        size_t skip = 1;
        const size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
        while (skip < want && i + skip < s.size() && (uint8_t(s[i + skip]) & 0xC0) == 0x80) {
            const uint8_t n1 = uint8_t(s[i + 1]);
            if (skip == 1 && ((c == 0xE0 && n1 < 0xA0) || (c == 0xED && n1 >= 0xA0) ||
                              (c == 0xF0 && n1 < 0x90) || (c == 0xF4 && n1 >= 0x90) || c > 0xF4))
                break;
            ++skip;
        }
        out += "\xEF\xBF\xBD";
        i += skip;
    }
    return out;
}

}  // namespace kvscope
