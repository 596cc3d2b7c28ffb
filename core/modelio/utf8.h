// UTF-8 helpers shared by the tokenizers: validation (tokenizers refuse invalid input rather than
// guess), code point decoding/encoding, and the lossy conversion decoders apply to raw bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvscope {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not valid (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t utf8SeqLen(const std::string& s, size_t i);

// Offset of the first byte that does not start a valid sequence, or std::string::npos.
size_t utf8FirstInvalid(const std::string& s);

// Decodes the code point of `len` bytes at s[i]; the sequence must already be known valid.
uint32_t utf8DecodeAt(const std::string& s, size_t i, size_t len);

void utf8Append(std::string& out, uint32_t cp);

// Invalid sequences become U+FFFD, one per maximal invalid prefix (Rust's from_utf8_lossy rule,
// which Hugging Face decoders use).
std::string utf8Lossy(const std::string& s);

}  // namespace kvscope
