// File stores (.kvc containers) and the URL dispatch; Redis lives in redis_store.cpp.
#include "transport/store.h"

#include "transport/protocol.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <utility>

namespace kvscope {

std::unique_ptr<ChunkStore> openRedisStore(const std::string& url);  // redis_store.cpp

std::string kvcContextKey(const KvcReader& kvc) { return contextKey(kvc.modelFingerprint(), kvc.tokens()); }

bool isRedisUrl(const std::string& url) { return url.rfind("redis://", 0) == 0; }

namespace {

class FileStore : public ChunkStore {
public:
    void add(const std::string& path)
    {
        std::unique_ptr<KvcReader> r = KvcReader::openFile(path);
        const std::pair<std::string, CodecId> key(kvcContextKey(*r), r->params().codec);
        if (m_files.count(key))
            throw inputError(path, "", "holds the same context and codec as " + m_files[key]->name());
        m_files[key] = std::move(r);
    }
    std::string describe() const override
    {
        std::string s;
        for (const auto& f : m_files) s += (s.empty() ? "" : ", ") + f.second->name();
        return s;
    }
    std::vector<uint8_t> skeleton(const std::string& context, CodecId codec) override
    {
        return find(context, codec).skeleton();
    }
    std::vector<uint8_t> chunk(const std::string& context, CodecId codec, int chunk, int level) override
    {
        const KvcReader& r = find(context, codec);
        if (chunk < 0 || chunk >= r.params().numChunks() || level < 1 || level > r.params().numLevels())
            throw StoreMiss("no chunk " + std::to_string(chunk) + " at level " + std::to_string(level) + " (the file has " +
                            std::to_string(r.params().numChunks()) + " chunks, " +
                            std::to_string(r.params().numLevels()) + " levels)");
        return r.readChunk(chunk, level);
    }
    std::vector<std::string> contents() override
    {
        std::vector<std::string> out;
        for (const auto& f : m_files) out.push_back(f.first.first + ":" + codecName(f.first.second));
        return out;
    }

private:
    const KvcReader& find(const std::string& context, CodecId codec) const
    {
        auto it = m_files.find({context, codec});
        if (it == m_files.end())
            throw StoreMiss("no context " + context + " with codec " + codecName(codec) + " in this store");
        return *it->second;
    }
    // KvcReader reads with pread: safe from several connection threads at once.
    std::map<std::pair<std::string, CodecId>, std::unique_ptr<KvcReader>> m_files;
};

bool isDirectory(const std::string& p)
{
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::unique_ptr<ChunkStore> openStore(const std::string& url)
{
    if (isRedisUrl(url)) return openRedisStore(url);
    auto store = std::make_unique<FileStore>();
    size_t pos = 0;
    while (pos <= url.size()) {
        const size_t comma = url.find(',', pos);
        const std::string item = url.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (item.empty()) throw inputError("--store", "", "empty entry in '" + url + "'");
        if (isDirectory(item)) {
            std::vector<std::string> files;
            if (DIR* d = ::opendir(item.c_str())) {
                while (dirent* e = ::readdir(d)) {
                    const std::string n = e->d_name;
                    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".kvc") == 0) files.push_back(item + "/" + n);
                }
                ::closedir(d);
            }
            if (files.empty()) throw inputError(item, "", "the folder holds no .kvc file");
            std::sort(files.begin(), files.end());
            for (const std::string& f : files) store->add(f);
        } else {
            store->add(item);
        }
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return store;
}

}  // namespace kvscope
