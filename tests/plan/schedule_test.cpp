// Tests of ckpt/plan/schedule.h: op names, short notation, forward counts.

#include "ckpt/plan/schedule.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace ckpt {
namespace plan {
namespace {

TEST(ScheduleTest, OpKindNamesAreTheJsonSpelling) {
  EXPECT_STREQ(to_string(OpKind::ForwardNone), "forward_none");
  EXPECT_STREQ(to_string(OpKind::ForwardInput), "forward_input");
  EXPECT_STREQ(to_string(OpKind::ForwardAll), "forward_all");
  EXPECT_STREQ(to_string(OpKind::Backward), "backward");
  EXPECT_STREQ(to_string(OpKind::Loss), "loss");
}

TEST(ScheduleTest, ParseOpKindRoundTrips) {
  for (OpKind kind : {OpKind::ForwardNone, OpKind::ForwardInput, OpKind::ForwardAll,
                      OpKind::Backward, OpKind::Loss}) {
    EXPECT_EQ(parse_op_kind(to_string(kind)), kind);
  }
}

TEST(ScheduleTest, ParseOpKindRejectsUnknownNames) {
  try {
    parse_op_kind("Forward_All");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("ckpt::plan::parse_op_kind"), std::string::npos);
    EXPECT_NE(message.find("but got \"Forward_All\""), std::string::npos);
  }
}

TEST(ScheduleTest, ShortNotation) {
  Schedule schedule;
  schedule.ops = {
      {OpKind::ForwardInput, 0, 0}, {OpKind::ForwardNone, 1, 0}, {OpKind::ForwardAll, 2, 0},
      {OpKind::Loss, 3, 0},         {OpKind::Backward, 2, 0},    {OpKind::ForwardAll, 0, 1},
      {OpKind::ForwardAll, 1, 0},   {OpKind::Backward, 1, 0},    {OpKind::Backward, 0, 1}};
  EXPECT_EQ(to_string(schedule), "Fck0 Fn1 Fall2 L B2 Fall0.1 Fall1 B1 B0.1");
  EXPECT_EQ(to_string(Schedule{}), "");
}

TEST(ScheduleTest, ForwardCountCountsTheThreeForwardKinds) {
  Schedule schedule;
  schedule.ops = {{OpKind::ForwardInput, 0, 0},
                  {OpKind::ForwardNone, 1, 0},
                  {OpKind::ForwardAll, 2, 0},
                  {OpKind::Loss, 3, 0},
                  {OpKind::Backward, 2, 0}};
  EXPECT_EQ(forward_count(schedule), 3);
  EXPECT_EQ(forward_count(Schedule{}), 0);
}

TEST(ScheduleTest, EqualityComparesKindStageAndOption) {
  const Op a{OpKind::ForwardAll, 2, 0};
  EXPECT_EQ(a, (Op{OpKind::ForwardAll, 2, 0}));
  EXPECT_NE(a, (Op{OpKind::ForwardAll, 2, 1}));
  EXPECT_NE(a, (Op{OpKind::ForwardNone, 2, 0}));
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
