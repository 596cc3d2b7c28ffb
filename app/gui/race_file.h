// The stream race file: a RaceRecord (view_data.h) as JSON, what the Stream page's Save run and
// Open run keep: {"format": "kvscope-stream-run", "version": 1, "cache", "quality_source",
// "config" (link, mode, rates, policies, target hardware, store), "available" (the schedule's
// seconds and Mbit/s), "results" (one object per lane: TTFT and its parts, which parts were
// modelled, KL and ΔPPL or null, every chunk's level, bytes and times, the answers, the log)}.
// Written indented with sorted keys (QJsonDocument); the bytes are a contract
// (tests/gui/data/race_v1.json). The app owns the format; the Stream page only draws a race.
#pragma once

#include "view_data.h"

#include <QByteArray>
#include <QString>

namespace kvscope {

QByteArray raceToJson(const RaceRecord& race);
// @return false with *error "file: place: reason" (one line) for anything it cannot trust:
// not JSON, another format or version, a field of the wrong type or out of range, an unknown
// mode or TTFT part, more than 64 runs or 2^20 chunks a run. *race is untouched then.
bool raceFromJson(const QByteArray& json, const QString& file, RaceRecord* race, QString* error);

// Writes through a temporary (QSaveFile): a failed write leaves the file that was there.
// @return false with *error "path: reason".
bool saveRaceFile(const QString& path, const RaceRecord& race, QString* error);
// Reads a race file of at most 256 MiB. @return false with *error "path: ..." (see raceFromJson).
bool loadRaceFile(const QString& path, RaceRecord* race, QString* error);
// Whether a JSON file is a saved race (not a codec profile); false for anything unreadable.
bool isRaceFile(const QString& path);

}  // namespace kvscope
