// The sample contexts shipped in samples/contexts (see samples/README.md for the manifest):
// texts written for this project, each with a question whose answer is in the text and/or a
// held-out continuation for perplexity.
#pragma once

#include <string>
#include <vector>

namespace kvscope {

struct SampleContext {
    std::string id;            // manifest id, or the file name for a plain file
    std::string path;          // the context file
    std::string text;
    std::string continuation;  // "" when none
    std::string question;      // "" when none
    std::string answer;        // expected answer (a short string found in the text), "" when none
    std::vector<std::string> answerAliases;
};

// $KVSCOPE_SAMPLES when set, else the source tree's samples/ when present, else the installed
// copy. Throws kvscope::Error when none exists.
std::string samplesDir();
// Ids listed in the manifest, in its order.
std::vector<std::string> sampleIds();
// A manifest id ("long_1k", "story"), or a path to a UTF-8 text file; for a file X.txt, the
// optional X.continuation.txt and X.json (question sidecar) next to it are read too.
SampleContext loadSampleContext(const std::string& idOrPath);
// True when `response` contains the answer or one of its aliases, ignoring ASCII case.
bool answerMatches(const SampleContext& s, const std::string& response);

}  // namespace kvscope
