#pragma once

// The chain JSON format of `ckpt plan --chain FILE.json` (docs/cli.md), and schedules as JSON.

#include <ckpt/plan/chain.h>
#include <ckpt/plan/schedule.h>

#include <nlohmann/json.hpp>

#include <string>

namespace ckpt {
namespace cli {

/// Reads a chain from `json`. `source` (a file name) prefixes every error message. Throws
/// std::invalid_argument naming the field when a field is missing, of the wrong type, negative,
/// or when the chain fails `plan::Chain::validate`. Unknown fields are ignored.
plan::Chain chain_from_json(const nlohmann::json& json, const std::string& source);

/// Parses JSON text and reads the chain from it (see `chain_from_json`). Throws
/// std::invalid_argument, prefixed with `source`, for text that is not JSON (a NUL byte anywhere
/// included), nests arrays and objects more than 32 deep, or repeats a key in one object (the
/// message names the key and where). A UTF-8 byte-order mark at the start is skipped.
plan::Chain chain_from_text(const std::string& text, const std::string& source);

/// Reads a chain file of at most 64 MiB and parses it (see `chain_from_text`); errors name the
/// file.
plan::Chain load_chain_file(const std::string& path);

/// The chain in the same format (alternatives written only when present, offloaded_bytes and
/// host_bandwidth only when not 0).
nlohmann::json chain_to_json(const plan::Chain& chain);

/// `[{"op": "forward_all", "stage": 0}, ...]`, with `"option"` on ops whose option is not 0.
nlohmann::json schedule_to_json(const plan::Schedule& schedule);

/// The same, with the option's `"name"` (where it has one) and `"offloaded_bytes"` (where it
/// offloads) on ops whose option is not 0; `schedule` must be a schedule of `chain`.
nlohmann::json schedule_to_json(const plan::Schedule& schedule, const plan::Chain& chain);

}  // namespace cli
}  // namespace ckpt
