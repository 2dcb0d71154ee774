// The chain JSON of `ckpt plan --chain` (tools/ckpt/chain_json.h) in a round trip: every field,
// the offloading ones included, comes back as written.

#include <gtest/gtest.h>

#include "chain_json.h"

namespace {

using namespace ckpt;

TEST(ChainJson, RoundTripKeepsOffloadedBytesAndTheBandwidth) {
  plan::Chain chain;
  chain.input_bytes = 10;
  chain.host_bandwidth = 2.5e9;
  chain.stages.push_back(plan::Stage{1.0, 2.0, 20, 30, 5, 7, {}});
  chain.stages[0].alternatives.push_back(plan::StorageOption{1.5, 2.5, 20, 3, 17, "offloaded", 10});
  chain.stages[0].alternatives.push_back(plan::StorageOption{3.0, 2.0, 20, 0, 7, "checkpointed"});
  const plan::Chain again = cli::chain_from_json(cli::chain_to_json(chain), "again");
  EXPECT_EQ(again.host_bandwidth, 2.5e9);
  ASSERT_EQ(again.stages.size(), 1u);
  ASSERT_EQ(again.stages[0].alternatives.size(), 2u);
  const plan::StorageOption& offload = again.stages[0].alternatives[0];
  EXPECT_EQ(offload.offloaded_bytes, 10);
  EXPECT_EQ(offload.name, "offloaded");
  EXPECT_EQ(offload.backward_tmp_bytes, 17);
  EXPECT_EQ(again.stages[0].alternatives[1].offloaded_bytes, 0);
  // Absent fields mean no offloading and free copies.
  plan::Chain plain = again;
  plain.host_bandwidth = 0;
  const nlohmann::json written = cli::chain_to_json(plain);
  EXPECT_FALSE(written.contains("host_bandwidth"));
  EXPECT_FALSE(written["stages"][0]["alternatives"][1].contains("offloaded_bytes"));
  EXPECT_EQ(cli::chain_from_json(written, "plain").host_bandwidth, 0.0);
}

TEST(ChainJson, RoundTripKeepsTheExecutorsState) {
  plan::Chain chain;
  chain.input_bytes = 10;
  chain.random_state_bytes = 5056;
  chain.stages.push_back(plan::Stage{1.0, 2.0, 20, 30, 5, 7, {}});
  chain.stages[0].gradient_bytes = 40;
  chain.stages[0].random_state_bytes = 5056;
  chain.stages[0].buffer_bytes = 264;
  chain.stages[0].kept_buffer_bytes = 256;
  const plan::Chain again = cli::chain_from_json(cli::chain_to_json(chain), "again");
  EXPECT_EQ(again.random_state_bytes, 5056);
  ASSERT_EQ(again.stages.size(), 1u);
  EXPECT_EQ(again.stages[0].gradient_bytes, 40);
  EXPECT_EQ(again.stages[0].random_state_bytes, 5056);
  EXPECT_EQ(again.stages[0].buffer_bytes, 264);
  EXPECT_EQ(again.stages[0].kept_buffer_bytes, 256);
  nlohmann::json written = cli::chain_to_json(chain);
  written["stages"][0]["kept_buffer_bytes"] = 265;
  EXPECT_THROW(cli::chain_from_json(written, "more written than there is"), std::exception);
}

}  // namespace
