#pragma once

// Comparing two profiles of one chain in every size of the planner's model.

#include <ckpt/plan/chain.h>

#include <gtest/gtest.h>

#include <string>

namespace ckpt {
namespace test {

// Every size of the planner's model, stage by stage and option by option.
inline void expect_same_sizes(const plan::Chain& reused, const plan::Chain& measured) {
  ASSERT_EQ(reused.size(), measured.size());
  EXPECT_EQ(reused.input_bytes, measured.input_bytes);
  for (size_t i = 0; i < reused.stages.size(); ++i) {
    SCOPED_TRACE("stage " + std::to_string(i));
    const plan::Stage& a = reused.stages[i];
    const plan::Stage& b = measured.stages[i];
    EXPECT_EQ(a.output_bytes, b.output_bytes);
    EXPECT_EQ(a.saved_bytes, b.saved_bytes);
    EXPECT_EQ(a.forward_tmp_bytes, b.forward_tmp_bytes);
    EXPECT_EQ(a.forward_all_tmp_bytes, b.forward_all_tmp_bytes);
    EXPECT_EQ(a.backward_tmp_bytes, b.backward_tmp_bytes);
    EXPECT_EQ(a.gradient_bytes, b.gradient_bytes);
    EXPECT_EQ(a.random_state_bytes, b.random_state_bytes);
    EXPECT_EQ(a.buffer_bytes, b.buffer_bytes);
    EXPECT_EQ(a.kept_buffer_bytes, b.kept_buffer_bytes);
    ASSERT_EQ(a.alternatives.size(), b.alternatives.size());
    for (size_t k = 0; k < a.alternatives.size(); ++k) {
      EXPECT_EQ(a.alternatives[k].name, b.alternatives[k].name);
      EXPECT_EQ(a.alternatives[k].saved_bytes, b.alternatives[k].saved_bytes);
      EXPECT_EQ(a.alternatives[k].forward_tmp_bytes, b.alternatives[k].forward_tmp_bytes);
      EXPECT_EQ(a.alternatives[k].backward_tmp_bytes, b.alternatives[k].backward_tmp_bytes);
    }
  }
}

}  // namespace test
}  // namespace ckpt
