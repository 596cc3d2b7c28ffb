// The Stream page's rig (stream_session.h tells the story): the chunk store, the servers and the
// prepared Streamers a race runs on, with the quality reference the runs are scored against. A
// rig is rebuilt only when its recipe changes (cache, model, store, RTT, mode, question,
// continuation, profile); a race that changes only the link schedule or the policies reuses it.
// Touched only on the stream lane's worker thread.
#pragma once

#include "view_data.h"

#include "codec/chunk_codec.h"
#include "codec/profile.h"
#include "kv/kv_set.h"
#include "transport/server.h"

#include <QString>

#include <memory>
#include <string>
#include <vector>

class QTemporaryDir;

namespace kvscope {

class JobControl;
class LinkSchedule;
class Model;
class QualityReference;
class Streamer;

struct StreamRig {
    // What a rig is built from.
    struct Recipe {
        std::shared_ptr<const Model> model;
        std::shared_ptr<const KvSet> kv;
        std::string store;  // the user's .kvc files or Redis URL; "": encode the cache now
        double rttMs = 0;
        StreamConfig::Mode mode = StreamConfig::BackToBack;
        std::string question, continuation;
        CodecProfile profile;
        std::shared_ptr<const CodecProfile> transform;  // stream its transform ladder instead
        // Equal keys: the same rig serves.
        std::string key() const;
    };

    StreamRig();
    ~StreamRig();

    // Rebuilds the rig unless it was built for this recipe and its servers are alive; then adds
    // the servers and streamers `lanes` lanes need in the recipe's mode. Phases go to control;
    // throws kvscope::Error "stream: cancelled" once control is stopped.
    void prepare(const Recipe& recipe, const LinkSchedule& schedule, int lanes, JobControl& control);

    std::string key;  // what the rig was built for
    std::shared_ptr<const Model> model;
    std::shared_ptr<const KvSet> kv;
    std::unique_ptr<QTemporaryDir> dir;
    std::string store;  // what the servers serve
    ServerOptions serverOptions;
    // Back to back and shared link: one server; at once: one per lane.
    std::vector<std::unique_ptr<ChunkServer>> servers;
    // Back to back: one streamer; otherwise one per lane, streamers[i] on servers[i] (at once) or
    // on servers[0] (shared link).
    std::vector<std::unique_ptr<Streamer>> streamers;
    std::vector<int32_t> question;
    std::unique_ptr<QualityReference> quality;  // built once per rig, after the first prepare
    std::string qualitySource;
    int levels = 0;
    CodecId codec = CodecId::CacheGen;  // the level-coded encoding the streamers fetch
    std::vector<double> levelKl;        // its levels' measured KL for the planner (NaN: none)

private:
    bool alive() const;
    ChunkServer& addServer(const LinkSchedule& schedule);
    Streamer& addStreamer(ChunkServer& server);
    void rebuild(const Recipe& recipe, const LinkSchedule& schedule, JobControl& control);
    void encodeStore(const Recipe& recipe, bool useTransform, JobControl& control);
    void buildQuality(const Recipe& recipe);
};

}  // namespace kvscope
