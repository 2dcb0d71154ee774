// The storage-mode table (ckpt/storage_mode.h): the standard modes, adding and selecting modes,
// and the errors that name what went wrong.

#include <ckpt/storage_mode.h>

#include "support/support.h"

#include <optional>
#include <stdexcept>
#include <string>

namespace storage_mode_test {

std::optional<ckpt::CheckpointOptions> plain_region(const ckpt::StorageSettings&) {
  return ckpt::CheckpointOptions();
}

TEST(StorageModes, StandardHasCheckpointedTwoPassSelectiveAndOffloaded) {
  const auto modes = ckpt::StorageModes::standard();
  ASSERT_EQ(modes.all().size(), 4u);
  EXPECT_EQ(modes.names(), "checkpointed, two_pass, selective, offloaded");
  const auto two_pass = modes.at("two_pass", "test").region(ckpt::StorageSettings{});
  ASSERT_TRUE(two_pass.has_value());
  EXPECT_TRUE(two_pass->two_pass_recompute());
  // What the planners use unless told: all but "two_pass", which stops functions midway.
  EXPECT_EQ(ckpt::StorageModes::defaults().names(), "checkpointed, selective, offloaded");
  const auto offloaded = modes.at("offloaded", "test").region(ckpt::StorageSettings{});
  ASSERT_TRUE(offloaded.has_value());
  EXPECT_TRUE(offloaded->offload());
  ckpt::StorageSettings settings;
  EXPECT_TRUE(modes.at("checkpointed", "test").region(settings).has_value());
  // The selective mode is off without a policy, and on with one.
  EXPECT_FALSE(modes.at("selective", "test").region(settings).has_value());
  settings.selective_policy = ckpt::save_matmuls();
  const auto region = modes.at("selective", "test").region(settings);
  ASSERT_TRUE(region.has_value());
  EXPECT_TRUE(static_cast<bool>(region->policy()));
  EXPECT_EQ(ckpt::StorageModes().names(), "none");
}

TEST(StorageModes, AddRefusesBadEntries) {
  auto modes = ckpt::StorageModes::standard();
  CKPT_EXPECT_THROWS_WITH(modes.add({"selective", "again", plain_region}),
                          "a mode named 'selective' is already in the table");
  CKPT_EXPECT_THROWS_WITH(modes.add({"two words", "", plain_region}), "letters, digits and '_'");
  CKPT_EXPECT_THROWS_WITH(modes.add({"", "", plain_region}), "letters, digits and '_'");
  CKPT_EXPECT_THROWS_WITH(modes.add({"no_region", "", {}}), "mode 'no_region' has no `region`");
  // Nothing added by failures.
  EXPECT_EQ(modes.names(), "checkpointed, two_pass, selective, offloaded");
  modes.add({"compressed", "a new entry", plain_region});
  EXPECT_EQ(modes.names(), "checkpointed, two_pass, selective, offloaded, compressed");
}

TEST(StorageModes, RemoveAndLookUp) {
  auto modes =
      ckpt::StorageModes::standard().remove("selective").remove("offloaded").remove("two_pass");
  EXPECT_EQ(modes.names(), "checkpointed");
  EXPECT_EQ(modes.find("selective"), nullptr);
  CKPT_EXPECT_THROWS_WITH(modes.remove("selective"),
                          "no storage mode is named 'selective'; the table has: checkpointed.");
  CKPT_EXPECT_THROWS_WITH(modes.at("keep_all", "ckpt::Somewhere"),
                          "ckpt::Somewhere: no storage mode is named 'keep_all'");
}

TEST(StorageModes, SelectTakesNamesInTheirOrder) {
  const auto modes = ckpt::StorageModes::standard();
  EXPECT_EQ(modes.select("selective,checkpointed").names(), "selective, checkpointed");
  EXPECT_EQ(modes.select("checkpointed").names(), "checkpointed");
  EXPECT_TRUE(modes.select("none").all().empty());
  EXPECT_TRUE(modes.select("").all().empty());
  for (const char* bad : {"offload", "checkpointed,", "checkpointed,checkpointed", ",selective"}) {
    EXPECT_THROW(modes.select(bad), std::invalid_argument) << bad;
  }
  try {
    modes.select("checkpointed,offload");
    FAIL() << "selected an unknown mode";
  } catch (const std::invalid_argument& error) {
    EXPECT_STREQ(error.what(),
                 "unknown storage mode 'offload' in 'checkpointed,offload'; the modes are: "
                 "checkpointed, two_pass, selective, offloaded (or none)");
  }
}

}  // namespace storage_mode_test
