#include "ckpt/plan/schedule.h"

#include <stdexcept>

namespace ckpt {
namespace plan {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::ForwardNone:
      return "forward_none";
    case OpKind::ForwardInput:
      return "forward_input";
    case OpKind::ForwardAll:
      return "forward_all";
    case OpKind::Backward:
      return "backward";
    case OpKind::Loss:
      return "loss";
  }
  return "unknown";
}

OpKind parse_op_kind(const std::string& name) {
  for (OpKind kind : {OpKind::ForwardNone, OpKind::ForwardInput, OpKind::ForwardAll,
                      OpKind::Backward, OpKind::Loss}) {
    if (name == to_string(kind)) return kind;
  }
  throw std::invalid_argument(
      "ckpt::plan::parse_op_kind: expected one of \"forward_none\", \"forward_input\", "
      "\"forward_all\", \"backward\", \"loss\", but got \"" +
      name + "\". Fix the op name in the schedule.");
}

std::string to_string(const Op& op) {
  std::string text;
  switch (op.kind) {
    case OpKind::ForwardNone:
      text = "Fn";
      break;
    case OpKind::ForwardInput:
      text = "Fck";
      break;
    case OpKind::ForwardAll:
      text = "Fall";
      break;
    case OpKind::Backward:
      text = "B";
      break;
    case OpKind::Loss:
      return "L";
  }
  text += std::to_string(op.stage);
  if (op.option != 0) text += "." + std::to_string(op.option);
  return text;
}

std::string to_string(const Schedule& schedule) {
  std::string text;
  for (const Op& op : schedule.ops) {
    if (!text.empty()) text += ' ';
    text += to_string(op);
  }
  if (!schedule.look_ahead.empty()) text += " ahead:";
  for (const int stage : schedule.look_ahead) text += ' ' + std::to_string(stage);
  return text;
}

int forward_count(const Schedule& schedule) {
  int count = 0;
  for (const Op& op : schedule.ops) {
    if (op.kind == OpKind::ForwardNone || op.kind == OpKind::ForwardInput ||
        op.kind == OpKind::ForwardAll) {
      ++count;
    }
  }
  return count;
}

}  // namespace plan
}  // namespace ckpt
